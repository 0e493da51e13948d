"""preemption: chooses victims for a high-priority gang that cannot be placed, and runs the handshake.

The victim set is the cheapest (work since last checkpoint) whose eviction frees a domain the preemptor
can really be placed in — decided by the queueing library on the same kind of view as the solver. The view is a
working set: live jobs folded from the job-event stream (listed once from the hot view, then watched), per-node
capacity from the topology bucket's changes and the holders' allocations. Each victim gets `job.preempting`
(reported to the job's owner) and a preempt command carrying its checkpoint signal and grace period; the solver
requeues it once its nodes have stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable

from faststream.nats import NatsMessage
from oneplus_bus.informer import StreamTail, kv_list_and_watch
from oneplus_bus.ledger import latest_values, projected_seq, stream_last_seq
from oneplus_bus.service import OneplusService
from oneplus_bus.settings import BusSettings
from oneplus_bus.telemetry import inject, job_span
from oneplus_contracts import (
    ACTIVE_STATES,
    JobPreempting,
    JobRecord,
    NodeRecord,
    PreemptionRequest,
    PreemptRanks,
    parse_job_event,
    subjects,
)
from oneplus_contracts.jobindex import JobIndex
from oneplus_placement.live import LiveCapacity
from oneplus_placement.snapshot import AllocationConflict, ClusterState
from oneplus_queueing.config import QueueConfig, QueueConfigError, default_config
from oneplus_queueing.model import PendingJob, RunningJob
from oneplus_queueing.victims import choose_victims
from oneplus_stores.clusterview import QUEUES_KEY, queue_config_from
from prometheus_client import Counter
from pydantic import ValidationError

from .settings import PreemptionSettings

log = logging.getLogger("oneplus.preemption")


class Preemption:
    """The preemption service's working set and behaviour."""

    def __init__(self, svc: OneplusService, settings: PreemptionSettings | None = None) -> None:
        self.svc = svc
        self.settings = settings if settings is not None else PreemptionSettings.load()
        self.index = working_set(())
        self.capacity = LiveCapacity("live")
        self.config: QueueConfig = default_config()
        self.tails: list[StreamTail] = []
        self.folded = asyncio.Condition()  # notified after each job event is folded
        self.preemptions = Counter(
            "oneplus_preemptions",
            "Gangs asked to stand aside (checkpoint, then stop) for a higher-priority gang, by the victim's queue",
            ["queue"],
            registry=svc.metrics,
        )
        self.lost_gpu_hours = Counter(
            "oneplus_preemption_lost_gpu_hours",
            "GPU-hours of work since their last checkpoint that preempted gangs lose, by the preemptor's queue",
            ["queue"],
            registry=svc.metrics,
        )

    async def start(self) -> None:
        js = self.svc.js
        # The solver's rule: the stored tree once the watch brings it, else the file, else one `default` queue.
        self.config = queue_config_from(None, self.settings.queues_file)
        self.tails.append(await kv_list_and_watch(js, subjects.TOPOLOGY_KV, self.on_node, "preemption-topology"))
        self.tails.append(await kv_list_and_watch(js, subjects.QUEUES_KV, self.on_queues, "preemption-queues"))
        jobs = StreamTail(
            js,
            subjects.JOBS_STREAM,
            subjects.JOB_EVENTS_ALL,
            self.on_job_event,
            relist=self.relist,
            whole=True,
            name="preemption-jobs",
        )
        jobs.start(await self.relist())
        self.tails.append(jobs)

    async def stop(self) -> None:
        for tail in self.tails:
            await tail.stop()

    async def relist(self) -> int:
        """List the hot view once; returns the job-stream sequence to follow from."""
        records = [JobRecord.model_validate_json(v) for v in await latest_values(self.svc.js, subjects.JOBS_KV)]
        self.index = working_set(records)
        self.capacity.hold_exactly(
            (r.job_id, r.token, r.allocation)
            for r in self.index.holders.values()
            if r.allocation is not None and r.token is not None
        )
        self.index.last_seq = max(self.index.last_seq, await projected_seq(self.svc.kv[subjects.SOLVER_STATE_KV]))
        return self.index.last_seq

    async def on_job_event(self, seq: int, subject: str, data: bytes, headers: dict[str, str]) -> None:
        try:
            event = parse_job_event(data)
        except ValidationError:
            return
        rec = self.index.apply(event, seq, headers.get("traceparent"))
        async with self.folded:
            self.folded.notify_all()
        if rec is None:
            return
        if rec.job_id in self.index.holders and rec.allocation is not None and rec.token is not None:
            self.capacity.ensure_held(rec.job_id, rec.token, rec.allocation)
        else:
            self.capacity.release(rec.job_id)

    async def on_node(self, node: str, value: bytes | None) -> None:
        if value is None:
            self.capacity.remove_node(node)
        else:
            self.capacity.set_node(NodeRecord.model_validate_json(value))

    async def on_queues(self, key: str, value: bytes | None) -> None:
        if key != QUEUES_KEY:
            return
        try:
            self.config = queue_config_from(value, self.settings.queues_file)
        except QueueConfigError as exc:
            log.error("the stored queue config is refused, keeping the previous one: %s", exc)

    async def caught_up(self, timeout: float = 5.0) -> None:
        """Wait until the working set holds every job event published so far (a request can outrun the watch)."""
        target = await stream_last_seq(self.svc.js, subjects.JOBS_STREAM)
        async with self.folded:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.folded.wait_for(lambda: self.index.last_seq >= target), timeout)

    async def handle(self, req: PreemptionRequest) -> list[str]:
        if req.victims == [req.job_id]:
            return await self.resize(req)
        rec = self.index.get(req.job_id)
        if rec is None or rec.state != "ACCEPTED":
            await self.caught_up()
            rec = self.index.get(req.job_id)
        if rec is None or rec.state != "ACCEPTED":
            return []
        svc = self.svc
        with job_span(svc.tracer, "preemption choose-victims", rec.traceparent, {"oneplus.job_id": rec.job_id}) as span:
            jobs = self.index.jobs
            state = self.capacity.copy()
            victims = list(req.victims)
            lost_s = req.lost_work_gpu_s
            if victims:
                # The scheduling cycle chose them on an earlier view: evict only if that choice still holds.
                if not still_valid(victims, req, jobs, state):
                    span.set_attribute("oneplus.victims", 0)
                    return []
            else:
                holders = self.index.holders.values()
                already = {j.job_id for j in holders if j.state in ("PREEMPTING", "CHECKPOINTED")}
                running = [RunningJob.from_record(j) for j in holders if j.state in ACTIVE_STATES and j.allocation]
                choice = choose_victims(
                    time.time(), state, PendingJob.from_record(rec), running, self.config, exclude=already
                )
                if choice is None:
                    span.set_attribute("oneplus.victims", 0)
                    return []
                victims = list(choice.victims)
                lost_s = choice.lost_work_gpu_s
            span.set_attribute("oneplus.victims", len(victims))
            reason = f"preempted for {rec.job_id} (priority {rec.spec.priority})"
            for victim_id in victims:
                await self.preempt(jobs[victim_id], rec.job_id, reason)
                self.preemptions.labels(jobs[victim_id].spec.queue).inc()
            self.lost_gpu_hours.labels(rec.spec.queue).inc(max(0.0, lost_s) / 3600)
            log.info("%s: preempting %s (lost work %.0f GPU·s)", rec.job_id, victims, req.lost_work_gpu_s)
            return victims

    async def resize(self, req: PreemptionRequest) -> list[str]:
        """An elastic gang grows (oneplus_queueing.elastic): it is its own victim, checkpoints at its signal and is
        requeued; the solver places it on the larger allocation nominated for it (a rendezvous restart)."""
        rec = self.index.get(req.job_id)
        if rec is None or rec.state not in ("PLACED", "STARTING", "RUNNING"):
            await self.caught_up()
            rec = self.index.get(req.job_id)
        if rec is None or rec.spec.elastic is None or req.nominated is None:
            return []
        if not still_valid([rec.job_id], req, self.index.jobs, self.capacity.copy()):
            return []  # it moved on, or the GPUs it would grow into were taken since the cycle
        have, e = len(rec.allocation.ranks) if rec.allocation else 0, rec.spec.elastic
        reason = f"elastic resize: {have} -> {len(req.nominated.ranks)} ranks ({e.min_ranks}..{e.max_ranks})"
        await self.preempt(rec, rec.job_id, reason)
        log.info("%s: %s", rec.job_id, reason)
        return [rec.job_id]

    async def preempt(self, victim: JobRecord, preemptor: str, reason: str) -> None:
        if victim.token is None or victim.allocation is None:
            return
        # A fact for the job's owner: it refuses it if the victim has moved on since this view.
        await self.svc.ledger.report(
            JobPreempting(
                event_id=f"preempting-{victim.job_id}-{victim.token}",
                job_id=victim.job_id,
                token=victim.token,
                preemptor=preemptor,
                reason=reason,
            ),
            traceparent=victim.traceparent,
        )
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
            await self.svc.js.publish(
                subjects.node_command(node, "preempt"),
                cmd.model_dump_json().encode(),
                headers=headers,
                stream=subjects.COMMANDS_STREAM,
            )


def working_set(records: Iterable[JobRecord]) -> JobIndex:
    """The service's job index: finished jobs are of no use to victim choice, so none is kept (an index that kept
    them grew with every job the cluster ever ran)."""
    return JobIndex.of(records, keep_finished=False)


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


def build_preemption(
    settings: BusSettings | None = None, preemption_settings: PreemptionSettings | None = None
) -> tuple[OneplusService, Preemption]:
    svc = OneplusService("preemption", "Chooses victims by least lost work and runs the checkpoint handshake", settings)
    p = Preemption(svc, preemption_settings)
    svc.on_start(p.start)
    svc.on_stop(p.stop)

    @svc.durable_subscriber(
        subjects.PREEMPTION_REQUEST, stream=subjects.COMMANDS_STREAM, consumer="preemption", title="preemption requests"
    )
    async def on_request(msg: NatsMessage) -> None:
        await p.handle(PreemptionRequest.model_validate_json(msg.body))

    return svc, p


def main() -> None:
    svc, _ = build_preemption(preemption_settings=PreemptionSettings.load_or_exit())
    svc.run()
