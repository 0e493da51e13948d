"""The controller: the owner's reactions and loops that are not placing (slurmctld's job manager, kube's controllers).

It reacts to committed events (launch what was placed, ask victims recorded `preempting` to checkpoint and stop,
settle attempts whose nodes reported, carry out cancels), kills a victim that outlives its grace period (the
preemption's grace timer, read from the records, so a new owner recovers it), ends the gangs of a lost node,
reconciles the job records with the reservation store, and moves finished jobs to the archive. None of it holds the
cycle lock: an attempt's end is recorded, then released, under `ends` (a lock of its own), and until the release the
cycle sees the attempt as leaving (`WorkingSet.leaving`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Sequence
from typing import Any

from oneplus_bus.acks import wait_acks
from oneplus_bus.heap import trim_heap
from oneplus_bus.streams import DUPLICATE_WINDOW_S
from oneplus_bus.telemetry import inject
from oneplus_contracts import CancelRanks, JobEvent, JobFinished, JobNodeFinished, JobRecord, JobRequeued, subjects
from oneplus_contracts.jobindex import HOLDING_STATES
from oneplus_queueing.preemption import escalation_due, preempt_commands
from redis.exceptions import RedisError

from .binder import Binder
from .context import SolverContext
from .launch import silent_nodes
from .outcome import NODE_LOST, attempt_end, attempt_outcome
from .owner import Applied
from .store_sync import StoreSync

log = logging.getLogger("oneplus.solver")

LOST_EXIT = 137
TRIM_AFTER_ARCHIVED = 1000  # jobs archived before the heap is trimmed (oneplus_bus.heap)
TRIM_EVERY_S = 300.0  # while jobs keep waiting, trim at most this often

Release = tuple[str, int | None, str]  # (job, token, reason)


class Controller:
    def __init__(self, ctx: SolverContext, binder: Binder, store_sync: StoreSync) -> None:
        self.ctx = ctx
        self.binder = binder
        self.store_sync = store_sync
        # Held from an attempt's end record to its release, and by reconcile's read of the store: a settle and
        # reconcile each see the other's end whole. Never held by a cycle.
        self.ends = asyncio.Lock()
        # Victims (job, token) whose checkpoint commands this owner sent, and those it killed after their grace: a
        # new owner sends each once more (the commands' ids dedupe what reached the nodes already).
        self.asked: set[tuple[str, int]] = set()
        self.escalated: set[tuple[str, int]] = set()

    # -- reactions to committed events -----------------------------------------------------------------------------
    async def react(self, applied: Sequence[Applied]) -> None:
        """React to a commit's events, a kind at a time so that round trips overlap: every launch of the batch is
        sent before any acknowledgement is awaited, a node's launches in one message, and every attempt that ended
        is recorded in one commit."""
        ctx = self.ctx
        launches: dict[str, JobRecord] = {}
        cancels: list[JobRecord] = []
        ended: dict[str, JobRecord] = {}
        victims: list[JobRecord] = []
        for a in applied:
            match a.event.type:
                case "accepted" | "requeued" | "finished":
                    ctx.wake.set()
                case "placed":
                    # Every placement is launched from its record: this replica's own and those others report.
                    rec = a.record
                    if rec.allocation is not None and rec.token is not None:
                        ctx.work.capacity.ensure_held(rec.job_id, rec.token, rec.allocation)
                        launches[rec.job_id] = rec
                case "node_finished":
                    ev = a.event
                    assert isinstance(ev, JobNodeFinished)
                    ctx.work.reports.rank_ended(ev.job_id, ev.token, ev.node, time.time(), reported_ts=ev.ts)
                    ended[ev.job_id] = a.record  # the latest: several nodes of one gang may end in one batch
                case "cancel_requested":
                    cancels.append(a.record)
                case "preempting":
                    victims.append(a.record)
        # One failed reaction (the store down during a settle, say) must not skip the others: reconcile comes back
        # for what it left undone.
        try:
            # One message per node for the whole commit: its launches there go out in one append (a launch_batch).
            await wait_acks(await self.binder.launch_batches(list(launches.values())))
        except Exception:
            log.exception("launching %d placed gang(s) failed; reconcile resends them", len(launches))
        try:
            await self.ask_to_stand_aside(victims)
        except Exception:
            log.exception("preempt commands of %d victim(s) failed; reconcile resends them", len(victims))
        if cancels:
            await self.cancel_all(cancels)
        try:
            await self.settle_many(list(ended.values()))
        except Exception:
            log.exception("settling %d gang(s) failed; reconcile retries it", len(ended))

    async def settle(self, rec: JobRecord) -> None:
        """Decide what the nodes' reports mean for the attempt: finish it, requeue it, or stop its other nodes."""
        await self.settle_many([rec])

    async def settle_many(self, recs: Sequence[JobRecord]) -> None:
        """`settle` for several attempts: the ended ones are recorded in one commit and released side by side."""
        retries = self.ctx.settings.infra_retries
        due: list[JobRecord] = []
        for rec in recs:
            if rec.terminal or rec.token is None:
                continue
            first = attempt_outcome(rec, retries)
            if first.action == "stop_others":
                for node in first.stop_nodes:
                    await self.send_cancel(rec, node, first.reason)
            elif first.action != "wait":
                due.append(rec)
        if not due:
            return
        async with self.ends:
            ends: list[tuple[JobRecord, JobEvent, str]] = []
            for rec in due:
                # The record as it is now: two callers (a report, reconcile) may have come for the same attempt.
                current = self.ctx.owner.index.get(rec.job_id)
                if current is None or current.terminal or current.token != rec.token:
                    continue
                ending = attempt_end(current, attempt_outcome(current, retries))
                if ending is not None:
                    ends.append((current, ending[0], ending[1]))
            await self._end_locked(ends)

    async def end_attempts(self, ends: Sequence[tuple[JobRecord, JobEvent, str]]) -> None:
        """Record the end of each attempt (record, event, release reason), then free its GPUs."""
        async with self.ends:
            await self._end_locked(ends)

    async def _end_locked(self, ends: Sequence[tuple[JobRecord, JobEvent, str]]) -> None:
        # Record first: a crash before the release leaves a reservation of an ended job, which reconcile frees.
        # Until the release a cycle sees each attempt leaving: its GPUs held, a nomination on them still good.
        if not ends:
            return
        work = self.ctx.work
        for rec, _, _ in ends:
            work.leave(rec)
        try:
            await self.ctx.owner.commit(*[event for _, event, _ in ends])
            await self.release_many([(rec.job_id, rec.token, reason) for rec, _, reason in ends])
        finally:
            for rec, _, _ in ends:
                work.left(rec.job_id)

    async def release(self, job_id: str, token: int | None, reason: str) -> None:
        await self.release_many([(job_id, token, reason)])

    async def release_many(self, releases: Sequence[Release]) -> None:
        """Free the GPUs of ended gangs, (job, token, reason) each, in one round trip to the store."""
        if not releases:
            return
        # Audited by the event that ended the attempt, committed before this (oneplus_stores.audit.transition_audit).
        ctx = self.ctx
        capacity = ctx.work.capacity
        try:
            freed_all = await ctx.store.release_many(releases)
        except RedisError as exc:
            # The store is unreachable: the jobs have ended all the same. Their GPUs stay out of offers until
            # reconcile frees the reservations (or finds the store reset and rebuilds without them).
            log.warning("release of %s not confirmed by the reservation store (%s); reconcile frees them",
                        ", ".join(j for j, _, _ in releases), exc)  # fmt: skip
            return
        for (job_id, token, _reason), _freed in zip(releases, freed_all, strict=True):
            if token is None or capacity.token_of(job_id) == token:
                capacity.release(job_id)  # after Redis: a cycle never offers GPUs that Redis would refuse
        ctx.wake.set()

    # -- preemption: the owner's reaction to its own `preempting` -----------------------------------------------------
    async def ask_to_stand_aside(self, victims: Sequence[JobRecord]) -> None:
        """Send each victim's nodes the preempt command (checkpoint signal, grace period), all before any
        acknowledgement is awaited. Sent after `preempting` is committed: a node's end is never folded before it."""
        futures = []
        for rec in victims:
            for cmd in preempt_commands(rec):
                # The victim's own trace, not the preemptor's: one job, one trace.
                futures.append(await self.ctx.send_node_command(cmd, "preempt", rec.traceparent))
        await wait_acks(futures)
        self.asked.update((rec.job_id, rec.token) for rec in victims if rec.token is not None)

    async def preemption_timers(self, now: float) -> None:
        """The victims' grace timers: one not asked by this owner (it took over after the commit) is asked again;
        one that neither checkpointed nor ended within its grace is killed on the nodes that have not ended."""
        index = self.ctx.owner.index
        live: set[tuple[str, int]] = set()
        unasked: list[JobRecord] = []
        for rec in list(index.holders.values()):
            if rec.state != "PREEMPTING" or rec.token is None:
                continue
            key = (rec.job_id, rec.token)
            live.add(key)
            if key not in self.asked:
                unasked.append(rec)
            if key in self.escalated or not (nodes := escalation_due(rec, now)):
                continue
            log.warning("%s: no checkpoint nor end within its grace (%.0f s); killing its ranks on %s",
                        rec.job_id, rec.spec.checkpoint.grace_s, ", ".join(nodes))  # fmt: skip
            for node in nodes:
                await self.send_cancel(rec, node, f"preemption: no checkpoint within {rec.spec.checkpoint.grace_s} s")
            self.escalated.add(key)
            self.ctx.metrics.escalations.inc()
        if unasked:
            await self.ask_to_stand_aside(unasked)
        self.asked &= live
        self.escalated &= live

    async def send_cancel(self, rec: JobRecord, node: str, reason: str) -> None:
        assert rec.token is not None
        cmd = CancelRanks(
            command_id=f"cancel-{rec.job_id}-{rec.token}-{node}",
            job_id=rec.job_id,
            node=node,
            token=rec.token,
            reason=reason,
        )
        headers = inject({"Nats-Msg-Id": cmd.command_id})
        await self.ctx.svc.js.publish(
            subjects.node_command(node, "cancel"),
            cmd.model_dump_json().encode(),
            headers=headers,
            stream=subjects.COMMANDS_STREAM,
        )

    async def cancel_all(self, recs: Sequence[JobRecord]) -> None:
        """The reaction to cancels: pending jobs cancelled together (an array's tasks: one cancel for thousands) end
        in one commit, each running one is stopped. A failure is logged; reconcile comes back for what is left."""
        waiting = [cancelled_while_pending(rec) for rec in recs if rec.state == "ACCEPTED"]
        if waiting:
            try:
                await self.ctx.owner.commit(*waiting)
            except Exception:
                log.exception("ending %d cancelled pending job(s) failed; reconcile retries it", len(waiting))
        for rec in recs:
            if rec.state == "ACCEPTED":
                continue
            try:
                await self.cancel(rec)
            except Exception:
                log.exception("reaction to the cancel of %s failed; reconcile retries it", rec.job_id)

    async def cancel(self, rec: JobRecord) -> None:
        if rec.terminal:
            return
        if rec.state == "ACCEPTED":
            await self.ctx.owner.commit(cancelled_while_pending(rec))
            return
        if rec.allocation is None:
            return
        pending = [n for n in rec.allocation.nodes if n not in rec.nodes_done]
        if not pending:
            await self.settle(rec)
        for node in pending:
            await self.send_cancel(rec, node, rec.reason or "cancelled")

    # -- lost nodes ------------------------------------------------------------------------------------------------
    async def on_lost_msg(self, msg: Any) -> None:
        try:
            node = str(json.loads(msg.data)["node"])
        except (ValueError, KeyError, TypeError):
            return
        await self.node_lost(node)

    async def node_lost(self, node: str) -> None:
        """The registry declared `node` lost: its ranks are over; the gangs that had ranks there are requeued."""
        ctx = self.ctx
        ctx.work.reports.node_lost(node)
        if not ctx.leading:
            return
        events: list[JobEvent] = []
        for rec in list(ctx.owner.index.holders.values()):
            if rec.allocation is None or rec.token is None or node not in rec.allocation.nodes:
                continue
            if node in rec.nodes_done:
                continue
            events.append(
                JobNodeFinished(
                    # Not the executor's id (nodefin-…): its own later report must not be dropped as this one's
                    # duplicate while the owner folds it, or the record and the stream would disagree.
                    event_id=f"nodelost-{rec.job_id}-{rec.token}-{node}",
                    job_id=rec.job_id,
                    node=node,
                    token=rec.token,
                    exit_code=LOST_EXIT,
                    reason=f"{NODE_LOST}: {node} stopped reporting",
                    fault="infrastructure",
                )
            )
        if events:
            log.warning("node %s lost: ending the ranks of %d gang(s) there", node, len(events))
            await ctx.owner.commit(*events)

    # -- reconcile -------------------------------------------------------------------------------------------------
    async def reconcile(self) -> None:
        """Make the job records and the reservations agree after any crash (ours or another replica's).

        Reads the live reservations only (a cost that follows the holders) and the working set. Gangs being bound
        are the binder's: their reservations may not be recorded yet, and are left alone."""
        ctx = self.ctx
        now = time.time()
        s = ctx.settings
        index = ctx.owner.index
        await self.store_sync.check_store()
        async with self.ends:
            self.binder.reserved_since_read.clear()
            reservations = {r.job_id: r for r in await ctx.store.all()}
            marker = await ctx.store.epoch()
            intact = marker is not None and marker >= ctx.fence.epoch
            if intact:
                # A holder missing from the store (its lease ran out) keeps its GPUs until its record ends, below.
                holds = ctx.work.holding(reservations.values(), index.holders.values(), self.binder.recent_holds())
                ctx.work.capacity.hold_exactly(holds)
        if not intact:
            # Reset between the check and the read: what was read is not the truth; rebuild first.
            await self.store_sync.guard_store(await ctx.fence.check())
            return
        binding = self.binder.binding
        for job_id, res in reservations.items():
            if job_id in binding:
                continue
            rec = index.get(job_id)
            if rec is None:
                if now - res.ts_ms / 1000 > s.lost_reservation_grace_s:
                    await self.release(job_id, res.token, "orphan: no live job")
            elif rec.state == "ACCEPTED" and rec.ended_token is not None and res.token <= rec.ended_token:
                # The store lost the release of an attempt that was requeued (unreachable then): not a placement
                # that was never recorded. Recording it as placed would repeat the old `placed` event's id.
                await self.release(job_id, res.token, "attempt already ended (requeued)")
            elif rec.state == "ACCEPTED" and (clash := index.slots.conflict(job_id, res.allocation)) is not None:
                # The store granted GPUs a live attempt's record still holds (its lease ran out before its end was
                # recorded): the owner refuses that placement, so the reservation is freed and the job stays pending.
                await self.release(job_id, res.token, f"not recorded: {clash}")
            elif rec.state == "ACCEPTED" and not rec.cancel_requested:
                if len(ctx.members) > 1 and now - res.ts_ms / 1000 < s.lost_reservation_grace_s:
                    continue  # maybe another replica's fresh commit: its `placed` fact is on the way
                if not await ctx.store.replicated():  # never recorded placed on a write a failover could lose
                    continue
                await self.binder.commit_placed([(rec, res.allocation, res.token)])
            elif rec.terminal or (rec.state == "ACCEPTED" and rec.cancel_requested):
                await self.release(job_id, res.token, f"job already {rec.state}")
            elif silent := silent_nodes(
                rec, res.token, now, s.relaunch_after_s, DUPLICATE_WINDOW_S - s.relaunch_after_s
            ):
                # A solver that died between the launch commands of one gang left some nodes without theirs.
                log.warning(
                    "resending the launch of %s to %s: no report since it was placed", job_id, ", ".join(silent)
                )
                await self.binder.send_launches(rec, res.allocation, res.token, silent)
        # A record may still lag its nodes while facts a dead owner fetched are on their way back: a gang that ended
        # then has stopped renewing its lease, and its record would read as a lost reservation and be requeued.
        facts_in = ctx.owner.facts_caught_up(now)
        for rec in list(index.holders.values()):
            if rec.job_id not in reservations and now - rec.updated_ts > s.lost_reservation_grace_s and facts_in:
                # Ends the hold in the audit (the store forgot it when the lease ran out) and frees the GPUs in the
                # capacity model, which kept them while the record held them.
                why = "reservation lease expired: no node renewed it (node or executor lost?)"
                await self.end_attempts([(rec, self._lost_lease_end(rec, why), why)])
            elif rec.state in HOLDING_STATES and rec.allocation and set(rec.nodes_done) >= set(rec.allocation.nodes):
                await self.settle(rec)
        await self.preemption_timers(now)
        for rec in list(index.pending.values()):
            # A cancel whose reaction was lost (a failed batch, a crash before it ran) still ends its pending job.
            held = rec.job_id in reservations or rec.job_id in ctx.work.capacity.held
            if rec.cancel_requested and not held and rec.job_id not in binding:
                await self.cancel(rec)

    def _lost_lease_end(self, rec: JobRecord, why: str) -> JobEvent:
        retries = self.ctx.settings.infra_retries
        if rec.infra_requeues >= retries:
            return JobFinished(
                event_id=f"lost-{rec.job_id}-{rec.token}",
                job_id=rec.job_id,
                state="FAILED",
                reason=f"{why}; not requeued: its {retries} retries are spent",
                token=rec.token,
            )
        return JobRequeued(
            event_id=f"lost-{rec.job_id}-{rec.token}",
            job_id=rec.job_id,
            reason=f"{why}; requeued",
            token=rec.token,
            fault="infrastructure",
        )

    # -- the owner's loops -----------------------------------------------------------------------------------------
    async def owner_loop(self) -> None:
        await self.ctx.owner.run_facts()

    async def reconcile_loop(self) -> None:
        while True:
            await asyncio.sleep(self.ctx.settings.reconcile_interval_s)
            await self.reconcile()

    async def expire_loop(self) -> None:
        archived = 0  # jobs moved to the archive since the heap was last trimmed
        trimmed = time.monotonic()
        owner = self.ctx.owner
        while True:
            await asyncio.sleep(self.ctx.settings.expire_interval_s)
            archived += len(await owner.expire())
            quiet = not owner.index.pending or time.monotonic() - trimmed > TRIM_EVERY_S
            if archived >= TRIM_AFTER_ARCHIVED and quiet:
                trim_heap()  # a few ms: after the burst that made these jobs, or seldom during one
                archived, trimmed = 0, time.monotonic()

    async def follower_loop(self) -> None:
        """A follower's housekeeping: re-read the reservations (others' commits and releases) and drop finished
        jobs from its view after the same minimum age as the owner's hot view."""
        ctx = self.ctx
        while True:
            await asyncio.sleep(ctx.settings.reconcile_interval_s)
            if ctx.leading:
                continue
            await self.store_sync.sync_store()
            ctx.owner.index.expire_finished(time.time(), ctx.settings.min_job_age_s)  # dropped, not parsed


def cancelled_while_pending(rec: JobRecord) -> JobFinished:
    """The end of a job cancelled before it was placed."""
    return JobFinished(
        event_id=f"cancelled-{rec.job_id}", job_id=rec.job_id, state="CANCELLED", reason=rec.reason or "cancelled"
    )
