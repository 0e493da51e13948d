"""intake: validates every submission, turns it into the one JobSpec, accepts or rejects it.

Submissions arrive as NATS requests on `oneplus.jobs.submit` (a JobSpec, or a CloudEvent in structured
or binary mode). The CloudEvent id (or `Nats-Msg-Id`) names the job, so a retried publish is not a
second job. Bad input gets a `job.rejected` event and an error reply; nothing already accepted is touched.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

from faststream.nats import NatsMessage
from oneplus_bus.clusterview import live_queue_config
from oneplus_bus.ledger import latest_values
from oneplus_bus.service import OneplusService, OpsError
from oneplus_bus.telemetry import traceparent_of_current
from oneplus_contracts import (
    IllegalTransition,
    JobAccepted,
    JobCancelRequested,
    JobRecord,
    JobRejected,
    NodeRecord,
    SubmitReply,
    new_id,
    subjects,
)
from oneplus_jobformats.cloudevents import decode_submission
from oneplus_jobformats.errors import JobFormatError
from oneplus_queueing.config import QueueConfig, QueueConfigError
from pydantic import ValidationError

from .admission import Inadmissible, admit

log = logging.getLogger("oneplus.intake")

svc = OneplusService("intake", "Accepts jobs from the CLI, CI/CD CloudEvents and other formats")
broker = svc.broker
app = svc.app


def job_id_for(msg_id: str) -> str:
    """The same submission id always names the same job: retries dedupe beyond the stream's window too."""
    return "j-" + hashlib.sha256(msg_id.encode()).hexdigest()[:12]


async def queue_config() -> QueueConfig:
    return await live_queue_config(svc.kv[subjects.QUEUES_KV])


async def nodes() -> list[NodeRecord]:
    return [NodeRecord.model_validate_json(v) for v in await latest_values(svc.kv[subjects.TOPOLOGY_KV])]


async def reject(job_id: str, reason: str, source: str, team: str | None = None) -> SubmitReply:
    log.info("rejected %s: %s", job_id, reason)
    await svc.ledger.publish(
        JobRejected(event_id=f"rejected-{job_id}", job_id=job_id, reason=reason, source=source, team=team)
    )
    return SubmitReply(ok=False, job_id=job_id, error=reason)


@broker.subscriber(subjects.SUBMIT, queue="intake", title="job submissions (request/reply)")
async def on_submit(msg: NatsMessage) -> dict[str, Any]:
    reply = await submit(dict(msg.headers or {}), msg.body)
    return reply.model_dump(mode="json")


async def submit(headers: dict[str, str], body: bytes) -> SubmitReply:
    source = headers.get("Oneplus-Source", "nats")
    try:
        sub = decode_submission(headers, body)
    except JobFormatError as exc:
        return await reject(new_id("j-"), str(exc), source)
    msg_id = sub.event_id or headers.get("Nats-Msg-Id") or new_id("sub-")
    job_id = job_id_for(msg_id)
    spec = sub.spec
    source = sub.source or source
    try:
        admit(spec, await queue_config(), await nodes())
    except (Inadmissible, QueueConfigError, ValidationError) as exc:
        return await reject(job_id, str(exc), source, spec.team)
    rec, _ = await svc.ledger.get(job_id)
    if rec is not None:
        return SubmitReply(ok=True, job_id=job_id, duplicate=True, warnings=rec.warnings)
    event = JobAccepted(event_id=f"accepted-{job_id}", job_id=job_id, spec=spec, source=source, warnings=sub.warnings)
    try:
        await svc.ledger.record(event, traceparent=traceparent_of_current())
    except IllegalTransition:
        return SubmitReply(ok=True, job_id=job_id, duplicate=True, warnings=sub.warnings)
    return SubmitReply(ok=True, job_id=job_id, warnings=sub.warnings)


def _visible(rec: JobRecord, team: str | None) -> bool:
    return team is None or rec.spec.team == team


@svc.ops("job-show", subjects.OPS_JOB_SHOW)
async def job_show(payload: dict[str, Any], headers: dict[str, str]) -> JobRecord:
    job_id = str(payload.get("job_id") or "")
    rec, _ = await svc.ledger.get(job_id)
    if rec is None or not _visible(rec, payload.get("team")):
        raise OpsError(f"no job {job_id!r}", 404)
    return rec


@svc.ops("job-list", f"{subjects.PREFIX}.ops.job.list")
async def job_list(payload: dict[str, Any], headers: dict[str, str]) -> list[dict[str, Any]]:
    team = payload.get("team")
    return [r.model_dump(mode="json") for r in await svc.ledger.all() if _visible(r, team)]


@svc.ops("job-cancel", subjects.OPS_JOB_CANCEL)
async def job_cancel(payload: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
    job_id = str(payload.get("job_id") or "")
    rec, _ = await svc.ledger.get(job_id)
    if rec is None or not _visible(rec, payload.get("team")):
        raise OpsError(f"no job {job_id!r}", 404)
    if rec.terminal:
        raise OpsError(f"job {job_id} already {rec.state}", 409)
    by = str(payload.get("by") or "unknown")
    await svc.ledger.record(JobCancelRequested(job_id=job_id, reason=f"cancelled by {by}", by=by))
    return {"job_id": job_id, "state": rec.state, "cancel_requested": True}


def main() -> None:
    svc.run()
