"""Replica membership: the owner lease (client-go leader election), the live replicas that shard the pending jobs,
and the turns between leading (folding facts, writing records, reacting) and following the job stream."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from oneplus_bus.lease import Lease, ReplicaSet
from oneplus_contracts import JobEvent, JobRecord, subjects

from .context import SolverContext
from .controller import Controller
from .owner import NotOwner
from .scheduler import Scheduler
from .store_sync import StoreSync

log = logging.getLogger("oneplus.solver")

OWNER_LEASE_KEY = subjects.SOLVER_OWNER_LEASE_KEY
REPLICA_PREFIX = "replica."


class Membership:
    def __init__(self, ctx: SolverContext, controller: Controller, scheduler: Scheduler, store_sync: StoreSync) -> None:
        self.ctx = ctx
        self.controller = controller
        self.scheduler = scheduler
        self.store_sync = store_sync
        self.loops = True  # run the owner's loops on taking the lead (build_solver(loops=False): a test drives it)
        self._lease: Lease | None = None
        self._replicas: ReplicaSet | None = None
        self._owner_tasks: list[asyncio.Task[None]] = []

    @property
    def lease(self) -> Lease:
        assert self._lease is not None, "solver not started"
        return self._lease

    async def join(self) -> bool:
        """Say this replica is alive and try the owner lease; whether it leads (its working set is not built yet)."""
        ctx = self.ctx
        s = ctx.settings
        state_kv = ctx.svc.kv[subjects.SOLVER_STATE_KV]
        self._lease = Lease(state_kv, OWNER_LEASE_KEY, s.replica, ttl_s=s.lease_ttl_s)
        self._replicas = ReplicaSet(
            ctx.svc.js, state_kv, subjects.SOLVER_STATE_KV, s.replica, prefix=REPLICA_PREFIX, ttl_s=s.lease_ttl_s
        )
        await self._replicas.start()
        ctx.members = self._replicas.alive()
        ctx.leading = await self._lease.try_hold()
        ctx.metrics.leading.set(int(ctx.leading))
        return ctx.leading

    async def leave(self) -> None:
        if self._replicas is not None:
            await self._replicas.stop()
        if self._lease is not None:
            try:
                await self._lease.release()  # a clean stop hands the lead over without the ttl's wait
            except Exception as exc:
                log.info("solver %s: owner lease not released on stop (%s)", self.ctx.settings.replica, exc)

    async def guard_commit(self) -> None:
        """Before a job record is written: this replica must hold the owner lease now (renewed if it is getting old)."""
        ctx = self.ctx
        if ctx.leading and self.lease.held:
            return
        if ctx.leading and await self.lease.try_hold():
            return
        raise NotOwner(f"solver {ctx.settings.replica} does not hold the owner lease (held by {self.lease.holder})")

    # -- the owner's loops -----------------------------------------------------------------------------------------
    def start_owner_loops(self) -> None:
        if not self.loops or self._owner_tasks:
            return
        c = self.controller
        loops = (c.owner_loop, self.ctx.owner.run_reports, c.reconcile_loop, c.expire_loop)
        self._owner_tasks = [self.ctx.svc.spawn(self._while_leading(fn)) for fn in loops]

    def _while_leading(self, loop: Callable[[], Awaitable[None]]) -> Callable[[], Awaitable[None]]:
        """`loop`, ended for good once this replica no longer leads: a deposed owner's fact loop restarted after each
        refused commit kept fetching the facts its successor waits for, and gave them back a second later each time
        (the node ends it delayed let leases lapse)."""

        async def run() -> None:
            try:
                await loop()
            except NotOwner:
                if self.ctx.leading:
                    raise  # the lease not renewed this time: the loop is restarted, the role loop decides
                log.info("solver %s: %s ends, this replica no longer leads", self.ctx.settings.replica, loop.__name__)

        run.__name__ = loop.__name__
        return run

    async def stop_owner_loops(self) -> None:
        tasks, self._owner_tasks = self._owner_tasks, []
        for task in tasks:
            task.cancel()
        if tasks:
            # Bounded: the role loop must go on beating whatever a cancelled loop does on its way out.
            await asyncio.wait(tasks, timeout=5.0)

    # -- beats -----------------------------------------------------------------------------------------------------
    async def role_loop(self) -> None:
        """Each beat: say this replica is alive, renew or try the owner lease, and take or give up the lead."""
        while True:
            await asyncio.sleep(self.ctx.settings.beat_s)
            await self.beat()

    async def beat(self) -> None:
        """One beat of `role_loop`."""
        ctx = self.ctx
        assert self._replicas is not None
        try:
            await self._replicas.beat()
        except Exception as exc:
            log.warning("solver %s: liveness beat failed (%s)", ctx.settings.replica, exc)
        members = self._replicas.alive()
        if members != ctx.members:
            log.info("solver replicas now: %s", ", ".join(members))
            ctx.members = members
            ctx.wake.set()  # the shards moved: jobs may be this replica's now
        ctx.metrics.replicas.set(len(members))
        try:
            held = await self.lease.try_hold()
        except Exception as exc:
            # The bus is down: nothing can be written anyway, and the lease ages out on its own if this lasts.
            log.warning("solver %s: owner lease not renewed (%s)", ctx.settings.replica, exc)
            return
        if held and not ctx.leading:
            await self.take_lead()
        elif not held and self.lease.holder != ctx.settings.replica and (ctx.leading or not ctx.owner.following):
            # Another replica holds it now (a lost write of our own is retried next beat); or a lead this replica
            # failed to take left it neither owning nor following.
            await self.step_down()

    async def take_lead(self) -> None:
        """This replica now holds the owner lease: rebuild the working set as a restarted owner does, then own.
        Leading only once all of it is done: a step that fails (the bus mid-failover) is tried again next beat,
        rather than leave a lead that holds the lease and folds no fact."""
        ctx = self.ctx
        log.warning("solver %s takes the lead (owner lease)", ctx.settings.replica)
        await ctx.owner.unfollow()
        ctx.leading = True  # the steps below act as the owner (sync_store rebuilds a reset store)
        ctx.metrics.leading.set(1)
        try:
            await ctx.owner.bootstrap(self.lease.revision)  # the lease's revision is the owner epoch
            self.scheduler.carry = await ctx.memory.load_carry()
            self.scheduler.usage = None  # the stored history, carried on from the last owner
            await self.store_sync.sync_store()
            await self.controller.reconcile()
        except BaseException:
            ctx.leading = False
            ctx.metrics.leading.set(0)
            raise
        self.start_owner_loops()
        ctx.wake.set()

    def deposed(self) -> None:
        """The server refused a write of this owner: a newer one fenced the streams. Stop writing now, follow."""
        ctx = self.ctx
        if ctx.leading:
            ctx.leading = False
            ctx.metrics.leading.set(0)
            ctx.svc.spawn(self.step_down)

    async def step_down(self) -> None:
        """Another replica holds the owner lease: stop writing and follow the job stream instead."""
        ctx = self.ctx
        log.warning("solver %s gives up the lead: %s holds the owner lease", ctx.settings.replica, self.lease.holder)
        ctx.leading = False
        ctx.metrics.leading.set(0)
        await self.stop_owner_loops()
        await ctx.owner.follow(self.on_followed)

    async def on_followed(self, event: JobEvent, rec: JobRecord) -> None:
        """A follower's view of an event the owner published: capacity and wake-ups, as the owner's own reactions."""
        ctx = self.ctx
        capacity = ctx.work.capacity
        if rec.job_id in ctx.owner.index.holders and rec.allocation is not None and rec.token is not None:
            capacity.ensure_held(rec.job_id, rec.token, rec.allocation)
        elif (
            event.type in ("finished", "requeued")
            and capacity.token_of(rec.job_id) is not None
            and rec.job_id not in self.controller.binder.binding  # this replica's own binding of a new attempt
        ):
            # Redis releases just after the record: a cycle that tries these GPUs before that is refused and re-reads.
            capacity.release(rec.job_id)
        if event.type in ("accepted", "requeued", "finished"):
            ctx.wake.set()
