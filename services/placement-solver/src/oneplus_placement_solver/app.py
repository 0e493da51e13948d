"""placement-solver: owns the queue order and every placement decision.

Consumes job events, places pending gangs on a snapshot of the topology and the Redis reservations,
commits each gang with one Lua script, then records `job.placed` and sends launch commands.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Collection
from typing import Any

from faststream.nats import NatsMessage
from oneplus_bus.clusterview import SnapshotSource, live_queue_config
from oneplus_bus.service import OneplusService, OpsError
from oneplus_bus.streams import DUPLICATE_WINDOW_S
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
from oneplus_queueing.config import QueueConfig
from oneplus_queueing.cycle import schedule_cycle
from oneplus_queueing.fairshare import UsageHistory
from oneplus_queueing.model import CycleDecision, PendingJob, RunningJob, VictimChoice
from oneplus_queueing.report import queue_rows, queues_rows, split_records
from oneplus_reservations import Conflict, ReservationStore

from .launch import launch_commands, silent_nodes
from .memory import SolverMemory
from .outcome import attempt_outcome

log = logging.getLogger("oneplus.solver")

svc = OneplusService("placement-solver", "Places gangs atomically in the tightest topology domain")
broker = svc.broker
app = svc.app

SCHEDULE_INTERVAL_S = 1.0
RECONCILE_INTERVAL_S = 3.0
LOST_RESERVATION_GRACE_S = 5.0
RELAUNCH_AFTER_S = 10.0  # a node silent this long after its gang was placed gets its launch command again
SETTLE_RETRIES = 40
# States in which a job holds its reservation: the active ones, and checkpointed while its ranks stop.
HOLDING_STATES = ACTIVE_STATES | {"CHECKPOINTED"}
_wake = asyncio.Event()
_state: dict[str, Any] = {}


def store() -> ReservationStore:
    return _state["store"]  # type: ignore[no-any-return]


def source() -> SnapshotSource:
    return _state["source"]  # type: ignore[no-any-return]


def memory() -> SolverMemory:
    return _state["memory"]  # type: ignore[no-any-return]


@svc.on_start
async def _connect() -> None:
    _state["store"] = ReservationStore.from_url(svc.settings.redis_url, svc.settings.cluster)
    _state["source"] = SnapshotSource(svc.js, _state["store"])
    _state["memory"] = SolverMemory(svc.kv[subjects.SOLVER_STATE_KV])
    _state["nominations"] = await memory().load_nominations()
    await reconcile()


@svc.on_stop
async def _disconnect() -> None:
    if "store" in _state:
        await store().close()


@svc.durable_subscriber(
    subjects.JOB_EVENTS_ALL,
    stream=subjects.JOBS_STREAM,
    consumer="placement-solver",
    title="placement-solver job events",
)
async def on_job_event(msg: NatsMessage) -> None:
    event = parse_job_event(msg.body)
    match event.type:
        case "accepted" | "requeued":
            _wake.set()
        case "node_finished":
            await settle(event.job_id, event.node)
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


async def settle(job_id: str, node: str | None = None) -> None:
    rec, _ = await svc.ledger.get(job_id)
    # The ledger publishes an event before it folds it into the record: give the fold a moment to land.
    for _ in range(SETTLE_RETRIES):
        if rec is None or node is None or node in rec.nodes_done or rec.terminal:
            break
        await asyncio.sleep(0.05)
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
    await send_launches(new, alloc, token)


async def send_launches(rec: JobRecord, alloc: Allocation, token: int, nodes: Collection[str] | None = None) -> None:
    """The launch commands of an attempt (of `nodes` only, when given). Each has a fixed id, so JetStream drops a
    command sent again within its duplicate window: resending after a crash reaches only the nodes that missed it."""
    for cmd in launch_commands(rec, alloc, token):
        if nodes is not None and cmd.node not in nodes:
            continue
        headers = {"Nats-Msg-Id": cmd.command_id}
        if rec.traceparent:
            headers["traceparent"] = rec.traceparent
        inject(headers)
        await svc.js.publish(
            subjects.node_command(cmd.node, "launch"),
            cmd.model_dump_json().encode(),
            headers=headers,
            stream=subjects.COMMANDS_STREAM,
        )


async def usage_for(config: QueueConfig, now: float) -> UsageHistory:
    """Fair-share usage: carried on from the stored history after a restart; a new queue tree starts a new one."""
    usage: UsageHistory | None = _state.get("usage")
    names = tuple(q.name for q in config.queues)
    if usage is None or _state.get("usage_queues") != names:
        stored = await memory().load_usage(names)
        usage = stored if stored is not None and stored.as_of <= now else UsageHistory.for_config(config, now)
        _state["usage"], _state["usage_queues"] = usage, names
    return usage


async def schedule_once() -> int:
    """One scheduling cycle of the queueing policy over a fresh snapshot; returns how many gangs were committed."""
    now = time.time()
    jobs = await svc.ledger.all()
    config = await live_queue_config(svc.kv[subjects.QUEUES_KV])
    usage = await usage_for(config, now)
    # Fair share accrues whether or not anyone waits: charge every cycle.
    usage.charge(now, [RunningJob.from_record(r) for r in jobs if r.state in ACTIVE_STATES and r.allocation])
    await memory().save_usage(usage, _state["usage_queues"])
    pending_recs = {r.job_id: r for r in jobs if r.state == "ACCEPTED" and not r.cancel_requested}
    if not pending_recs:
        _state["decision"] = None
        return 0
    view = await source().snapshot()
    # The cycle must see exactly what the snapshot holds: records and Redis can disagree for a moment
    # (a commit between reserve and `placed`, a lease that just ran out); reconcile settles those.
    running = [
        RunningJob.from_record(r)
        for r in jobs
        if r.state in ACTIVE_STATES and r.allocation is not None and view.reservations.get(r.job_id) == r.token
    ]
    pending_recs = {k: r for k, r in pending_recs.items() if k not in view.reservations}
    if not pending_recs:
        return 0
    decision = schedule_cycle(
        now,
        view.state,
        [PendingJob.from_record(r) for r in pending_recs.values()],
        running,
        config,
        usage,
        nominations=_state.get("nominations"),
    )
    _state["decision"] = decision
    _state["nominations"] = decision.nominations
    await memory().save_nominations(decision.nominations)
    placed = 0
    for job_id, alloc in decision.placements.items():
        rec = pending_recs[job_id]
        with job_span(svc.tracer, "placement-solver place", rec.traceparent, {"oneplus.job_id": job_id}) as span:
            res = await store().reserve(job_id, alloc)
            if isinstance(res, Conflict):
                # Another replica took part of it since our snapshot: the next cycle decides on a fresh one.
                span.set_attribute("oneplus.placed", False)
                _wake.set()
                continue
            span.set_attribute("oneplus.placed", True)
            span.set_attribute("oneplus.token", res)
            span.set_attribute("oneplus.domain", alloc.domain)
            await commit_placed(rec, alloc, res)
            placed += 1
    for choice in decision.preemptions:
        rec = pending_recs[choice.preemptor]
        with job_span(svc.tracer, "placement-solver preempt", rec.traceparent, {"oneplus.job_id": rec.job_id}):
            await request_preemption(rec, choice)
        for victim in choice.victims:
            usage.record_preemption(now, victim, choice.preemptor, rec.spec.total_gpus)
    if decision.preemptions:
        await memory().save_usage(usage, _state["usage_queues"], force=True)  # the rate limit must survive a crash
    return placed


PREEMPTION_REQUEST_EVERY_S = 10.0


async def request_preemption(rec: JobRecord, choice: VictimChoice) -> None:
    window = int(time.time() // PREEMPTION_REQUEST_EVERY_S)
    req = PreemptionRequest(
        request_id=f"prq-{rec.job_id}-{window}",
        job_id=rec.job_id,
        priority=rec.spec.priority,
        gpus=rec.spec.total_gpus,
        reason=f"{choice.kind}: {len(choice.victims)} gang(s) stand aside for {rec.job_id}",
        victims=list(choice.victims),
        nominated=choice.nominated,
        lost_work_gpu_s=choice.lost_work_gpu_s,
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
        elif silent := silent_nodes(rec, res.token, now, RELAUNCH_AFTER_S, DUPLICATE_WINDOW_S - RELAUNCH_AFTER_S):
            # A solver that died between the launch commands of one gang left some nodes without theirs.
            log.warning("resending the launch of %s to %s: no report since it was placed", job_id, ", ".join(silent))
            await send_launches(rec, res.allocation, res.token, silent)
    for rec in jobs.values():
        if (
            rec.state in HOLDING_STATES
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
        elif rec.state in HOLDING_STATES and rec.allocation and set(rec.nodes_done) >= set(rec.allocation.nodes):
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
    out: dict[str, Any] = {"job_id": job_id, "state": rec.state, "pending": True, **snap.explain(rec, jobs)}
    decision: CycleDecision | None = _state.get("decision")
    why = decision.reasons.get(job_id) if decision else None
    if why is not None:
        out["reason"] = why.code
        out["message"] = f"{why.code}: {why.message}" + ("" if why.message in out["message"] else f"; {out['message']}")
    return out


@svc.ops("queue-list", subjects.OPS_QUEUE_LIST)
async def queue_list(payload: dict[str, Any], headers: dict[str, str]) -> list[dict[str, Any]]:
    """squeue-like rows: holders by start time, then pending jobs in serving order with their reason."""
    team = payload.get("team")
    decision: CycleDecision | None = _state.get("decision")
    records = [r for r in await svc.ledger.all() if team is None or r.spec.team == team]
    rows = queue_rows(time.time(), records, decision.reasons if decision else {}, decision.order if decision else ())
    keys = ("job_id", "queue", "name", "user", "st", "time", "gpus", "where")
    return [{**dict(zip(keys, row.cells(), strict=True)), "reason": row.reason, "message": row.message} for row in rows]


@svc.ops("queues-list", f"{subjects.PREFIX}.ops.queues.list")
async def queues_list(payload: dict[str, Any], headers: dict[str, str]) -> list[dict[str, Any]]:
    """Per queue: guarantee, limit, used, borrowed, pending and the fair-share factor."""
    now = time.time()
    config = await live_queue_config(svc.kv[subjects.QUEUES_KV])
    pending, running = split_records([r for r in await svc.ledger.all() if not r.cancel_requested])
    usage = await usage_for(config, now)
    return [row.to_dict() for row in queues_rows(now, config, pending, running, usage)]


def main() -> None:
    svc.run()
