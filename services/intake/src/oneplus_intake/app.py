"""intake: validates every submission, turns it into the one JobSpec, accepts or rejects it.

Submissions arrive as NATS requests on `oneplus.jobs.submit` (a JobSpec, or a CloudEvent in structured
or binary mode), as `POST /v1/jobs` over HTTP, and as MLflow webhook deliveries (`POST /webhooks/mlflow`);
all three go through `Intake` (submissions.py). The ops endpoints show, list and cancel jobs of the
caller's team only (tenancy.py says where the team comes from).
"""

from __future__ import annotations

import logging
from typing import Any

from faststream.nats import NatsMessage
from oneplus_bus.archive import JobArchive
from oneplus_bus.service import OneplusService, OpsError
from oneplus_bus.tenancy import Caller, TenancyError, caller_of
from oneplus_contracts import JobCancelRequested, JobRecord, subjects

from . import joblist
from .deliveries import NatsDeliveryLedger
from .settings import IntakeSettings
from .submissions import Intake, job_id_for
from .web import HttpServer, IntakeHttp
from .webhooks import MlflowWebhook, load_templates

__all__ = ["app", "broker", "intake", "job_id_for", "main", "svc"]

log = logging.getLogger("oneplus.intake")

svc = OneplusService("intake", "Accepts jobs from the CLI, CI/CD CloudEvents, HTTP and MLflow webhooks")
broker = svc.broker
app = svc.app
intake = Intake(svc)
_state: dict[str, Any] = {"settings": IntakeSettings()}


def _caller(headers: dict[str, str], claimed: Any = None) -> Caller:
    settings: IntakeSettings = _state["settings"]
    return caller_of(headers, claimed, platform_accounts=settings.platform_accounts)


@broker.subscriber(subjects.SUBMIT, queue="intake", title="job submissions (request/reply)")
async def on_submit(msg: NatsMessage) -> dict[str, Any]:
    headers = dict(msg.headers or {})
    try:
        caller = _caller(headers)
    except TenancyError as exc:
        outcome = await intake.reject(job_id_for(f"refused/{msg.correlation_id}"), str(exc), "nats", None, exc.code)
    else:
        outcome = await intake.submit(headers, msg.body, caller)
    return outcome.reply.model_dump(mode="json")


@svc.on_start
async def start_http() -> None:
    settings = IntakeSettings.from_env()
    _state["settings"] = settings
    if settings.http_port is None:
        log.info("HTTP intake disabled (ONEPLUS_HTTP_PORT=off)")
        return
    webhook = None
    if settings.mlflow_secret:
        webhook = MlflowWebhook(
            secret=settings.mlflow_secret,
            templates=load_templates(settings.mlflow_templates),
            ledger=NatsDeliveryLedger(svc.kv[subjects.WEBHOOK_DELIVERIES_KV]),
            intake=intake,
            replay_window_s=settings.replay_window_s,
        )
        log.info("MLflow webhooks on, %d job template(s)", len(webhook.templates.templates))
    server = HttpServer(IntakeHttp(intake, webhook, svc.tracer).app(), settings.http_host, settings.http_port)
    try:
        await server.start()
    except OSError as exc:
        if settings.http_port_explicit:
            raise
        # The default port may be taken on a developer's machine; NATS intake works without HTTP.
        log.warning("HTTP intake not started: %s:%d: %s", settings.http_host, settings.http_port, exc.strerror)
        return
    _state["http"] = server


@svc.on_stop
async def stop_http() -> None:
    server = _state.pop("http", None)
    if server is not None:
        await server.stop()


async def _visible_job(payload: dict[str, Any], headers: dict[str, str]) -> tuple[JobRecord, Caller]:
    caller = _tenant(headers, payload)
    job_id = str(payload.get("job_id") or "")
    rec, _ = await svc.ledger.get(job_id)
    if rec is None or not caller.sees(rec.spec.team):
        raise OpsError(f"no job {job_id!r}", 404)  # another team's job does not exist, as far as this caller knows
    return rec, caller


def _tenant(headers: dict[str, str], payload: dict[str, Any]) -> Caller:
    try:
        return _caller(headers, payload.get("team"))
    except TenancyError as exc:
        raise OpsError(str(exc), exc.code) from exc


@svc.ops("job-show", subjects.OPS_JOB_SHOW)
async def job_show(payload: dict[str, Any], headers: dict[str, str]) -> JobRecord:
    """A job from the hot view, else from the archive."""
    return await joblist.job_show(svc.ledger, JobArchive(svc.js), payload, _tenant(headers, payload))


@svc.ops("job-list", f"{subjects.PREFIX}.ops.job.list")
async def job_list(payload: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
    """One page of jobs: `limit`, `cursor`, `state`, `since`, `user` (joblist.py); `{"jobs": [...], "next": ...}`."""
    return await joblist.job_list(svc.ledger, JobArchive(svc.js), payload, _tenant(headers, payload))


@svc.ops("job-cancel", subjects.OPS_JOB_CANCEL)
async def job_cancel(payload: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
    rec, caller = await _visible_job(payload, headers)
    if rec.terminal:
        raise OpsError(f"job {rec.job_id} already {rec.state}", 409)
    by = caller.user if caller.bound and caller.user else str(payload.get("by") or "unknown")
    await svc.ledger.record(JobCancelRequested(job_id=rec.job_id, reason=f"cancelled by {by}", by=by))
    return {"job_id": rec.job_id, "state": rec.state, "cancel_requested": True}


def main() -> None:
    svc.run()
