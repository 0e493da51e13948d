"""placement-solver: owns the queue order and every placement decision.

Consumes job events, places pending gangs on a snapshot of the topology and the Redis reservations,
commits each gang with one Lua script, then records `job.placed` and sends launch commands.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from faststream import AckPolicy
from faststream.nats import NatsMessage
from nats.js.api import ConsumerConfig
from oneplus_bus.clusterview import LiveSnapshot, SnapshotSource, pending_order
from oneplus_bus.service import OneplusService, OpsError, jstream
from oneplus_bus.telemetry import inject, job_span
from oneplus_contracts import (
    ACTIVE_STATES,
    Allocation,
    CancelRanks,
    IllegalTransition,
    JobEvent,
    JobFinished,
    JobPlaced,
    JobRecord,
    JobRequeued,
    PreemptionRequest,
    parse_job_event,
    subjects,
)
from oneplus_reservations import Conflict, ReservationStore

from .launch import launch_commands
from .outcome import attempt_outcome

log = logging.getLogger("oneplus.solver")

svc = OneplusService("placement-solver", "Places gangs atomically in the tightest topology domain")
broker = svc.broker
app = svc.app

SCHEDULE_INTERVAL_S = 1.0
RECONCILE_INTERVAL_S = 3.0
LOST_RESERVATION_GRACE_S = 5.0
_wake = asyncio.Event()
_state: dict[str, Any] = {}


def store() -> ReservationStore:
    return _state["store"]  # type: ignore[no-any-return]


def source() -> SnapshotSource:
    return _state["source"]  # type: ignore[no-any-return]


@svc.on_start
async def _connect() -> None:
    _state["store"] = ReservationStore.from_url(svc.settings.redis_url, svc.settings.cluster)
    _state["source"] = SnapshotSource(svc.kv[subjects.TOPOLOGY_KV], _state["store"])
    _state["reasons"] = {}
    await reconcile()


@svc.on_stop
async def _disconnect() -> None:
    if "store" in _state:
        await store().close()


@broker.subscriber(
    subjects.JOB_EVENTS_ALL,
    stream=jstream(subjects.JOBS_STREAM),
    durable="placement-solver",
    queue="placement-solver",
    config=ConsumerConfig(max_deliver=svc.settings.max_deliver, ack_wait=30),
    ack_policy=AckPolicy.NACK_ON_ERROR,
    title="placement-solver job events",
)
async def on_job_event(msg: NatsMessage) -> None:
    event = parse_job_event(msg.body)
    match event.type:
        case "accepted" | "requeued":
            _wake.set()
        case "node_finished":
            await settle(event.job_id)
        case "cancel_requested":
            await cancel(event.job_id)
        case "finished":
            rec, _ = await svc.ledger.get(event.job_id)
            if rec is not None and rec.token is not None:
                await store().release(event.job_id, rec.token, reason=f"job {rec.state}")
            _wake.set()


async def record(event: JobEvent) -> JobRecord | None:
    """Record an event; an event that no longer applies (a replay, a race) is ignored, not retried."""
    try:
        return await svc.ledger.record(event)
    except IllegalTransition as exc:
        log.info("ignored %s for %s: %s", event.type, event.job_id, exc)
        return None


async def settle(job_id: str) -> None:
    rec, _ = await svc.ledger.get(job_id)
    if rec is None or rec.terminal or rec.token is None:
        return
    out = attempt_outcome(rec)
    token = rec.token
    if out.action == "finish" and out.state is not None:
        # Record first: a crash before the release leaves a reservation of an ended job, which reconcile frees.
        await record(
            JobFinished(
                event_id=f"finished-{job_id}-{token}",
                job_id=job_id,
                state=out.state,
                reason=out.reason,
                token=token,
                exit_code=out.exit_code,
            )
        )
        await store().release(job_id, token, reason=out.reason)
        _wake.set()
    elif out.action == "requeue":
        await record(
            JobRequeued(
                event_id=f"requeued-{job_id}-{token}", job_id=job_id, reason=out.reason, checkpoint_ts=rec.checkpoint_ts
            )
        )
        await store().release(job_id, token, reason="preempted")
        _wake.set()
    elif out.action == "stop_others":
        for node in out.stop_nodes:
            await send_cancel(rec, node, out.reason)


async def send_cancel(rec: JobRecord, node: str, reason: str) -> None:
    assert rec.token is not None
    cmd = CancelRanks(
        command_id=f"cancel-{rec.job_id}-{rec.token}-{node}",
        job_id=rec.job_id,
        node=node,
        token=rec.token,
        reason=reason,
    )
    headers = inject({"Nats-Msg-Id": cmd.command_id})
    await svc.js.publish(
        subjects.node_command(node, "cancel"),
        cmd.model_dump_json().encode(),
        headers=headers,
        stream=subjects.COMMANDS_STREAM,
    )


async def cancel(job_id: str) -> None:
    rec, _ = await svc.ledger.get(job_id)
    if rec is None or rec.terminal:
        return
    if rec.state == "ACCEPTED":
        await record(
            JobFinished(
                event_id=f"cancelled-{job_id}", job_id=job_id, state="CANCELLED", reason=rec.reason or "cancelled"
            )
        )
        return
    if rec.allocation is None:
        return
    pending = [n for n in rec.allocation.nodes if n not in rec.nodes_done]
    if not pending:
        await settle(job_id)
    for node in pending:
        await send_cancel(rec, node, rec.reason or "cancelled")


async def commit_placed(rec: JobRecord, alloc: Allocation, token: int) -> None:
    placed = JobPlaced(
        event_id=f"placed-{rec.job_id}-{token}",
        job_id=rec.job_id,
        allocation=alloc,
        token=token,
        attempt=rec.attempt + 1,
    )
    new = await record(placed)
    if new is None:
        new, _ = await svc.ledger.get(rec.job_id)
        if new is None or new.token != token:
            return
    for cmd in launch_commands(new, alloc, token):
        headers = {"Nats-Msg-Id": cmd.command_id}
        if new.traceparent:
            headers["traceparent"] = new.traceparent
        inject(headers)
        await svc.js.publish(
            subjects.node_command(cmd.node, "launch"),
            cmd.model_dump_json().encode(),
            headers=headers,
            stream=subjects.COMMANDS_STREAM,
        )


async def schedule_once() -> int:
    """One scheduling cycle over a fresh snapshot; returns how many gangs were committed."""
    jobs = await svc.ledger.all()
    pending = pending_order([r for r in jobs if r.state == "ACCEPTED" and not r.cancel_requested])
    if not pending:
        _state["reasons"] = {}
        return 0
    snap = await source().snapshot()
    placed = 0
    reasons: dict[str, tuple[str, str]] = {}
    for rec in pending:
        with job_span(svc.tracer, "placement-solver place", rec.traceparent, {"oneplus.job_id": rec.job_id}) as span:
            decision = snap.place(rec.spec, rec.job_id)
            if decision.allocation is None:
                reasons[rec.job_id] = (reason_code(decision.detail, snap), decision.reason)
                span.set_attribute("oneplus.placed", False)
                if preemption_could_help(rec, jobs):
                    await request_preemption(rec, decision.reason)
                continue
            res = await store().reserve(rec.job_id, decision.allocation)
            if isinstance(res, Conflict):
                # Another replica took part of it since our snapshot: try again on a fresh one.
                reasons[rec.job_id] = ("Resources", f"reservation conflict ({res.reason}); retrying")
                _wake.set()
                continue
            span.set_attribute("oneplus.placed", True)
            span.set_attribute("oneplus.token", res)
            await commit_placed(rec, decision.allocation, res)
            snap.hold(decision.allocation)
            placed += 1
    _state["reasons"] = reasons
    return placed


PREEMPTION_REQUEST_EVERY_S = 10.0


def preemption_could_help(rec: JobRecord, jobs: list[JobRecord]) -> bool:
    """Only ask when some running gang of lower priority could be evicted at all."""
    return any(
        j.state in ("PLACED", "STARTING", "RUNNING") and j.spec.preemptible and j.spec.priority < rec.spec.priority
        for j in jobs
    )


async def request_preemption(rec: JobRecord, reason: str) -> None:
    window = int(time.time() // PREEMPTION_REQUEST_EVERY_S)
    req = PreemptionRequest(
        request_id=f"prq-{rec.job_id}-{window}",
        job_id=rec.job_id,
        priority=rec.spec.priority,
        gpus=rec.spec.total_gpus,
        reason=reason,
    )
    # The id dedupes: at most one request per job per window, however many cycles run.
    headers = inject({"Nats-Msg-Id": req.request_id})
    await svc.js.publish(
        subjects.PREEMPTION_REQUEST, req.model_dump_json().encode(), headers=headers, stream=subjects.COMMANDS_STREAM
    )


@svc.background
async def scheduler_loop() -> None:
    while True:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(_wake.wait(), timeout=SCHEDULE_INTERVAL_S)
        _wake.clear()
        await schedule_once()


async def reconcile() -> None:
    """Make the job records and the reservations agree after any crash (ours or another replica's)."""
    now = time.time()
    reservations = {r.job_id: r for r in await store().all()}
    jobs = {r.job_id: r for r in await svc.ledger.all()}
    for job_id, res in reservations.items():
        rec = jobs.get(job_id)
        if rec is None:
            if now - res.ts_ms / 1000 > LOST_RESERVATION_GRACE_S:
                await store().release(job_id, res.token, reason="orphan: no such job")
        elif rec.state == "ACCEPTED" and not rec.cancel_requested:
            await commit_placed(rec, res.allocation, res.token)
        elif rec.terminal:
            await store().release(job_id, res.token, reason=f"job already {rec.state}")
    for rec in jobs.values():
        if (
            rec.state in ACTIVE_STATES
            and rec.job_id not in reservations
            and now - rec.updated_ts > LOST_RESERVATION_GRACE_S
        ):
            await record(
                JobRequeued(
                    event_id=f"lost-{rec.job_id}-{rec.token}",
                    job_id=rec.job_id,
                    reason="reservation lease expired (node lost?); requeued",
                )
            )
            _wake.set()
        elif rec.state in ACTIVE_STATES and rec.allocation and set(rec.nodes_done) >= set(rec.allocation.nodes):
            await settle(rec.job_id)


@svc.background
async def reconcile_loop() -> None:
    while True:
        await asyncio.sleep(RECONCILE_INTERVAL_S)
        await reconcile()


@svc.ops("job-explain", subjects.OPS_JOB_EXPLAIN)
async def explain(payload: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
    job_id = str(payload.get("job_id") or "")
    rec, _ = await svc.ledger.get(job_id)
    if rec is None:
        raise OpsError(f"no job {job_id!r}", 404)
    team = payload.get("team")
    if team and rec.spec.team != team:
        raise OpsError(f"no job {job_id!r} in team {team!r}", 404)
    if rec.state != "ACCEPTED":
        return {"job_id": job_id, "state": rec.state, "pending": False, "message": f"job is {rec.state}, not pending"}
    jobs = await svc.ledger.all()
    snap = await source().snapshot()
    return {"job_id": job_id, "state": rec.state, "pending": True, **snap.explain(rec, jobs)}


ST_CODES = {
    "ACCEPTED": "PD",
    "PLACED": "CF",
    "STARTING": "CF",
    "RUNNING": "R",
    "PREEMPTING": "SI",
    "CHECKPOINTED": "PR",
}


def reason_code(detail: dict[str, Any], snap: LiveSnapshot) -> str:
    """Slurm-style reason: Resources when GPUs are short overall, Topology when they are but not together."""
    level = str(detail.get("level", ""))
    if level == "request":
        return "Resources"
    needed = float(detail.get("needed_gpus", 0.0))
    if needed and snap.state.total_free_gpus() >= needed:
        return "Topology"
    return "Resources"


def _elapsed(rec: JobRecord, now: float) -> str:
    secs = int(now - rec.started_ts) if rec.started_ts else 0
    m, s = divmod(secs, 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


@svc.ops("queue-list", subjects.OPS_QUEUE_LIST)
async def queue_list(payload: dict[str, Any], headers: dict[str, str]) -> list[dict[str, Any]]:
    team = payload.get("team")
    now = time.time()
    reasons: dict[str, tuple[str, str]] = _state.get("reasons", {})
    rows = []
    jobs = [r for r in await svc.ledger.all() if not r.terminal and (team is None or r.spec.team == team)]
    order = {r.job_id: i for i, r in enumerate(pending_order([r for r in jobs if r.state == "ACCEPTED"]))}
    for r in sorted(jobs, key=lambda r: (r.state == "ACCEPTED", order.get(r.job_id, 0), r.submitted_ts)):
        code, why = reasons.get(
            r.job_id, ("Priority" if order.get(r.job_id, 0) else "Resources", "waiting for a cycle")
        )
        where = ",".join(r.allocation.nodes) if r.allocation else f"({code})"
        rows.append(
            {
                "job_id": r.job_id,
                "queue": r.spec.queue,
                "name": r.spec.name,
                "user": r.spec.user,
                "st": ST_CODES.get(r.state, r.state),
                "time": _elapsed(r, now),
                "gpus": f"{r.spec.total_gpus:g}",
                "where": where,
                "reason": None if r.allocation else why,
                "state": r.state,
                "priority": r.spec.priority,
            }
        )
    return rows


def main() -> None:
    svc.run()
