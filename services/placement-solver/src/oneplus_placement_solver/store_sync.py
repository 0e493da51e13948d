"""The reservation store and the capacity model kept in step: the store's epoch checked, a reset store rebuilt, and
the live reservations read into the capacity model."""

from __future__ import annotations

import logging
import time

from prometheus_client import Counter

from .binder import Binder
from .context import SolverContext
from .fence import StoreCheck

log = logging.getLogger("oneplus.solver")

STORE_REBUILD_LEASE_S = 60.0  # a rebuilt reservation lives this long unless its node renews it


class StoreSync:
    def __init__(self, ctx: SolverContext, binder: Binder) -> None:
        self.ctx = ctx
        self.binder = binder
        self.resets = 0
        self.resets_metric = Counter(
            "oneplus_reservation_store_resets",
            "Reservation stores found reset or rolled back, and rebuilt",
            registry=ctx.svc.metrics,
        )

    async def sync_store(self) -> None:
        """The owner checks (and if need be rebuilds) the reservation store; a follower only checks and re-reads it:
        rebuilding is the owner's, and a follower places nothing while the store is not intact."""
        ctx = self.ctx
        if ctx.leading:
            await self.guard_store(await ctx.fence.check())
            return
        check = await ctx.fence.check()
        ctx.store_ok = check.intact
        if check.intact:
            ctx.audit.epoch = ctx.fence.epoch
            await self.sync_capacity()

    async def sync_capacity(self) -> None:
        """Make the capacity model hold exactly the store's reservations (one read of the live ones), the record
        holders and the gangs being bound, and wake."""
        ctx = self.ctx
        self.binder.reserved_since_read.clear()
        self.binder.stale = False
        reservations = await ctx.store.all()
        # No await from here on: the holds are computed and taken in one step of the event loop.
        holds = ctx.work.holding(reservations, ctx.owner.index.holders.values(), self.binder.recent_holds())
        ctx.work.capacity.hold_exactly(holds)
        ctx.wake.set()

    async def guard_store(self, check: StoreCheck) -> None:
        """Trust the store, set up a new one, or rebuild one that lost its state; the capacity model then holds
        exactly what the store holds. Setting up and rebuilding hold the cycle lock and wait for the bindings in
        flight: no gang is assumed or reserved while the store's epoch changes."""
        ctx = self.ctx
        if check.intact:
            ctx.store_ok = True
            ctx.audit.epoch = ctx.fence.epoch
            await self.sync_capacity()
            return
        ctx.store_ok = False
        async with ctx.cycle_lock:
            await self.binder.drain()
            await self._set_up_or_rebuild(check)
        await self.sync_capacity()

    async def _set_up_or_rebuild(self, check: StoreCheck) -> None:
        ctx = self.ctx
        fence, audit = ctx.fence, ctx.audit
        if check.fresh and not ctx.owner.index.holders:
            fence.epoch = await fence.bump(0)
            await ctx.store.set_epoch(fence.epoch)
            audit.epoch = fence.epoch
            log.info("reservation store set up at epoch %d", fence.epoch)
            ctx.store_ok = True
            return
        self.resets += 1
        log.error("%s; placing stops until the running jobs' reservations are rebuilt", check.describe())
        t0 = time.monotonic()
        out = await fence.rebuild(check, list(ctx.owner.index.holders.values()), STORE_REBUILD_LEASE_S)
        audit.epoch = out.epoch
        for job_id, token, alloc in out.restored:
            await audit.record("restore", job_id, token, alloc, reason=check.describe())
        await audit.flush()
        for job_id, why in out.refused.items():
            log.error("the reservation of %s could not be put back: %s", job_id, why)
        log.warning(
            "reservation store rebuilt at epoch %d in %.2f s: %d reservation(s) put back under their tokens",
            out.epoch,
            time.monotonic() - t0,
            len(out.restored),
        )
        self.resets_metric.inc()
        ctx.store_ok = True

    async def check_store(self) -> None:
        """Reconcile's and a refused commit's check: one GET of the marker (JetStream only when it disagrees)."""
        marker = await self.ctx.store.epoch()
        if marker is not None and marker >= self.ctx.fence.epoch:
            return
        await self.sync_store()
