"""The scheduler: a snapshot of the working set → `schedule_cycle` → assumed decisions (kube-scheduler's scheduling
cycle). The cycle lock is held only while it decides and assumes, in memory; the I/O a cycle needs (the stored
fair-share history, archived dependencies) is read before, and its effects (saved usage and nominations, the victims'
`preempting`, dependency cancels) are written after. Its placements go to the binder; the owner's reaction to each
`preempting` sends the victim's checkpoint commands (the controller)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable

from oneplus_bus.telemetry import job_span
from oneplus_contracts import JobFinished, JobPreempting, JobRecord
from oneplus_contracts.arrays import JobArray, array_state, task_job_id
from oneplus_placement.capacity import CapacityIndexes
from oneplus_queueing.apply import Eviction, apply_decision
from oneplus_queueing.arrays import count_task
from oneplus_queueing.cycle import schedule_cycle
from oneplus_queueing.dependencies import referenced_jobs
from oneplus_queueing.elastic import may_grow
from oneplus_queueing.fairshare import UsageHistory
from oneplus_queueing.model import CycleCarry, CycleDecision, PendingJob
from oneplus_queueing.preemption import eviction_reason, preempting_event

from .binder import Assumed, Binder
from .context import SolverContext
from .pacing import cycle_rest
from .store_sync import StoreSync

log = logging.getLogger("oneplus.solver")

ARCHIVED_STATES_MAX = 100_000


class Scheduler:
    def __init__(self, ctx: SolverContext, binder: Binder, store_sync: StoreSync) -> None:
        self.ctx = ctx
        self.binder = binder
        self.store_sync = store_sync
        self.decision: CycleDecision | None = None
        self.evicted: list[Eviction] = []  # the last cycle's victims, recorded preempting by its effects
        self.carry = CycleCarry()  # nominations and the protected job, from one cycle to the next
        # States of jobs that dependencies name and that have left the hot view (archived: they never change).
        self.archived_states: dict[str, str | None] = {}
        self.usage: UsageHistory | None = None
        self.usage_queues: tuple[str, ...] = ()
        self.cycles = 0
        # Per-node capacities by request shape, kept from cycle to cycle: each cycle recounts only the nodes that
        # changed since the last (at 4,096 nodes, counting them all was a sixth of the solver's CPU placing jobs
        # one by one).
        self.indexes = CapacityIndexes()

    # -- the loop --------------------------------------------------------------------------------------------------
    async def run(self) -> None:
        """Cycle when woken (at least every `schedule_interval_s`), each binding handed to the binder."""
        s = self.ctx.settings
        wake = self.ctx.wake
        not_before = 0.0
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), timeout=s.schedule_interval_s)
            if (rest := not_before - time.monotonic()) > 0:
                await asyncio.sleep(rest)  # wake-ups during the rest are served by one cycle
            await self.binder.room()  # the jobs arriving meanwhile are decided together by the next cycle
            wake.clear()
            t0 = time.monotonic()
            assumed = await self.cycle()
            if assumed is not None and assumed.gangs:
                self.binder.submit(assumed)
            end = time.monotonic()
            # The rest counts the binding's time too (the last one's, as this one's is still out): a cycle freed of
            # its round trips would otherwise run several times as often, each on a smaller batch, and the cycles'
            # CPU would crowd out the owner folding the facts that free GPUs.
            not_before = end + cycle_rest(end - t0 + self.binder.last_bind_s, s.schedule_duty)

    async def schedule_once(self) -> int:
        """One cycle and its binding, awaited: how many gangs were recorded placed."""
        assumed = await self.cycle()
        return 0 if assumed is None else await self.binder.bind(assumed)

    # -- one cycle -------------------------------------------------------------------------------------------------
    async def cycle(self) -> Assumed | None:
        """Decide on the working set and assume the placements; None when the store is not to be trusted."""
        ctx = self.ctx
        if self.binder.stale:
            await self.store_sync.sync_capacity()  # a gang was refused as taken: the model missed a reservation
        if not ctx.store_ok:
            await self.store_sync.check_store()
            if not ctx.store_ok:
                return None
        now = time.time()
        usage = await self.usage_for(now)
        await self.fetch_archived_dependencies()
        async with ctx.cycle_lock:
            if not ctx.store_ok:
                return None
            t0 = time.perf_counter()
            try:
                decision, assumed = self.decide(now, usage)
            finally:
                ctx.metrics.cycle.observe(time.perf_counter() - t0)
        await self.write_effects(decision, usage)
        return assumed

    def decide(self, now: float, usage: UsageHistory) -> tuple[CycleDecision | None, Assumed | None]:
        """The cycle itself, in memory and without an await: snapshot, schedule_cycle, assume."""
        ctx = self.ctx
        work = ctx.work
        self.cycles += 1
        self.evicted = []
        index = ctx.owner.index
        running = work.running(index.holders.values())
        # Fair share accrues whether or not anyone waits: charge every cycle.
        usage.charge(now, running)
        if work.capacity.records:
            ctx.metrics.capacity(work.capacity.state())  # at most once a second
        held, binding = work.capacity.held, self.binder.binding
        pending_recs: dict[str, JobRecord] = {}
        in_flight: dict[str, int] = {}  # array id → tasks placed by an earlier cycle, their `placed` not recorded yet
        for k, r in index.pending.items():
            if k in held or k in binding:
                count_task(r.spec.array_task, in_flight)  # being bound: it counts against its array's %N
            elif not r.cancel_requested and ctx.mine(k):
                pending_recs[k] = r
        # With nobody pending a cycle still runs while an elastic gang could grow into free GPUs.
        if not pending_recs and not any(may_grow(r) for r in running):
            self.decision = None
            ctx.metrics.pending_jobs((), None)
            return None, None
        offered = work.offered()
        pending = {k: PendingJob.from_record(r) for k, r in pending_recs.items()}
        members = ctx.members
        decision = schedule_cycle(
            now,
            offered,
            list(pending.values()),
            running,
            work.config,
            usage,
            carry=self.carry,
            job_states=self.dependency_states(pending_recs.values()),
            reservations=work.advance.all,
            in_flight=in_flight,
            # Replicas break ties among equally good nodes in different orders, so they collide less in Redis.
            seed=members.index(ctx.settings.replica) if len(members) > 1 else 0,
            indexes=self.indexes,
        )
        self.decision = decision
        ctx.metrics.pending_jobs(pending_recs.values(), decision)
        self.carry = decision.carry
        # The same step as the simulator's: victims counted against the rate limit, placements assumed.
        applied = apply_decision(decision, self.binder, pending, {r.job_id: r for r in running}, usage)
        self.evicted = applied.evicted
        gangs = [(pending_recs[run.job_id], run.allocation) for run in applied.started]
        return decision, Assumed(now, offered.layout, gangs)

    async def write_effects(self, decision: CycleDecision | None, usage: UsageHistory) -> None:
        """A cycle's writes other than its placements: the owner's stored fair share and nominations, preemption
        requests and the cancels of jobs whose dependencies can never be satisfied."""
        ctx = self.ctx
        preempted = decision is not None and bool(decision.preemptions)
        if ctx.leading:  # the owner keeps the stored history; a follower's copy only orders its own shard
            # At once after a preemption: the rate limit must survive a crash.
            await ctx.memory.save_usage(usage, self.usage_queues, force=preempted)
            await ctx.memory.save_carry(self.carry)
        if decision is None:
            return
        evicted, self.evicted = self.evicted, []
        await self.preempt(decision, evicted)
        await self.end_unsatisfiable(decision)

    # -- what a cycle reads besides the working set ----------------------------------------------------------------
    async def usage_for(self, now: float) -> UsageHistory:
        """Fair-share usage: carried on from the stored history after a restart; a new queue tree starts a new one."""
        config = self.ctx.work.config
        names = tuple(q.name for q in config.queues)
        if self.usage is None or self.usage_queues != names:
            stored = await self.ctx.memory.load_usage(names)
            usable = stored is not None and stored.as_of <= now
            self.usage = stored if usable and stored is not None else UsageHistory.for_config(config, now)
            self.usage_queues = names
        return self.usage

    async def fetch_archived_dependencies(self) -> None:
        """Read from the archive, once each, the jobs that pending jobs depend on and the hot view no longer holds.

        A failed read counts as not known yet (the dependent job waits a cycle), never as no job."""
        index = self.ctx.owner.index
        with_deps = [r.spec for r in index.pending.values() if r.spec.dependencies]
        if not with_deps:
            return
        for job_id in referenced_jobs(with_deps):
            if index.get(job_id) is not None:
                continue
            if job_id in index.arrays:  # an array's id: its archived tasks are read instead
                await self.fetch_archived_tasks(job_id)
                continue
            if job_id in self.archived_states:
                continue
            try:
                got = await self.ctx.owner.archive.get(job_id)
            except Exception as exc:  # the archive unreachable: the dependent job waits
                log.warning("dependency %s: archive lookup failed (%s); its dependents wait", job_id, exc)
                continue
            if len(self.archived_states) > ARCHIVED_STATES_MAX:
                self.archived_states.clear()
            self.archived_states[job_id] = got.state if got is not None else None

    async def fetch_archived_tasks(self, array_id: str) -> None:
        """Read from the archive, once each, the tasks of an array that the working set no longer holds."""
        held, task_ids = self.array_tasks(array_id)
        for task_id in task_ids:
            job_id = task_job_id(array_id, task_id)
            if job_id in held or job_id in self.archived_states:
                continue
            try:
                got = await self.ctx.owner.archive.get(job_id)
            except Exception as exc:  # unreachable: the array counts as not done yet
                log.warning("dependency %s: archive lookup of %s failed (%s)", array_id, job_id, exc)
                continue
            self.archived_states[job_id] = got.state if got is not None else None

    def array_tasks(self, array_id: str) -> tuple[dict[str, str], list[int]]:
        """The states of an array's tasks in the working set, and all of its task ids (none if unknown)."""
        index = self.ctx.owner.index
        held = index.task_states(array_id)
        some = next(iter(held))
        rec = index.jobs.get(some) or index.get(some)
        task = rec.spec.array_task if rec is not None else None
        return held, [] if task is None else list(JobArray(indices=task.indices).task_ids)

    def array_task_states(self, array_id: str) -> list[str]:
        """The state of every task of an array: those in the working set, the others (archived) as read before the
        cycle; a task not read yet counts as waiting (ACCEPTED)."""
        held, task_ids = self.array_tasks(array_id)
        states = list(held.values())
        for task_id in task_ids:
            job_id = task_job_id(array_id, task_id)
            if job_id in held:
                continue
            if job_id not in self.archived_states:
                states.append("ACCEPTED")
            elif (state := self.archived_states[job_id]) is not None:
                states.append(state)
        return states

    def dependency_states(self, pending: Iterable[JobRecord]) -> dict[str, str]:
        """The states of the jobs that pending jobs' dependencies name: the hot view first, then the archive's
        answers read before the cycle; a job not read yet counts as waiting (ACCEPTED)."""
        wanted = referenced_jobs(r.spec for r in pending if r.spec.dependencies)
        if not wanted:
            return {}
        index = self.ctx.owner.index
        out: dict[str, str] = {}
        for job_id in wanted:
            rec = index.get(job_id)
            if rec is not None:
                out[job_id] = rec.state
            elif job_id in index.arrays:  # an array's id: all of its tasks (Slurm's afterok:123)
                out[job_id] = array_state(self.array_task_states(job_id)) or "ACCEPTED"
            elif job_id not in self.archived_states:
                out[job_id] = "ACCEPTED"
            elif (state := self.archived_states[job_id]) is not None:
                out[job_id] = state
        return out

    # -- a cycle's other effects -----------------------------------------------------------------------------------
    async def end_unsatisfiable(self, decision: CycleDecision) -> None:
        """Slurm's DependencyNeverSatisfied (with kill_invalid_depend): the job is cancelled with that reason."""
        for job_id, why in decision.unsatisfiable.items():
            rec = self.ctx.owner.index.get(job_id)
            if rec is None or rec.state != "ACCEPTED":
                continue
            await self.ctx.record(
                JobFinished(
                    event_id=f"dependency-never-{job_id}",
                    job_id=job_id,
                    state="CANCELLED",
                    reason=f"DependencyNeverSatisfied: {why}",
                )
            )

    async def preempt(self, decision: CycleDecision, evicted: list[Eviction]) -> None:
        """Record every victim of the cycle `preempting`, in one commit through the owner's fenced write path (a
        follower reports them as facts). The owner refuses one that moved on since the cycle's view; its reaction
        to each that applied sends the checkpoint commands, after the record, so a node's end never precedes it."""
        ctx = self.ctx
        index = ctx.owner.index
        events: list[JobPreempting] = []
        for e in evicted:
            victim = index.get(e.victim.job_id)
            preemptor = index.get(e.preemptor)
            event = None if victim is None else preempting_event(victim, e.preemptor, eviction_reason(e, preemptor))
            if victim is None or event is None or victim.allocation != e.victim.allocation:
                continue  # ended, or placed again, since the cycle chose it
            events.append(event)
            if not e.grows:
                ctx.metrics.preemptions.labels(victim.spec.queue).inc()
        if not events:
            return
        recorded = {e.job_id for e in events}
        for choice in decision.preemptions:
            if not recorded.intersection(choice.victims):
                continue  # its victims were already stepping aside: counted when they were chosen
            if (rec := index.get(choice.preemptor)) is not None and choice.kind != "resize":
                ctx.metrics.lost_gpu_hours.labels(rec.spec.queue).inc(max(0.0, choice.lost_work_gpu_s) / 3600)
        first = index.get(evicted[0].preemptor)
        tp = first.traceparent if first is not None else None
        with job_span(ctx.svc.tracer, "placement-solver preempt", tp, {"oneplus.victims": len(events)}):
            await ctx.record(*events)
        log.info("preempting %s", ", ".join(f"{e.job_id} ({e.reason})" for e in events))
