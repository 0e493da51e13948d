"""placement-solver: owns job state, the queue order and every placement decision.

It is the one writer of job records (owner.py): other services report facts, which it folds in order. Its working
set is in memory (working_set.py): the live jobs (owner.index), per-node free capacity (LiveCapacity, fed by the
topology bucket's changes and its own reservations) and the queue config (fed by the queues bucket's changes).

Built along the lines of kube-scheduler's framework, one part a module, sharing one `SolverContext`:
- scheduler.py: snapshot of the working set → `schedule_cycle` → assumed placements (under the cycle lock, in memory);
- binder.py: reserve in Redis (the fenced Lua gang commit), record `placed`, launch; asynchronous, pipelined, and a
  refused gang is forgotten (pending again);
- controller.py: the reactions to committed events (launch, settle, cancel), lost nodes, reconcile, expiry;
- store_sync.py: the reservation store's epoch, its rebuild after a reset, and the capacity model read from it;
- membership.py: the owner lease, the live replicas (rendezvous shards), taking and giving up the lead;
- ops.py: explain, the queue listings and each replica's reasons.

Replicas run active-active: the one holding the owner lease (`solver_state` key `owner.lease`) folds facts, writes
job records, reacts (launch, settle, cancel, requeue), reconciles and expires; every replica, that one included,
places the pending jobs it wins by rendezvous hashing over the live replicas, commits each gang in Redis (the
atomic, fenced reservation) and reports `placed` as a fact for the owner to record. A follower keeps the same
working set by following the job stream.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

from oneplus_bus.informer import StreamTail, kv_list_and_watch
from oneplus_bus.lease import Lease
from oneplus_bus.service import OneplusService
from oneplus_bus.settings import BusSettings
from oneplus_contracts import NodeReportRequest, subjects
from oneplus_placement.live import LiveCapacity
from oneplus_placement.reports import NodeReports
from oneplus_queueing.advance import AdvanceBook
from oneplus_queueing.config import QueueConfig
from oneplus_queueing.model import CycleDecision
from oneplus_reservations import ReservationStore
from oneplus_reservations.connect import RedisSettings
from oneplus_stores.archive import JobArchive
from oneplus_stores.audit import ReservationAuditLog
from prometheus_client import Counter

from .binder import Binder
from .context import SolverContext
from .controller import Controller, Release
from .fence import StoreFence
from .membership import Membership
from .memory import SolverMemory
from .metrics import SolverMetrics
from .ops import SolverOps
from .owner import JobOwner
from .scheduler import Scheduler
from .settings import SolverSettings
from .store_sync import StoreSync
from .working_set import WorkingSet

__all__ = ["Solver", "SolverSettings", "build_solver", "main"]

log = logging.getLogger("oneplus.solver")


class Solver:
    """The solver's parts, built and started together over one service's bus connection and a reservation store.

    The attributes below are the handles that tests and tools use; each forwards to the part that owns it."""

    def __init__(self, svc: OneplusService, settings: SolverSettings, store: ReservationStore | None = None) -> None:
        self.svc = svc
        wake = asyncio.Event()
        capacity = LiveCapacity("live", settings.nic_gbps_per_gpu, settings.oversubscription)
        self.ctx = SolverContext(
            svc=svc,
            settings=settings,
            work=WorkingSet(capacity, wake),
            metrics=SolverMetrics(svc.metrics),
            wake=wake,
            members=(settings.replica,),
            store_=store,
        )
        self.binder = Binder(self.ctx)
        self.store_sync = StoreSync(self.ctx, self.binder)
        self.controller = Controller(self.ctx, self.binder, self.store_sync)
        self.scheduler = Scheduler(self.ctx, self.binder, self.store_sync)
        self.membership = Membership(self.ctx, self.controller, self.scheduler, self.store_sync)
        self.ops = SolverOps(self.ctx, self.scheduler)
        self._tails: list[StreamTail] = []
        self.redis: RedisSettings | None = None  # where the reservation store is (read at bootstrap)

    # -- bootstrap -------------------------------------------------------------------------------------------------
    async def start(self) -> None:
        ctx, svc = self.ctx, self.svc
        if ctx.store_ is None:
            ctx.store_ = ReservationStore.connect(
                self.redis or RedisSettings.of_bus(svc.settings), svc.settings.cluster
            )
        await ctx.store.load_scripts()
        state_kv = svc.kv[subjects.SOLVER_STATE_KV]
        ctx.memory_ = SolverMemory(state_kv)
        self.scheduler.carry = await ctx.memory.load_carry()
        ctx.owner_ = JobOwner(
            svc.js,
            JobArchive(svc.js),
            min_age_s=ctx.settings.min_job_age_s,
            metrics=svc.metrics,
            state_kv=state_kv,
            nc=svc.nc,
            me=ctx.settings.replica,
        )
        ctx.owner.on_applied(self.controller.react)
        ctx.owner.guard = self.membership.guard_commit
        ctx.owner.on_deposed = self.membership.deposed  # the server refused a write: a newer owner fenced the streams
        ctx.memory.fence = ctx.owner.fence
        if await self.membership.join():
            await ctx.owner.bootstrap(self.membership.lease.revision)  # the lease's revision is the owner epoch
        else:
            holder = self.membership.lease.holder
            log.info("solver %s follows: %s holds the owner lease", ctx.settings.replica, holder)
            await ctx.owner.follow(self.membership.on_followed)
        work = ctx.work
        work.queues_file = ctx.settings.queues_file
        work.load_file_config()
        self._tails.append(await kv_list_and_watch(svc.js, subjects.TOPOLOGY_KV, work.on_node, "solver-topology"))
        self._tails.append(await kv_list_and_watch(svc.js, subjects.QUEUES_KV, work.on_queues, "solver-queues"))
        self._tails.append(
            await kv_list_and_watch(svc.js, subjects.ADVANCE_RESERVATIONS_KV, work.on_advance, "solver-advance")
        )
        ctx.audit_ = ReservationAuditLog(svc.js)
        ctx.fence_ = StoreFence(state_kv, ctx.store)
        await self.store_sync.sync_store()
        await svc.nc.subscribe(subjects.node_lost("*"), cb=self.controller.on_lost_msg)
        await svc.nc.subscribe(subjects.node_heartbeat("*"), cb=work.on_heartbeat_msg)
        # Nodes repeat an unchanged report only every ONEPLUS_REPORT_EVERY_S: ask every node for its ranks now.
        await svc.nc.publish(subjects.NODE_REPORT_REQUEST, NodeReportRequest().model_dump_json().encode())
        await svc.nc.subscribe(subjects.ops_solver_reasons(ctx.settings.replica), cb=self.ops.on_reasons_request)
        if ctx.leading:
            await self.controller.reconcile()
            self.membership.start_owner_loops()
        ctx.wake.set()

    async def stop(self) -> None:
        for tail in self._tails:
            await tail.stop()
        await self.binder.stop()
        if self.ctx.owner_ is not None:
            await self.ctx.owner.unfollow()
        await self.membership.leave()
        if self.ctx.store_ is not None:
            await self.ctx.store_.close()

    # -- handles (tests drive a solver built with loops=False through these) ---------------------------------------
    @property
    def settings(self) -> SolverSettings:
        return self.ctx.settings

    @settings.setter
    def settings(self, value: SolverSettings) -> None:
        self.ctx.settings = value

    @property
    def config(self) -> QueueConfig:
        return self.ctx.work.config

    @config.setter
    def config(self, value: QueueConfig) -> None:
        self.ctx.work.config = value

    @property
    def advance(self) -> AdvanceBook:
        return self.ctx.work.advance

    @property
    def loops(self) -> bool:
        return self.membership.loops

    @loops.setter
    def loops(self, value: bool) -> None:
        self.membership.loops = value

    @property
    def store(self) -> ReservationStore:
        return self.ctx.store

    @property
    def owner(self) -> JobOwner:
        return self.ctx.owner

    @property
    def memory(self) -> SolverMemory:
        return self.ctx.memory

    @property
    def audit(self) -> ReservationAuditLog:
        return self.ctx.audit

    @property
    def fence(self) -> StoreFence:
        return self.ctx.fence

    @property
    def metrics(self) -> SolverMetrics:
        return self.ctx.metrics

    @property
    def capacity(self) -> LiveCapacity:
        return self.ctx.work.capacity

    @property
    def reports(self) -> NodeReports:
        return self.ctx.work.reports

    @property
    def transition(self) -> asyncio.Lock:
        """The cycle lock (see `SolverContext.cycle_lock`)."""
        return self.ctx.cycle_lock

    @property
    def wake(self) -> asyncio.Event:
        return self.ctx.wake

    @property
    def leading(self) -> bool:
        return self.ctx.leading

    @property
    def members(self) -> tuple[str, ...]:
        return self.ctx.members

    @property
    def lease(self) -> Lease:
        return self.membership.lease

    @property
    def store_ok(self) -> bool:
        return self.ctx.store_ok

    @property
    def store_resets(self) -> int:
        return self.store_sync.resets

    @property
    def resets_metric(self) -> Counter:
        return self.store_sync.resets_metric

    @property
    def decision(self) -> CycleDecision | None:
        return self.scheduler.decision

    @property
    def cycles(self) -> int:
        return self.scheduler.cycles

    async def schedule_once(self) -> int:
        """One scheduling cycle and its binding, awaited; how many gangs were recorded placed."""
        return await self.scheduler.schedule_once()

    async def reconcile(self) -> None:
        await self.controller.reconcile()

    async def release(self, job_id: str, token: int | None, reason: str) -> None:
        await self.controller.release(job_id, token, reason)

    async def release_many(self, releases: Iterable[Release]) -> None:
        await self.controller.release_many(list(releases))

    async def beat(self) -> None:
        await self.membership.beat()

    def deposed(self) -> None:
        self.membership.deposed()

    async def explain(self, payload: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
        return await self.ops.explain(payload, headers)

    async def queue_list(self, payload: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
        return await self.ops.queue_list(payload, headers)

    async def queues_list(self, payload: dict[str, Any], headers: dict[str, str]) -> list[dict[str, Any]]:
        return await self.ops.queues_list(payload, headers)


def build_solver(
    settings: BusSettings | None = None,
    solver_settings: SolverSettings | None = None,
    store: ReservationStore | None = None,
    *,
    loops: bool = True,
) -> tuple[OneplusService, Solver]:
    """The placement-solver service, built from its settings and ports (the reservation store may be given).

    Without `loops` nothing runs by itself (no fact consumer, cycle, reconcile or expiry): a test drives it."""
    svc = OneplusService(
        "placement-solver", "Owns job state; places gangs atomically in the tightest topology domain", settings
    )
    solver = Solver(svc, solver_settings or SolverSettings.from_env(), store)
    solver.redis = RedisSettings.of_bus(svc.settings)  # a bad REDIS_* value is refused here, at bootstrap
    solver.loops = loops
    svc.on_start(solver.start)
    svc.on_stop(solver.stop)
    if loops:
        # The owner's loops (facts, reconcile, expiry) start and stop with the owner lease.
        svc.background(solver.scheduler.run)
        svc.background(solver.membership.role_loop)
        svc.background(solver.controller.follower_loop)
    svc.ops("job-explain", subjects.OPS_JOB_EXPLAIN)(solver.ops.explain)
    svc.ops("queue-list", subjects.OPS_QUEUE_LIST)(solver.ops.queue_list)
    svc.ops("queues-list", f"{subjects.PREFIX}.ops.queues.list")(solver.ops.queues_list)
    return svc, solver


def main() -> None:
    svc, _ = build_solver(solver_settings=SolverSettings.load_or_exit())
    svc.run()
