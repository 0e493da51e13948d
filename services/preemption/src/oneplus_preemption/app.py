"""preemption: chooses victims for a high-priority gang that cannot be placed, and runs the handshake.

The victim set is the cheapest (work since last checkpoint) whose eviction frees a domain the preemptor
can really be placed in — decided by the queueing library on the same live view as the solver. Each
victim gets `job.preempting` and a preempt command carrying its checkpoint signal and grace period;
the solver requeues it once its nodes have stopped.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from faststream.nats import NatsMessage
from oneplus_bus.clusterview import SnapshotSource, live_queue_config
from oneplus_bus.service import OneplusService
from oneplus_bus.telemetry import inject, job_span
from oneplus_contracts import (
    ACTIVE_STATES,
    IllegalTransition,
    JobPreempting,
    JobRecord,
    PreemptionRequest,
    PreemptRanks,
    subjects,
)
from oneplus_placement.snapshot import AllocationConflict, ClusterState
from oneplus_queueing.model import PendingJob, RunningJob
from oneplus_queueing.victims import choose_victims
from oneplus_reservations import ReservationStore

log = logging.getLogger("oneplus.preemption")

svc = OneplusService("preemption", "Chooses victims by least lost work and runs the checkpoint handshake")
broker = svc.broker
app = svc.app
_state: dict[str, Any] = {}


@svc.on_start
async def _connect() -> None:
    store = ReservationStore.from_url(svc.settings.redis_url, svc.settings.cluster)
    _state["store"] = store
    _state["source"] = SnapshotSource(svc.js, store)


@svc.on_stop
async def _disconnect() -> None:
    if "store" in _state:
        await _state["store"].close()


@svc.durable_subscriber(
    subjects.PREEMPTION_REQUEST, stream=subjects.COMMANDS_STREAM, consumer="preemption", title="preemption requests"
)
async def on_request(msg: NatsMessage) -> None:
    req = PreemptionRequest.model_validate_json(msg.body)
    await handle(req)


async def handle(req: PreemptionRequest) -> list[str]:
    rec, _ = await svc.ledger.get(req.job_id)
    if rec is None or rec.state != "ACCEPTED":
        return []
    with job_span(svc.tracer, "preemption choose-victims", rec.traceparent, {"oneplus.job_id": rec.job_id}) as span:
        jobs = {j.job_id: j for j in await svc.ledger.all()}
        view = await _state["source"].snapshot()
        victims = list(req.victims)
        if victims:
            # The scheduling cycle chose them on an earlier view: evict only if that choice still holds.
            if not still_valid(victims, req, jobs, view.state):
                span.set_attribute("oneplus.victims", 0)
                return []
        else:
            already = {j.job_id for j in jobs.values() if j.state in ("PREEMPTING", "CHECKPOINTED")}
            running = [RunningJob.from_record(j) for j in jobs.values() if j.state in ACTIVE_STATES and j.allocation]
            config = await live_queue_config(svc.kv[subjects.QUEUES_KV])
            choice = choose_victims(
                time.time(), view.state, PendingJob.from_record(rec), running, config, exclude=already
            )
            if choice is None:
                span.set_attribute("oneplus.victims", 0)
                return []
            victims = list(choice.victims)
        span.set_attribute("oneplus.victims", len(victims))
        reason = f"preempted for {rec.job_id} (priority {rec.spec.priority})"
        for victim_id in victims:
            await preempt(jobs[victim_id], rec.job_id, reason)
        log.info("%s: preempting %s (lost work %.0f GPU·s)", rec.job_id, victims, req.lost_work_gpu_s)
        return victims


def still_valid(victims: list[str], req: PreemptionRequest, jobs: dict[str, JobRecord], state: ClusterState) -> bool:
    """Every victim still holds its GPUs and is not already stepping aside, and their GPUs make the nomination fit."""
    trial = state.snapshot().thaw()
    for v in victims:
        j = jobs.get(v)
        if j is None or j.state not in ("PLACED", "STARTING", "RUNNING") or j.allocation is None:
            return False
        try:
            trial.release(j.allocation)
        except AllocationConflict:
            return False
    if req.nominated is None:
        return True
    try:
        trial.apply(req.nominated)
    except AllocationConflict:
        return False
    return True


async def preempt(victim: JobRecord, preemptor: str, reason: str) -> None:
    if victim.token is None or victim.allocation is None:
        return
    try:
        await svc.ledger.record(
            JobPreempting(
                event_id=f"preempting-{victim.job_id}-{victim.token}",
                job_id=victim.job_id,
                token=victim.token,
                preemptor=preemptor,
                reason=reason,
            )
        )
    except IllegalTransition as exc:
        log.info("victim %s no longer preemptible: %s", victim.job_id, exc)
        return
    for node in victim.allocation.nodes:
        cmd = PreemptRanks(
            command_id=f"preempt-{victim.job_id}-{victim.token}-{node}",
            job_id=victim.job_id,
            node=node,
            token=victim.token,
            signal=victim.spec.checkpoint.signal,
            grace_s=float(victim.spec.checkpoint.grace_s),
            reason=reason,
        )
        # The victim's own trace, not the preemptor's: one job, one trace.
        headers = {"Nats-Msg-Id": cmd.command_id}
        if victim.traceparent:
            headers["traceparent"] = victim.traceparent
        else:
            inject(headers)
        await svc.js.publish(
            subjects.node_command(node, "preempt"),
            cmd.model_dump_json().encode(),
            headers=headers,
            stream=subjects.COMMANDS_STREAM,
        )


def main() -> None:
    svc.run()
