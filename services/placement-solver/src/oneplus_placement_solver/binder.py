"""The binder: carries out a cycle's placements, outside the cycle lock (kube-scheduler's binding cycle).

A cycle assumes its placements in the working set (`assume`, called by `apply_decision`) and hands them over; the
binder reserves them in Redis (one pipeline, each gang taken whole or refused by the fenced Lua commit), records
`placed` through the owner (a follower reports it as a fact) and the owner's reaction sends the launch commands.
Bindings run as tasks, up to `bind_depth` at once: the next cycle decides while the last one's round trips are out.
A gang the store refuses is forgotten: its assumed hold is dropped and the job is pending again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from nats.js.api import PubAck
from oneplus_bus.acks import wait_acks
from oneplus_bus.telemetry import job_span
from oneplus_contracts import Allocation, JobPlaced, JobRecord, LaunchBatch, LaunchRanks
from oneplus_placement.layout import Layout
from oneplus_reservations import Conflict

from .context import SolverContext
from .launch import chunked, launch_commands

log = logging.getLogger("oneplus.solver")

ASSUMED = -1  # the token of a hold a cycle assumed and the store has not granted yet (real tokens are positive)


@dataclass
class Assumed:
    """One cycle's placements, held in the working set until the store binds or refuses each."""

    now: float
    layout: Layout
    gangs: list[tuple[JobRecord, Allocation]] = field(default_factory=list)


class Binder:
    def __init__(self, ctx: SolverContext) -> None:
        self.ctx = ctx
        # Gangs assumed or reserved and not recorded yet, job → (token or ASSUMED, allocation): the capacity model
        # keeps them held whatever the store read before they were reserved, and reconcile leaves them alone.
        self.binding: dict[str, tuple[int, Allocation]] = {}
        # Gangs reserved since the capacity model last read the store whole (see `recent_holds`).
        self.reserved_since_read: dict[str, tuple[int, Allocation]] = {}
        self.stale = False  # the store refused a gang another replica took: re-read it before the next cycle
        self.last_bind_s = 0.0  # how long the last binding took: the scheduler's rest counts it (see Scheduler.run)
        self._tasks: set[asyncio.Task[int]] = set()

    # -- assume / forget -------------------------------------------------------------------------------------------
    def assume(self, job_id: str, alloc: Allocation) -> None:
        """A cycle placed `job_id`: hold its GPUs in the working set now, before the store grants them."""
        self.ctx.work.capacity.hold(job_id, ASSUMED, alloc)
        self.binding[job_id] = (ASSUMED, alloc)

    def forget(self, job_id: str) -> None:
        """An assumed gang the store did not grant: its GPUs are offered again and the job is pending again."""
        self.binding.pop(job_id, None)
        if self.ctx.work.capacity.token_of(job_id) == ASSUMED:
            self.ctx.work.capacity.release(job_id)

    def recent_holds(self) -> dict[str, tuple[int, Allocation]]:
        """What the capacity model must keep held beside a read of the store: the gangs being bound, and those
        reserved since the read began (a follower's report leaves `binding` before its job's record holds them)."""
        capacity = self.ctx.work.capacity
        recent = {j: h for j, h in self.reserved_since_read.items() if capacity.token_of(j) == h[0]}
        return recent | self.binding

    # -- the pipeline ----------------------------------------------------------------------------------------------
    async def room(self) -> None:
        """Wait until fewer than `bind_depth` bindings are in flight."""
        while len(self._tasks) >= max(1, self.ctx.settings.bind_depth):
            await asyncio.wait(self._tasks, return_when=asyncio.FIRST_COMPLETED)

    def submit(self, assumed: Assumed) -> None:
        """Bind `assumed` in the background (a failure is logged; reconcile records or frees what it left)."""
        task = asyncio.create_task(self.bind(assumed), name="placement-solver:bind")
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[int]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("binding a cycle's placements failed; reconcile records or frees them", exc_info=exc)

    async def drain(self) -> None:
        """Wait for every binding in flight to end (the store's epoch guard, before a rebuild)."""
        while self._tasks:
            await asyncio.wait(set(self._tasks))

    async def stop(self) -> None:
        tasks = set(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=5.0)

    # -- one binding -----------------------------------------------------------------------------------------------
    async def bind(self, assumed: Assumed) -> int:
        """Reserve, record and launch one cycle's placements; how many gangs were recorded placed."""
        if not assumed.gangs:
            return 0
        ctx = self.ctx
        t0 = time.monotonic()
        unresolved = {rec.job_id for rec, _ in assumed.gangs}
        granted: dict[str, int] = {}  # job → token the store granted in this binding
        forgot = False
        try:
            placed: list[tuple[JobRecord, Allocation, int]] = []
            # Every gang of the cycle in one round trip to the store; each is taken or refused on its own.
            reserved = await ctx.store.reserve_many([(rec.job_id, alloc) for rec, alloc in assumed.gangs])
            for (rec, alloc), res in zip(assumed.gangs, reserved, strict=False):
                job_id = rec.job_id
                attrs = {"oneplus.job_id": job_id}
                with job_span(ctx.svc.tracer, "placement-solver place", rec.traceparent, attrs) as sp:
                    if isinstance(res, Conflict) and res.store_reset:
                        # The store lost its state: nothing more is placed until it is rebuilt (the gangs after
                        # this one are forgotten below; one a rebuilt store took has no record: reconcile frees it).
                        sp.set_attribute("oneplus.placed", False)
                        ctx.metrics.conflicts.labels("store_reset").inc()
                        log.error("reservation of %s refused: %s", job_id, res.reason)
                        ctx.store_ok = False
                        break
                    if isinstance(res, Conflict) and res.not_replicated:
                        # No Redis replica acknowledged the commit (it was released again): placing waits for them.
                        sp.set_attribute("oneplus.placed", False)
                        ctx.metrics.conflicts.labels("not_replicated").inc()
                        log.warning("reservation of %s refused: %s", job_id, res.reason)
                        break
                    if isinstance(res, Conflict):
                        # Another replica took part of it since our snapshot: the next cycle decides on a fresh read.
                        sp.set_attribute("oneplus.placed", False)
                        ctx.metrics.conflicts.labels("taken").inc()
                        log.info("reservation of %s refused: %s", job_id, res.reason)
                        self.stale = forgot = True
                        unresolved.discard(job_id)
                        self.forget(job_id)
                        continue
                    token = int(res)
                    sp.set_attribute("oneplus.placed", True)
                    sp.set_attribute("oneplus.token", token)
                    sp.set_attribute("oneplus.domain", alloc.domain)
                    unresolved.discard(job_id)
                    granted[job_id] = token
                    ctx.work.capacity.hold(job_id, token, alloc)
                    self.binding[job_id] = self.reserved_since_read[job_id] = (token, alloc)
                    ctx.metrics.placed_gang(rec, alloc, assumed.layout, assumed.now)
                    # Audited by its `placed` event (oneplus_stores.audit.transition_audit): no append of its own.
                    placed.append((rec, alloc, token))
            for job_id in unresolved:
                self.forget(job_id)  # not reserved: pending again
                forgot = True
            unresolved.clear()
            await self.commit_placed(placed)
            return len(placed)
        finally:
            # Reserved ones stay held whatever happened: recorded now, or recorded (or freed) by reconcile.
            for job_id in unresolved:
                self.forget(job_id)
                forgot = True
            for job_id, token in granted.items():
                if self.binding.get(job_id, (None,))[0] == token:
                    del self.binding[job_id]
            if len(self.reserved_since_read) > 100_000:
                self.reserved_since_read.clear()  # a read of the store that never comes (no reconcile, no follower)
            if forgot:
                ctx.wake.set()  # their jobs are pending again
            self.last_bind_s = time.monotonic() - t0

    async def commit_placed(self, placed: Sequence[tuple[JobRecord, Allocation, int]]) -> None:
        """Record `placed` for every gang in one commit; the reaction to each sends its launch commands.
        A follower reports them to the owner, whose reaction launches them."""
        if not placed:
            return
        ctx = self.ctx
        events = [
            JobPlaced(
                event_id=f"placed-{rec.job_id}-{token}",
                job_id=rec.job_id,
                allocation=alloc,
                token=token,
                attempt=rec.attempt + 1,
            )
            for rec, alloc, token in placed
        ]
        if not ctx.leading:
            # Refused by the owner if the job moved on meanwhile (cancelled): its reconcile frees the reservation.
            await ctx.record(*events)
            return
        records = await ctx.owner.commit(*events)
        for (rec, alloc, token), new in zip(placed, records, strict=True):
            if new is not None:
                continue  # launched by the reaction to its record
            current = ctx.owner.index.get(rec.job_id)
            if current is None or current.token != token:
                continue  # cancelled between the decision and the commit: reconcile frees the reservation
            await self.send_launches(current, alloc, token)  # recorded before (a replayed commit): launch again

    # -- launch commands -------------------------------------------------------------------------------------------
    async def send_launches(
        self, rec: JobRecord, alloc: Allocation, token: int, nodes: Collection[str] | None = None
    ) -> None:
        """The launch commands of an attempt (of `nodes` only, when given). Each has a fixed id, so JetStream drops a
        command sent again within its duplicate window: resending after a crash reaches only the nodes that missed
        it."""
        await wait_acks(await self.launch_futures(rec, alloc, token, nodes))

    async def launch_futures(
        self,
        rec: JobRecord,
        alloc: Allocation | None = None,
        token: int | None = None,
        nodes: Collection[str] | None = None,
    ) -> list[asyncio.Future[PubAck]]:
        """Publish the launch commands of an attempt (its record's allocation and token unless given) without
        waiting: the acknowledgements to await."""
        futures = []
        for cmd in self.commands_of(rec, alloc, token):
            if nodes is not None and cmd.node not in nodes:
                continue
            futures.append(await self.ctx.send_node_command(cmd, "launch", rec.traceparent))
        return futures

    async def launch_batches(self, recs: Sequence[JobRecord]) -> list[asyncio.Future[PubAck]]:
        """Publish the launch commands of several placed records (one commit's), one message per node (or per
        `BATCH_BYTES` of launches): a node with one launch gets it alone, as any executor reads it; one with several
        gets a `launch_batch` of them, each launch carrying its own job's trace. The acknowledgements to await."""
        per_node: dict[str, list[LaunchRanks]] = {}
        for rec in recs:
            for cmd in self.commands_of(rec):
                per_node.setdefault(cmd.node, []).append(cmd)
        traces = {rec.job_id: rec.traceparent for rec in recs}
        futures = []
        for node, launches in per_node.items():
            for cmds in chunked(launches):
                if len(cmds) == 1:
                    futures.append(await self.ctx.send_node_command(cmds[0], "launch", traces.get(cmds[0].job_id)))
                    continue
                # The batch's header carries the first job's trace; every launch keeps its own in its body.
                batch = LaunchBatch(
                    node=node,
                    launches=[c.model_copy(update={"traceparent": traces.get(c.job_id)}) for c in cmds],
                )
                futures.append(await self.ctx.send_node_command(batch, "launch", traces.get(cmds[0].job_id)))
        return futures

    def commands_of(
        self, rec: JobRecord, alloc: Allocation | None = None, token: int | None = None
    ) -> list[LaunchRanks]:
        """The launch commands of an attempt, one per node (its record's allocation and token unless given)."""
        alloc = alloc if alloc is not None else rec.allocation
        token = token if token is not None else rec.token
        if alloc is None or token is None:
            return []
        records = self.ctx.work.capacity.records
        addresses = {n: a for n in alloc.nodes if n in records and (a := records[n].topology.address)}
        return launch_commands(rec, alloc, token, addresses)
