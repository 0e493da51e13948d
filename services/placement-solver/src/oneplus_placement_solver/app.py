"""placement-solver: owns job state, the queue order and every placement decision.

It is the one writer of job records (owner.py): other services report facts, which it folds in order. Its working
set is in memory: the live jobs (owner.index), per-node free capacity (LiveCapacity, fed by the topology bucket's
changes and its own reservations) and the queue config (fed by the queues bucket's changes). A cycle reads only
that memory, places pending gangs, commits each with one Lua script in Redis, records `job.placed` and sends the
launch commands. Capacity freed, a node back, a new or requeued job and a config change wake it.

Replicas run active-active: the one holding the owner lease (`solver_state` key `owner.lease`) folds facts, writes
job records, reacts (launch, settle, cancel, requeue), reconciles and expires; every replica, that one included,
places the pending jobs it wins by rendezvous hashing over the live replicas, commits each gang in Redis (the
atomic, fenced reservation) and reports `placed` as a fact for the owner to record. A follower keeps the same
working set by following the job stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import time
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from nats.errors import Error as NatsError
from nats.js.api import PubAck
from oneplus_bus.acks import wait_acks
from oneplus_bus.archive import JobArchive
from oneplus_bus.audit import ReservationAuditLog, last_audit_ts
from oneplus_bus.clusterview import QUEUES_KEY, explain_job, merge_reason
from oneplus_bus.heap import trim_heap
from oneplus_bus.informer import StreamTail, kv_list_and_watch
from oneplus_bus.lease import Lease, ReplicaSet
from oneplus_bus.service import OneplusService, OpsError
from oneplus_bus.settings import BusSettings
from oneplus_bus.streams import DUPLICATE_WINDOW_S
from oneplus_bus.telemetry import inject, job_span
from oneplus_contracts import (
    Allocation,
    CancelRanks,
    JobEvent,
    JobFinished,
    JobNodeFinished,
    JobPlaced,
    JobRecord,
    JobRequeued,
    NodeHeartbeat,
    NodeRecord,
    PreemptionRequest,
    subjects,
)
from oneplus_contracts.arrays import JobArray, array_state, task_job_id
from oneplus_contracts.jobindex import HOLDING_STATES
from oneplus_placement.live import LiveCapacity
from oneplus_placement.reports import NodeReports
from oneplus_placement.snapshot import ClusterState
from oneplus_queueing.advance import AdvanceBook
from oneplus_queueing.apply import evictions, record_evictions
from oneplus_queueing.config import QueueConfig, QueueConfigError, default_config, load_queue_config
from oneplus_queueing.cycle import schedule_cycle
from oneplus_queueing.dependencies import referenced_jobs
from oneplus_queueing.fairshare import UsageHistory
from oneplus_queueing.model import CycleCarry, CycleDecision, PendingJob, PendingReason, RunningJob, VictimChoice
from oneplus_queueing.report import queue_rows, queues_rows, split_records
from oneplus_queueing.shards import replica_for
from oneplus_reservations import Conflict, Reservation, ReservationStore
from prometheus_client import Counter
from redis.exceptions import RedisError

from .fence import StoreCheck, StoreFence
from .launch import launch_commands, silent_nodes
from .memory import SolverMemory
from .metrics import SolverMetrics
from .outcome import INFRA_RETRIES, NODE_LOST, attempt_end, attempt_outcome
from .owner import Applied, JobOwner, NotOwner
from .pacing import cycle_rest

log = logging.getLogger("oneplus.solver")

LOST_EXIT = 137
AUDIT_CATCH_UP_MARGIN_S = 30.0  # clocks of the solver hosts and of Redis may disagree by this much
STORE_REBUILD_LEASE_S = 60.0  # a rebuilt reservation lives this long unless its node renews it
OWNER_LEASE_KEY = subjects.SOLVER_OWNER_LEASE_KEY
REPLICA_PREFIX = "replica."
TRIM_AFTER_ARCHIVED = 1000  # jobs archived before the heap is trimmed (oneplus_bus.heap)
TRIM_EVERY_S = 300.0  # while jobs keep waiting, trim at most this often


@dataclass(frozen=True)
class SolverSettings:
    schedule_interval_s: float = 1.0  # a cycle at least this often (fair share accrues), sooner when woken
    reconcile_interval_s: float = 3.0
    lost_reservation_grace_s: float = 5.0
    relaunch_after_s: float = 10.0  # a node silent this long after its gang was placed gets its launch command again
    min_job_age_s: float = 300.0  # Slurm's MinJobAge: how long a finished job stays in the hot view
    expire_interval_s: float = 1.0  # small passes: a pass's burst of archive writes and purges delays commits
    preemption_request_every_s: float = 10.0
    nic_gbps_per_gpu: float = 400.0
    oversubscription: float = 1.0
    infra_retries: int = INFRA_RETRIES  # requeues after platform faults (node, executor, reservation lost) per job
    # This replica's name: stable across its restarts, so a restarted lone solver takes its own lease back at once.
    replica: str = field(default_factory=socket.gethostname)
    lease_ttl_s: float = 10.0  # a dead owner's lease is taken over this long after its last renewal
    beat_s: float = 1.0  # lease renewal and liveness beat
    # The share of the solver's time that back-to-back cycles may take (Slurm's sched_min_interval, made relative):
    # under a burst the owner still folds the facts that free capacity, and each cycle places what piled up.
    schedule_duty: float = 0.5

    @classmethod
    def from_env(cls) -> SolverSettings:
        retries = os.environ.get("ONEPLUS_INFRA_RETRIES", str(INFRA_RETRIES))
        if not retries.strip().isdigit():
            raise ValueError(f"ONEPLUS_INFRA_RETRIES={retries!r}: a whole number of retries (0 or more)")
        replica = os.environ.get("ONEPLUS_SOLVER_REPLICA", "").strip() or socket.gethostname()
        if not replica.replace("-", "").replace("_", "").isalnum():
            raise ValueError(f"ONEPLUS_SOLVER_REPLICA={replica!r}: letters, digits, '-' and '_' only (a KV key)")
        ttl = float(os.environ.get("ONEPLUS_SOLVER_LEASE_S", "10"))
        if not 2.0 <= ttl <= 300.0:
            raise ValueError(f"ONEPLUS_SOLVER_LEASE_S={ttl}: between 2 and 300 seconds")
        raw_duty = os.environ.get("ONEPLUS_SCHEDULE_DUTY", "0.5")
        try:
            duty = float(raw_duty)
        except ValueError:
            duty = -1.0
        if not 0.05 <= duty <= 1.0:
            raise ValueError(f"ONEPLUS_SCHEDULE_DUTY={raw_duty!r}: a share of the solver's time, between 0.05 and 1")
        return cls(
            replica=replica,
            lease_ttl_s=ttl,
            schedule_duty=duty,
            infra_retries=int(retries),
            min_job_age_s=float(os.environ.get("ONEPLUS_MIN_JOB_AGE_S", "300")),
            nic_gbps_per_gpu=float(os.environ.get("ONEPLUS_NIC_GBPS_PER_GPU", "400")),
            oversubscription=float(os.environ.get("ONEPLUS_OVERSUBSCRIPTION", "1.0")),
        )


class Solver:
    """The solver's state and behaviour, over its service's bus connection and a reservation store."""

    def __init__(self, svc: OneplusService, settings: SolverSettings, store: ReservationStore | None = None) -> None:
        self.svc = svc
        self.settings = settings
        self._store = store
        self.wake = asyncio.Event()
        # Held by a cycle, and by a job's end from its record to its release: a cycle sees one or the other, whole.
        self.transition = asyncio.Lock()
        self.capacity = LiveCapacity("live", settings.nic_gbps_per_gpu, settings.oversubscription)
        self.reports = NodeReports()  # what the nodes say runs on them (their heartbeats)
        self.config: QueueConfig = default_config()
        self.config_from_kv = False
        self.advance = AdvanceBook()  # advance reservations, from their bucket (oneplus_queueing.advance)
        self.decision: CycleDecision | None = None
        self.carry = CycleCarry()  # nominations and the protected job, from one cycle to the next
        # States of jobs that dependencies name and that have left the hot view (archived: they never change).
        self.archived_states: dict[str, str | None] = {}
        self.usage: UsageHistory | None = None
        self.usage_queues: tuple[str, ...] = ()
        self._owner: JobOwner | None = None
        self._memory: SolverMemory | None = None
        self._tails: list[StreamTail] = []
        self.cycles = 0
        self._fence: StoreFence | None = None
        self._audit: ReservationAuditLog | None = None
        self.store_ok = False  # False while the reservation store is being rebuilt: nothing is placed
        self.store_resets = 0
        self.resets_metric = Counter(
            "oneplus_reservation_store_resets",
            "Reservation stores found reset or rolled back, and rebuilt",
            registry=svc.metrics,
        )
        self.metrics = SolverMetrics(svc.metrics)
        self.leading = False  # holds the owner lease: folds facts, writes records, reacts, reconciles
        self.loops = True  # run the owner's loops on taking the lead (build_solver(loops=False): a test drives it)
        self._lease: Lease | None = None
        self._replicas: ReplicaSet | None = None
        self._owner_tasks: list[asyncio.Task[None]] = []
        self.members: tuple[str, ...] = (settings.replica,)

    # -- wiring ----------------------------------------------------------------------------------------------------
    @property
    def store(self) -> ReservationStore:
        assert self._store is not None, "solver not started"
        return self._store

    @property
    def owner(self) -> JobOwner:
        assert self._owner is not None, "solver not started"
        return self._owner

    @property
    def memory(self) -> SolverMemory:
        assert self._memory is not None, "solver not started"
        return self._memory

    async def start(self) -> None:
        svc = self.svc
        if self._store is None:
            self._store = ReservationStore.connect(svc.settings.redis, svc.settings.cluster)
        await self.store.load_scripts()
        self._memory = SolverMemory(svc.kv[subjects.SOLVER_STATE_KV])
        self.carry = await self.memory.load_carry()
        self._owner = JobOwner(
            svc.js,
            JobArchive(svc.js),
            min_age_s=self.settings.min_job_age_s,
            metrics=svc.metrics,
            state_kv=svc.kv[subjects.SOLVER_STATE_KV],
            nc=svc.nc,
            me=self.settings.replica,
        )
        self.owner.on_applied(self.react)
        self.owner.guard = self.guard_commit
        self.owner.on_deposed = self.deposed  # the server refused a write: a newer owner fenced the streams
        self.memory.fence = self.owner.fence
        state_kv = svc.kv[subjects.SOLVER_STATE_KV]
        ttl = self.settings.lease_ttl_s
        self._lease = Lease(state_kv, OWNER_LEASE_KEY, self.settings.replica, ttl_s=ttl)
        self._replicas = ReplicaSet(
            svc.js, state_kv, subjects.SOLVER_STATE_KV, self.settings.replica, prefix=REPLICA_PREFIX, ttl_s=ttl
        )
        await self._replicas.start()
        self.members = self._replicas.alive()
        self.leading = await self._lease.try_hold()
        if self.leading:
            await self.owner.bootstrap(self.lease.revision)
        else:
            log.info("solver %s follows: %s holds the owner lease", self.settings.replica, self._lease.holder)
            await self.owner.follow(self.on_followed)
        self.metrics.leading.set(int(self.leading))
        self.load_file_config()
        self._tails.append(await kv_list_and_watch(svc.js, subjects.TOPOLOGY_KV, self.on_node, "solver-topology"))
        self._tails.append(await kv_list_and_watch(svc.js, subjects.QUEUES_KV, self.on_queues, "solver-queues"))
        self._tails.append(
            await kv_list_and_watch(svc.js, subjects.ADVANCE_RESERVATIONS_KV, self.on_advance, "solver-advance")
        )
        self._audit = ReservationAuditLog(svc.js)
        self._fence = StoreFence(state_kv, self.store)
        await self.sync_store()
        await svc.nc.subscribe(subjects.node_lost("*"), cb=self._on_lost_msg)
        await svc.nc.subscribe(subjects.node_heartbeat("*"), cb=self._on_heartbeat_msg)
        await svc.nc.subscribe(subjects.ops_solver_reasons(self.settings.replica), cb=self._on_reasons_request)
        if self.leading:
            await self.catch_up_audit()
            await self.reconcile()
            self.start_owner_loops()
        self.wake.set()

    async def stop(self) -> None:
        for tail in self._tails:
            await tail.stop()
        if self._owner is not None:
            await self.owner.unfollow()
        if self._replicas is not None:
            await self._replicas.stop()
        if self._lease is not None:
            with contextlib.suppress(Exception):
                await self._lease.release()  # a clean stop hands the lead over without the ttl's wait
        if self._store is not None:
            await self._store.close()

    # -- replicas: the owner lease and the shards --------------------------------------------------------------------
    @property
    def lease(self) -> Lease:
        assert self._lease is not None, "solver not started"
        return self._lease

    async def guard_commit(self) -> None:
        """Before a job record is written: this replica must hold the owner lease now (renewed if it is getting old)."""
        if self.leading and self.lease.held:
            return
        if self.leading and await self.lease.try_hold():
            return
        raise NotOwner(f"solver {self.settings.replica} does not hold the owner lease (held by {self.lease.holder})")

    def mine(self, job_id: str) -> bool:
        """Whether this replica places `job_id` (rendezvous hashing over the live replicas)."""
        return len(self.members) == 1 or replica_for(job_id, self.members) == self.settings.replica

    def start_owner_loops(self) -> None:
        if not self.loops or self._owner_tasks:
            return
        self._owner_tasks = [self.svc.spawn(fn) for fn in (self.owner_loop, self.reconcile_loop, self.expire_loop)]

    async def stop_owner_loops(self) -> None:
        tasks, self._owner_tasks = self._owner_tasks, []
        for task in tasks:
            task.cancel()
        if tasks:
            # Bounded: the role loop must go on beating whatever a cancelled loop does on its way out.
            await asyncio.wait(tasks, timeout=5.0)

    async def role_loop(self) -> None:
        """Each beat: say this replica is alive, renew or try the owner lease, and take or give up the lead."""
        while True:
            await asyncio.sleep(self.settings.beat_s)
            await self.beat()

    async def beat(self) -> None:
        """One beat of `role_loop`."""
        assert self._replicas is not None
        try:
            await self._replicas.beat()
        except Exception as exc:
            log.warning("solver %s: liveness beat failed (%s)", self.settings.replica, exc)
        members = self._replicas.alive()
        if members != self.members:
            log.info("solver replicas now: %s", ", ".join(members))
            self.members = members
            self.wake.set()  # the shards moved: jobs may be this replica's now
        self.metrics.replicas.set(len(members))
        try:
            held = await self.lease.try_hold()
        except Exception as exc:
            # The bus is down: nothing can be written anyway, and the lease ages out on its own if this lasts.
            log.warning("solver %s: owner lease not renewed (%s)", self.settings.replica, exc)
            return
        if held and not self.leading:
            await self.take_lead()
        elif not held and self.lease.holder != self.settings.replica and (self.leading or not self.owner.following):
            # Another replica holds it now (a lost write of our own is retried next beat); or a lead this replica
            # failed to take left it neither owning nor following.
            await self.step_down()

    async def take_lead(self) -> None:
        """This replica now holds the owner lease: rebuild the working set as a restarted owner does, then own.
        Leading only once all of it is done: a step that fails (the bus mid-failover) is tried again next beat,
        rather than leave a lead that holds the lease and folds no fact."""
        log.warning("solver %s takes the lead (owner lease)", self.settings.replica)
        await self.owner.unfollow()
        self.leading = True  # the steps below act as the owner (sync_store rebuilds a reset store)
        self.metrics.leading.set(1)
        try:
            await self.owner.bootstrap(self.lease.revision)  # the lease's revision is the owner epoch
            self.carry = await self.memory.load_carry()
            self.usage = None  # the stored history, carried on from the last owner
            await self.sync_store()
            await self.catch_up_audit()
            await self.reconcile()
        except BaseException:
            self.leading = False
            self.metrics.leading.set(0)
            raise
        self.start_owner_loops()
        self.wake.set()

    def deposed(self) -> None:
        """The server refused a write of this owner: a newer one fenced the streams. Stop writing now, follow."""
        if self.leading:
            self.leading = False
            self.metrics.leading.set(0)
            self.svc.spawn(self.step_down)

    async def step_down(self) -> None:
        """Another replica holds the owner lease: stop writing and follow the job stream instead."""
        log.warning("solver %s gives up the lead: %s holds the owner lease", self.settings.replica, self.lease.holder)
        self.leading = False
        self.metrics.leading.set(0)
        await self.stop_owner_loops()
        await self.owner.follow(self.on_followed)

    async def on_followed(self, event: JobEvent, rec: JobRecord) -> None:
        """A follower's view of an event the owner published: capacity and wake-ups, as the owner's own reactions."""
        if rec.job_id in self.owner.index.holders and rec.allocation is not None and rec.token is not None:
            self.capacity.ensure_held(rec.job_id, rec.token, rec.allocation)
        elif event.type in ("finished", "requeued") and self.capacity.token_of(rec.job_id) is not None:
            # Redis releases just after the record: a cycle that tries these GPUs before that is refused and re-reads.
            self.capacity.release(rec.job_id)
        if event.type in ("accepted", "requeued", "finished"):
            self.wake.set()

    async def sync_store(self) -> None:
        """The owner checks (and if need be rebuilds) the reservation store; a follower only checks and re-reads it:
        rebuilding is the owner's, and a follower places nothing while the store is not intact."""
        if self.leading:
            async with self.transition:
                await self.guard_store(await self.fence.check())
            return
        check = await self.fence.check()
        self.store_ok = check.intact
        if check.intact:
            self.audit.epoch = self.fence.epoch
            async with self.transition:
                await self.sync_capacity()

    async def sync_capacity(self) -> None:
        """Make the capacity model hold exactly the store's reservations (one read of the live ones), and wake."""
        self.capacity.hold_exactly(self.holding(await self.store.all()))
        self.wake.set()

    def holding(self, reservations: Iterable[Reservation]) -> list[tuple[str, int, Allocation]]:
        """What the capacity model holds: the store's reservations, and every attempt whose job record still holds
        GPUs though its reservation is gone (its lease ran out: a node silent, or reports not folded yet). Those GPUs
        are offered only once the record ends (reconcile requeues it), never while the job stream says it holds them.
        """
        held = {r.job_id: (r.job_id, r.token, r.allocation) for r in reservations}
        for rec in self.owner.index.holders.values():
            if rec.job_id not in held and rec.allocation is not None and rec.token is not None:
                held[rec.job_id] = (rec.job_id, rec.token, rec.allocation)
        return list(held.values())

    async def record(self, *events: JobEvent) -> None:
        """Record decisions: the owner commits them; a follower reports them as facts for the owner to fold."""
        if self.leading:
            await self.owner.commit(*events)
            return
        for event in events:
            await self.svc.ledger.report(event)

    async def follower_loop(self) -> None:
        """A follower's housekeeping: re-read the reservations (others' commits and releases) and drop finished
        jobs from its view after the same minimum age as the owner's hot view."""
        while True:
            await asyncio.sleep(self.settings.reconcile_interval_s)
            if self.leading:
                continue
            await self.sync_store()
            self.owner.index.expire_finished(time.time(), self.settings.min_job_age_s)  # dropped, not parsed

    async def catch_up_audit(self) -> None:
        """A new owner writes the releases a dead one may not have delivered to the audit (see `catch_up_releases`).

        Those lie after the audit's newest entry (a lone solver's last) and at most a lease and a beat before
        this takeover; the store's history is read from the earlier of the two, with a margin for clock skew."""
        if not self.store_ok:
            return  # a rebuilt store's history starts at the rebuild: there is nothing of the old one to catch up
        try:
            now_ms = await self.store.time_ms()
            last = await last_audit_ts(self.svc.js)
            since_ms = now_ms - int((3 * self.settings.lease_ttl_s + AUDIT_CATCH_UP_MARGIN_S) * 1000)
            if last is not None:
                since_ms = min(since_ms, int((last - AUDIT_CATCH_UP_MARGIN_S) * 1000))
            history = await self.store.history(since_ms=max(since_ms, 1))
            n = await self.audit.catch_up_releases(history, self.fence.epoch)
        except (RedisError, NatsError, TimeoutError) as exc:
            log.warning("the reservation audit was not caught up from the store's history: %s", exc)
            return
        log.info("reservation audit caught up: %d release(s) of the store's history written again", n)

    @property
    def audit(self) -> ReservationAuditLog:
        assert self._audit is not None, "solver not started"
        return self._audit

    @property
    def fence(self) -> StoreFence:
        assert self._fence is not None, "solver not started"
        return self._fence

    # -- the reservation store's epoch -----------------------------------------------------------------------------
    async def guard_store(self, check: StoreCheck) -> None:
        """With the transition lock held: trust the store, set up a new one, or rebuild one that lost its state.

        The capacity model then holds exactly what the store holds."""
        if check.intact:
            self.store_ok = True
            self.audit.epoch = self.fence.epoch
        elif check.fresh and not self.owner.index.holders:
            self.fence.epoch = await self.fence.bump(0)
            await self.store.set_epoch(self.fence.epoch)
            self.audit.epoch = self.fence.epoch
            log.info("reservation store set up at epoch %d", self.fence.epoch)
            self.store_ok = True
        else:
            self.store_ok = False
            self.store_resets += 1
            log.error("%s; placing stops until the running jobs' reservations are rebuilt", check.describe())
            t0 = time.monotonic()
            out = await self.fence.rebuild(check, list(self.owner.index.holders.values()), STORE_REBUILD_LEASE_S)
            self.audit.epoch = out.epoch
            for job_id, token, alloc in out.restored:
                await self.audit.record("restore", job_id, token, alloc, reason=check.describe())
            await self.audit.flush()
            for job_id, why in out.refused.items():
                log.error("the reservation of %s could not be put back: %s", job_id, why)
            log.warning(
                "reservation store rebuilt at epoch %d in %.2f s: %d reservation(s) put back under their tokens",
                out.epoch,
                time.monotonic() - t0,
                len(out.restored),
            )
            self.resets_metric.inc()
            self.store_ok = True
        await self.sync_capacity()

    async def check_store(self) -> None:
        """Reconcile's and a refused commit's check: one GET of the marker (JetStream only when it disagrees)."""
        marker = await self.store.epoch()
        if marker is not None and marker >= self.fence.epoch:
            return
        await self.sync_store()

    # -- the working set's feeds -----------------------------------------------------------------------------------
    async def on_node(self, node: str, value: bytes | None) -> None:
        if value is None:
            self.capacity.remove_node(node)
            return
        if self.capacity.set_node(NodeRecord.model_validate_json(value)):
            self.wake.set()  # a node (back), uncordoned or healed: pending jobs may fit now

    async def on_queues(self, key: str, value: bytes | None) -> None:
        if key != QUEUES_KEY:
            return
        if value is None:
            self.config_from_kv = False
            self.load_file_config()
        else:
            try:
                self.config = load_queue_config(value.decode())
                self.config_from_kv = True
            except QueueConfigError as exc:
                log.error("the stored queue config is refused, keeping the previous one: %s", exc)
        self.wake.set()

    async def on_advance(self, key: str, value: bytes | None) -> None:
        problem = self.advance.apply(key, value)
        if problem:
            log.error("%s", problem)
        self.wake.set()

    def load_file_config(self) -> None:
        if self.config_from_kv:
            return
        path = os.environ.get("ONEPLUS_QUEUES_FILE")
        if path:
            with open(path, encoding="utf-8") as f:
                self.config = load_queue_config(f.read())
        else:
            self.config = default_config()

    async def _on_lost_msg(self, msg: Any) -> None:
        try:
            node = str(json.loads(msg.data)["node"])
        except (ValueError, KeyError, TypeError):
            return
        await self.node_lost(node)

    async def _on_heartbeat_msg(self, msg: Any) -> None:
        try:
            hb = NodeHeartbeat.model_validate_json(msg.data)
        except ValueError as exc:
            log.warning("unreadable heartbeat on %s: %s", msg.subject, exc)
            return
        self.reports.report(hb)

    def offered(self) -> ClusterState:
        """The cycle's copy of free capacity: without GPUs on which a node still reports ranks that hold nothing."""
        state = self.capacity.copy()
        for node, gpus in self.reports.lingering(self.capacity.held).items():
            state.block(node, gpus)
        return state

    async def node_lost(self, node: str) -> None:
        """The registry declared `node` lost: its ranks are over; the gangs that had ranks there are requeued."""
        self.reports.node_lost(node)
        if not self.leading:
            return
        events: list[JobEvent] = []
        for rec in list(self.owner.index.holders.values()):
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
            await self.owner.commit(*events)

    # -- reactions to committed events -----------------------------------------------------------------------------
    async def react(self, applied: Sequence[Applied]) -> None:
        """React to a commit's events, a kind at a time so that round trips overlap: every launch of the batch is
        sent before any acknowledgement is awaited, and every attempt that ended is recorded in one commit."""
        launches: dict[str, JobRecord] = {}
        cancels: list[JobRecord] = []
        ended: dict[str, JobRecord] = {}
        for a in applied:
            match a.event.type:
                case "accepted" | "requeued" | "finished":
                    self.wake.set()
                case "placed":
                    # Every placement is launched from its record: this replica's own and those others report.
                    rec = a.record
                    if rec.allocation is not None and rec.token is not None:
                        self.capacity.ensure_held(rec.job_id, rec.token, rec.allocation)
                        launches[rec.job_id] = rec
                case "node_finished":
                    ev = a.event
                    assert isinstance(ev, JobNodeFinished)
                    self.reports.rank_ended(ev.job_id, ev.token, ev.node, time.time(), reported_ts=ev.ts)
                    ended[ev.job_id] = a.record  # the latest: several nodes of one gang may end in one batch
                case "cancel_requested":
                    cancels.append(a.record)
        # One failed reaction (the store down during a settle, say) must not skip the others: reconcile comes back
        # for what it left undone.
        try:
            await wait_acks([f for rec in launches.values() for f in await self.launch_futures(rec)])
        except Exception:
            log.exception("launching %d placed gang(s) failed; reconcile resends them", len(launches))
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
        due: list[JobRecord] = []
        for rec in recs:
            if rec.terminal or rec.token is None:
                continue
            first = attempt_outcome(rec, self.settings.infra_retries)
            if first.action == "stop_others":
                for node in first.stop_nodes:
                    await self.send_cancel(rec, node, first.reason)
            elif first.action != "wait":
                due.append(rec)
        if not due:
            return
        # Record first: a crash before the release leaves a reservation of an ended job, which reconcile frees.
        # No cycle in between: it would see GPUs held by a job that holds none (and call a nomination stale).
        async with self.transition:
            events: list[JobEvent] = []
            releases: list[tuple[str, int | None, str]] = []
            for rec in due:
                # The record as it is now: two callers (a report, reconcile) may have come for the same attempt.
                current = self.owner.index.get(rec.job_id)
                if current is None or current.terminal or current.token != rec.token:
                    continue
                ending = attempt_end(current, attempt_outcome(current, self.settings.infra_retries))
                if ending is not None:
                    events.append(ending[0])
                    releases.append((current.job_id, current.token, ending[1]))
            if not events:
                return
            await self.owner.commit(*events)
            await self.release_many(releases)

    async def release(self, job_id: str, token: int | None, reason: str) -> None:
        await self.release_many([(job_id, token, reason)])

    async def release_many(self, releases: Sequence[tuple[str, int | None, str]]) -> None:
        """Free the GPUs of ended gangs, (job, token, reason) each, in one round trip to the store."""
        if not releases:
            return
        try:
            freed_all = await self.store.release_many(releases)
        except RedisError as exc:
            # The store is unreachable: the jobs have ended all the same. Their GPUs stay out of offers until
            # reconcile frees the reservations (or finds the store reset and rebuilds without them).
            log.warning("release of %s not confirmed by the reservation store (%s); reconcile frees them",
                        ", ".join(j for j, _, _ in releases), exc)  # fmt: skip
            for job_id, token, reason in releases:
                audited = token if token is not None else self.capacity.token_of(job_id)
                if audited is not None:
                    await self.audit.record("release", job_id, audited, reason=f"{reason} (store unreachable)")
            return
        for (job_id, token, reason), freed in zip(releases, freed_all, strict=True):
            # Audited whether or not the store still had it: a hold that ended across a store reset ends there too.
            audited = freed if freed is not None else token if token is not None else self.capacity.token_of(job_id)
            if audited is not None:
                await self.audit.record("release", job_id, int(audited), reason=reason, at=freed.at if freed else "")
            if token is None or self.capacity.token_of(job_id) == token:
                self.capacity.release(job_id)  # after Redis: a cycle never offers GPUs that Redis would refuse
        self.wake.set()

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
        await self.svc.js.publish(
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
                await self.owner.commit(*waiting)
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
            await self.owner.commit(cancelled_while_pending(rec))
            return
        if rec.allocation is None:
            return
        pending = [n for n in rec.allocation.nodes if n not in rec.nodes_done]
        if not pending:
            await self.settle(rec)
        for node in pending:
            await self.send_cancel(rec, node, rec.reason or "cancelled")

    # -- placing ---------------------------------------------------------------------------------------------------
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
        alloc = alloc if alloc is not None else rec.allocation
        token = token if token is not None else rec.token
        if alloc is None or token is None:
            return []
        futures = []
        records = self.capacity.records
        addresses = {n: a for n in alloc.nodes if n in records and (a := records[n].topology.address)}
        for cmd in launch_commands(rec, alloc, token, addresses):
            if nodes is not None and cmd.node not in nodes:
                continue
            headers = {"Nats-Msg-Id": cmd.command_id}
            if rec.traceparent:
                headers["traceparent"] = rec.traceparent
            inject(headers)
            futures.append(
                await self.svc.js.publish_async(
                    subjects.node_command(cmd.node, "launch"),
                    cmd.model_dump_json().encode(),
                    headers=headers,
                    stream=subjects.COMMANDS_STREAM,
                )
            )
        return futures

    async def usage_for(self, now: float) -> UsageHistory:
        """Fair-share usage: carried on from the stored history after a restart; a new queue tree starts a new one."""
        names = tuple(q.name for q in self.config.queues)
        if self.usage is None or self.usage_queues != names:
            stored = await self.memory.load_usage(names)
            usable = stored is not None and stored.as_of <= now
            self.usage = stored if usable and stored is not None else UsageHistory.for_config(self.config, now)
            self.usage_queues = names
        return self.usage

    def running(self) -> list[RunningJob]:
        """Holders whose reservation the working set holds under the same token."""
        held = self.capacity.held
        return [
            RunningJob.from_record(r)
            for r in self.owner.index.holders.values()
            if r.allocation is not None and held.get(r.job_id, (None,))[0] == r.token
        ]

    async def schedule_once(self) -> int:
        """One scheduling cycle over the working set; returns how many gangs were committed."""
        if not self.store_ok:
            await self.check_store()
        async with self.transition:
            if not self.store_ok:
                return 0
            t0 = time.perf_counter()
            try:
                return await self._cycle()
            finally:
                self.metrics.cycle.observe(time.perf_counter() - t0)

    async def _cycle(self) -> int:
        self.cycles += 1
        now = time.time()
        index = self.owner.index
        usage = await self.usage_for(now)
        running = self.running()
        # Fair share accrues whether or not anyone waits: charge every cycle.
        usage.charge(now, running)
        if self.leading:  # the owner keeps the stored history; a follower's copy only orders its own shard
            await self.memory.save_usage(usage, self.usage_queues)
        if self.capacity.records:
            self.metrics.capacity(self.capacity.state())  # at most once a second
        pending_recs = {
            k: r
            for k, r in index.pending.items()
            if not r.cancel_requested and k not in self.capacity.held and self.mine(k)
        }
        if not pending_recs:
            self.decision = None
            self.metrics.pending_jobs((), None)
            return 0
        offered = self.offered()
        job_states = await self.dependency_states(pending_recs.values())
        decision = schedule_cycle(
            now,
            offered,
            [PendingJob.from_record(r) for r in pending_recs.values()],
            running,
            self.config,
            usage,
            carry=self.carry,
            job_states=job_states,
            reservations=self.advance.all,
            # Replicas break ties among equally good nodes in different orders, so they collide less in Redis.
            seed=self.members.index(self.settings.replica) if len(self.members) > 1 else 0,
        )
        self.decision = decision
        self.metrics.pending_jobs(pending_recs.values(), decision)
        self.carry = decision.carry
        if self.leading:
            await self.memory.save_carry(self.carry)
        placed: list[tuple[JobRecord, Allocation, int]] = []
        stale = False  # a commit was refused: the capacity model missed another replica's reservation
        # Every gang of the decision in one round trip to the store; each is taken or refused on its own.
        reserved = await self.store.reserve_many(list(decision.placements.items()))
        for (job_id, alloc), res in zip(decision.placements.items(), reserved, strict=False):
            rec = pending_recs[job_id]
            with job_span(self.svc.tracer, "placement-solver place", rec.traceparent, {"oneplus.job_id": job_id}) as sp:
                if isinstance(res, Conflict) and res.store_reset:
                    # The store lost its state: nothing more is placed until reconcile rebuilds it (and frees any
                    # later gang of this batch that a store rebuilt meanwhile took: no record names it).
                    sp.set_attribute("oneplus.placed", False)
                    self.metrics.conflicts.labels("store_reset").inc()
                    log.error("reservation of %s refused: %s", job_id, res.reason)
                    self.store_ok = False
                    break
                if isinstance(res, Conflict) and res.not_replicated:
                    # No Redis replica acknowledged the commit (it was released again): placing waits for the replicas.
                    sp.set_attribute("oneplus.placed", False)
                    self.metrics.conflicts.labels("not_replicated").inc()
                    log.warning("reservation of %s refused: %s", job_id, res.reason)
                    break
                if isinstance(res, Conflict):
                    # Another replica took part of it since our snapshot: the next cycle decides on a fresh one.
                    sp.set_attribute("oneplus.placed", False)
                    self.metrics.conflicts.labels("taken").inc()
                    log.info("reservation of %s refused: %s", job_id, res.reason)
                    stale = True
                    continue
                token = int(res)
                sp.set_attribute("oneplus.placed", True)
                sp.set_attribute("oneplus.token", token)
                sp.set_attribute("oneplus.domain", alloc.domain)
                self.capacity.hold(job_id, token, alloc)
                self.metrics.placed_gang(rec, alloc, offered.layout, now)
                await self.audit.record("reserve", job_id, token, alloc, at=res.at)
                placed.append((rec, alloc, token))
        await self.commit_placed(placed)
        await self.audit.flush()
        if stale:
            await self.sync_capacity()  # and wakes the next cycle
        for choice in decision.preemptions:
            rec = pending_recs[choice.preemptor]
            with job_span(self.svc.tracer, "placement-solver preempt", rec.traceparent, {"oneplus.job_id": rec.job_id}):
                await self.request_preemption(rec, choice)
        record_evictions(usage, now, evictions(decision, {r.job_id: r for r in running}))
        if decision.preemptions and self.leading:
            await self.memory.save_usage(usage, self.usage_queues, force=True)  # the rate limit must survive a crash
        await self.end_unsatisfiable(decision)
        return len(placed)

    async def dependency_states(self, pending: Iterable[JobRecord]) -> dict[str, str]:
        """The states of the jobs that pending jobs' dependencies name: the hot view first, then the archive.

        Archived records are final, so each is read once (None: no such job) and kept; a failed read counts as
        not known yet (the dependent job waits a cycle), never as no job.
        """
        wanted = referenced_jobs(r.spec for r in pending if r.spec.dependencies)
        if not wanted:
            return {}
        index = self.owner.index
        out: dict[str, str] = {}
        for job_id in wanted:
            rec = index.get(job_id)
            if rec is not None:
                out[job_id] = rec.state
                continue
            if job_id in index.arrays:  # an array's id: all of its tasks (Slurm's afterok:123)
                states = await self.array_task_states(job_id)
                out[job_id] = array_state(states) or "ACCEPTED"
                continue
            if job_id not in self.archived_states:
                try:
                    got = await self.owner.archive.get(job_id)
                except Exception as exc:  # the archive unreachable: the dependent job waits
                    log.warning("dependency %s: archive lookup failed (%s); its dependents wait", job_id, exc)
                    out[job_id] = "ACCEPTED"
                    continue
                if len(self.archived_states) > 100_000:
                    self.archived_states.clear()
                self.archived_states[job_id] = got.state if got is not None else None
            state = self.archived_states[job_id]
            if state is not None:
                out[job_id] = state
        return out

    async def array_task_states(self, array_id: str) -> list[str]:
        """The state of every task of an array: those in the working set, the others (archived) from the archive,
        each read once (final)."""
        index = self.owner.index
        held = index.task_states(array_id)
        some = next(iter(held))
        rec = index.jobs.get(some) or index.get(some)
        task = rec.spec.array_task if rec is not None else None
        states = list(held.values())
        if task is None:
            return states
        for task_id in JobArray(indices=task.indices).task_ids:
            job_id = task_job_id(array_id, task_id)
            if job_id in held:
                continue
            if job_id not in self.archived_states:
                try:
                    got = await self.owner.archive.get(job_id)
                except Exception as exc:  # unreachable: the array counts as not done yet
                    log.warning("dependency %s: archive lookup of %s failed (%s)", array_id, job_id, exc)
                    states.append("ACCEPTED")
                    continue
                self.archived_states[job_id] = got.state if got is not None else None
            state = self.archived_states[job_id]
            if state is not None:
                states.append(state)
        return states

    async def end_unsatisfiable(self, decision: CycleDecision) -> None:
        """Slurm's DependencyNeverSatisfied (with kill_invalid_depend): the job is cancelled with that reason."""
        for job_id, why in decision.unsatisfiable.items():
            rec = self.owner.index.get(job_id)
            if rec is None or rec.state != "ACCEPTED":
                continue
            await self.record(
                JobFinished(
                    event_id=f"dependency-never-{job_id}",
                    job_id=job_id,
                    state="CANCELLED",
                    reason=f"DependencyNeverSatisfied: {why}",
                )
            )

    async def commit_placed(self, placed: Sequence[tuple[JobRecord, Allocation, int]]) -> None:
        """Record `placed` for every gang of the cycle in one commit; the reaction to each sends its launch commands.
        A follower reports them to the owner, whose reaction launches them."""
        if not placed:
            return
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
        if not self.leading:
            # Refused by the owner if the job moved on meanwhile (cancelled): its reconcile frees the reservation.
            await self.record(*events)
            return
        records = await self.owner.commit(*events)
        for (rec, alloc, token), new in zip(placed, records, strict=True):
            if new is not None:
                continue  # launched by the reaction to its record
            current = self.owner.index.get(rec.job_id)
            if current is None or current.token != token:
                continue  # cancelled between the decision and the commit: reconcile frees the reservation
            await self.send_launches(current, alloc, token)  # recorded before (a replayed commit): launch again

    async def request_preemption(self, rec: JobRecord, choice: VictimChoice) -> None:
        window = int(time.time() // self.settings.preemption_request_every_s)
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
        await self.svc.js.publish(
            subjects.PREEMPTION_REQUEST,
            req.model_dump_json().encode(),
            headers=headers,
            stream=subjects.COMMANDS_STREAM,
        )

    async def owner_loop(self) -> None:
        await self.owner.run_facts()

    async def scheduler_loop(self) -> None:
        not_before = 0.0
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), timeout=self.settings.schedule_interval_s)
            if (rest := not_before - time.monotonic()) > 0:
                await asyncio.sleep(rest)  # wake-ups during the rest are served by one cycle
            self.wake.clear()
            t0 = time.monotonic()
            await self.schedule_once()
            end = time.monotonic()
            not_before = end + cycle_rest(end - t0, self.settings.schedule_duty)

    # -- reconcile -------------------------------------------------------------------------------------------------
    async def reconcile(self) -> None:
        """Make the job records and the reservations agree after any crash (ours or another replica's).

        Reads the live reservations only (a cost that follows the holders) and the working set.
        """
        now = time.time()
        s = self.settings
        index = self.owner.index
        await self.check_store()
        async with self.transition:
            # Not beside a cycle: a gang it reserves after this read would look like a lease that ran out.
            reservations = {r.job_id: r for r in await self.store.all()}
            marker = await self.store.epoch()
            if marker is None or marker < self.fence.epoch:
                # Reset between the check and the read: what was read is not the truth; rebuild first.
                await self.guard_store(await self.fence.check())
                return
            # A holder missing from the store (its lease ran out) keeps its GPUs until its record ends, below.
            self.capacity.hold_exactly(self.holding(reservations.values()))
        for job_id, res in reservations.items():
            rec = index.get(job_id)
            if rec is None:
                if now - res.ts_ms / 1000 > s.lost_reservation_grace_s:
                    await self.release(job_id, res.token, "orphan: no live job")
            elif rec.state == "ACCEPTED" and rec.ended_token is not None and res.token <= rec.ended_token:
                # The store lost the release of an attempt that was requeued (unreachable then): not a placement
                # that was never recorded. Recording it as placed would repeat the old `placed` event's id.
                await self.release(job_id, res.token, "attempt already ended (requeued)")
            elif rec.state == "ACCEPTED" and not rec.cancel_requested:
                if len(self.members) > 1 and now - res.ts_ms / 1000 < s.lost_reservation_grace_s:
                    continue  # maybe another replica's fresh commit: its `placed` fact is on the way
                if not await self.store.replicated():  # never recorded placed on a write a failover could lose
                    continue
                await self.commit_placed([(rec, res.allocation, res.token)])
            elif rec.terminal or (rec.state == "ACCEPTED" and rec.cancel_requested):
                await self.release(job_id, res.token, f"job already {rec.state}")
            elif silent := silent_nodes(
                rec, res.token, now, s.relaunch_after_s, DUPLICATE_WINDOW_S - s.relaunch_after_s
            ):
                # A solver that died between the launch commands of one gang left some nodes without theirs.
                log.warning(
                    "resending the launch of %s to %s: no report since it was placed", job_id, ", ".join(silent)
                )
                await self.send_launches(rec, res.allocation, res.token, silent)
        # A record may still lag its nodes while facts a dead owner fetched are on their way back: a gang that ended
        # then has stopped renewing its lease, and its record would read as a lost reservation and be requeued.
        facts_in = self.owner.facts_caught_up(now)
        for rec in list(index.holders.values()):
            if rec.job_id not in reservations and now - rec.updated_ts > s.lost_reservation_grace_s and facts_in:
                why = "reservation lease expired: no node renewed it (node or executor lost?)"
                event: JobEvent = JobRequeued(
                    event_id=f"lost-{rec.job_id}-{rec.token}",
                    job_id=rec.job_id,
                    reason=f"{why}; requeued",
                    token=rec.token,
                    fault="infrastructure",
                )
                if rec.infra_requeues >= s.infra_retries:
                    event = JobFinished(
                        event_id=f"lost-{rec.job_id}-{rec.token}",
                        job_id=rec.job_id,
                        state="FAILED",
                        reason=f"{why}; not requeued: its {s.infra_retries} retries are spent",
                        token=rec.token,
                    )
                await self.owner.commit(event)
                # Ends the hold in the audit (the store forgot it when the lease ran out) and frees the GPUs in the
                # capacity model, which kept them while the record held them.
                await self.release(rec.job_id, rec.token, why)
            elif rec.state in HOLDING_STATES and rec.allocation and set(rec.nodes_done) >= set(rec.allocation.nodes):
                await self.settle(rec)
        for rec in list(index.pending.values()):
            # A cancel whose reaction was lost (a failed batch, a crash before it ran) still ends its pending job.
            if rec.cancel_requested and rec.job_id not in reservations and rec.job_id not in self.capacity.held:
                await self.cancel(rec)

    async def reconcile_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.reconcile_interval_s)
            await self.reconcile()
            await self.audit.flush()  # the releases of jobs that ended since the last cycle

    async def expire_loop(self) -> None:
        archived = 0  # jobs moved to the archive since the heap was last trimmed
        trimmed = time.monotonic()
        while True:
            await asyncio.sleep(self.settings.expire_interval_s)
            archived += len(await self.owner.expire())
            quiet = not self.owner.index.pending or time.monotonic() - trimmed > TRIM_EVERY_S
            if archived >= TRIM_AFTER_ARCHIVED and quiet:
                trim_heap()  # a few ms: after the burst that made these jobs, or seldom during one
                archived, trimmed = 0, time.monotonic()

    # -- ops -------------------------------------------------------------------------------------------------------
    def own_reasons(self, job_ids: Iterable[str]) -> tuple[dict[str, PendingReason], list[str]]:
        """This replica's last cycle on `job_ids`: their reasons, and their serving order."""
        d = self.decision
        if d is None:
            return {}, []
        wanted = set(job_ids)
        return {j: r for j, r in d.reasons.items() if j in wanted}, [j for j in d.order if j in wanted]

    async def _on_reasons_request(self, msg: Any) -> None:
        try:
            job_ids = [str(j) for j in json.loads(msg.data or b"{}").get("job_ids", [])]
        except (ValueError, AttributeError, TypeError):
            job_ids = []
        reasons, order = self.own_reasons(job_ids)
        body = {"reasons": {j: [r.code, r.message] for j, r in reasons.items()}, "order": order}
        with contextlib.suppress(Exception):
            await msg.respond(json.dumps(body).encode())

    async def reasons_for(self, job_ids: Iterable[str]) -> tuple[dict[str, PendingReason], list[str]]:
        """Why `job_ids` wait and in what order, each from the replica whose shard it is in (its last cycle); a
        replica that does not answer within a second leaves its jobs without a reason."""
        ids = list(job_ids)
        if len(self.members) == 1:
            return self.own_reasons(ids)
        shards: dict[str, list[str]] = {}
        for job_id in ids:
            shards.setdefault(replica_for(job_id, self.members), []).append(job_id)
        reasons, order = self.own_reasons(shards.pop(self.settings.replica, []))
        for replica, wanted in sorted(shards.items()):
            try:
                reply = await self.svc.nc.request(
                    subjects.ops_solver_reasons(replica), json.dumps({"job_ids": wanted}).encode(), timeout=1.0
                )
                got = json.loads(reply.data)
                for job_id, (code, message) in got.get("reasons", {}).items():
                    reasons[job_id] = PendingReason(job_id, code, message)
                order += [str(j) for j in got.get("order", [])]
            except Exception as exc:
                log.info("solver replica %s did not say why its %d job(s) wait: %s", replica, len(wanted), exc)
        return reasons, order

    async def explain(self, payload: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
        job_id = str(payload.get("job_id") or "")
        rec = self.owner.index.get(job_id) or await self.owner.archive.get(job_id)
        if rec is None:
            raise OpsError(f"no job {job_id!r}", 404)
        team = payload.get("team")
        if team and rec.spec.team != team:
            raise OpsError(f"no job {job_id!r} in team {team!r}", 404)
        if rec.state != "ACCEPTED":
            return {
                "job_id": job_id,
                "state": rec.state,
                "pending": False,
                "message": f"job is {rec.state}, not pending",
            }
        jobs = [*self.owner.index.pending.values(), *self.owner.index.holders.values()]
        out: dict[str, Any] = {
            "job_id": job_id,
            "state": rec.state,
            "pending": True,
            **explain_job(self.capacity.copy(), rec, jobs, mix_gpu_models=rec.spec.queue in self.config.mixing_queues),
        }
        why = (await self.reasons_for([job_id]))[0].get(job_id)
        if why is not None:
            out["reason"] = why.code
            out["message"] = merge_reason(why.code, why.message, out["message"])
        return out

    async def queue_list(self, payload: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
        """squeue-like rows (holders by start time, then pending jobs in serving order with their reason), paged."""
        team = payload.get("team")
        limit, offset = _page_args(payload)
        index = self.owner.index
        live = [*index.holders.values(), *index.pending.values()]
        records = [r for r in live if team is None or r.spec.team == team]
        reasons, order = await self.reasons_for(r.job_id for r in records if r.state == "ACCEPTED")
        rows = queue_rows(time.time(), records, reasons, order)
        keys = ("job_id", "queue", "name", "user", "st", "time", "gpus", "where")
        page = rows[offset : offset + limit]
        out = [{**dict(zip(keys, r.cells(), strict=True)), "reason": r.reason, "message": r.message} for r in page]
        nxt = str(offset + limit) if offset + limit < len(rows) else None
        return {"rows": out, "next": nxt}

    async def queues_list(self, payload: dict[str, Any], headers: dict[str, str]) -> list[dict[str, Any]]:
        """Per queue: guarantee, limit, used, borrowed, pending and the fair-share factor."""
        now = time.time()
        index = self.owner.index
        live = [r for r in [*index.holders.values(), *index.pending.values()] if not r.cancel_requested]
        pending, running = split_records(live)
        usage = await self.usage_for(now)
        return [row.to_dict() for row in queues_rows(now, self.config, pending, running, usage)]


def cancelled_while_pending(rec: JobRecord) -> JobFinished:
    """The end of a job cancelled before it was placed."""
    return JobFinished(
        event_id=f"cancelled-{rec.job_id}", job_id=rec.job_id, state="CANCELLED", reason=rec.reason or "cancelled"
    )


QUEUE_PAGE_DEFAULT = 500
QUEUE_PAGE_MAX = 2000


def _page_args(payload: dict[str, Any]) -> tuple[int, int]:
    try:
        raw_limit, raw_cursor = payload.get("limit"), payload.get("cursor")
        limit = QUEUE_PAGE_DEFAULT if raw_limit is None else int(raw_limit)
        offset = 0 if raw_cursor in (None, "") else int(raw_cursor)
    except (TypeError, ValueError) as exc:
        raise OpsError(f"'limit' and 'cursor' must be whole numbers: {exc}") from exc
    if not 1 <= limit <= QUEUE_PAGE_MAX:
        raise OpsError(f"'limit' must be between 1 and {QUEUE_PAGE_MAX}, not {limit}")
    if offset < 0:
        raise OpsError(f"'cursor' must not be negative, not {offset}")
    return limit, offset


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
    solver.loops = loops
    svc.on_start(solver.start)
    svc.on_stop(solver.stop)
    if loops:
        # The owner's loops (facts, reconcile, expiry) start and stop with the owner lease.
        svc.background(solver.scheduler_loop)
        svc.background(solver.role_loop)
        svc.background(solver.follower_loop)
    svc.ops("job-explain", subjects.OPS_JOB_EXPLAIN)(solver.explain)
    svc.ops("queue-list", subjects.OPS_QUEUE_LIST)(solver.queue_list)
    svc.ops("queues-list", f"{subjects.PREFIX}.ops.queues.list")(solver.queues_list)
    return svc, solver


def main() -> None:
    svc, _ = build_solver()
    svc.run()
