"""One scheduling cycle: order, quotas, placement, head-of-line protection, backfill and preemption wishes.

`schedule_cycle` is a function of its inputs: it works on a private copy of the cluster state and only reads the
usage history. The placement-solver service commits what it returns; the simulator applies it to its model.

Per pending job, in serving order (each queue's jobs in its strategy's order: strategies.py):
0. a job of a strict-fifo queue whose earlier job waits → `Priority`: it waits too;
1. quota: over its queue's limit → `QuotaExceeded` (unless evicting its own queue's lower-priority jobs makes room);
2. placement on the working state (a failed shape is remembered until the state changes, a count check first);
3. if it cannot be placed: claim GPUs already being freed by in-flight preemptions, else choose victims (whole
   gangs, least lost work, verified by placement) and nominate their GPUs for it;
4. the first job that still waits is the head: its future block (domain + start, from time limits) is reserved and
   the block's free GPUs are held; later jobs may use them only if they end before the start or are preemptible.
An elastic job (elastic.py) is placed at the largest size from its `ranks` down to its min_ranks that fits, shrinks
rather than goes when it is chosen as a victim, and after every pending job is served grows into GPUs nobody of a
higher priority waits for.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from oneplus_contracts import Allocation, JobSpec
from oneplus_contracts.advance import AdvanceReservation
from oneplus_placement.capacity import CapacityIndexes
from oneplus_placement.greedy import PlacementResult
from oneplus_placement.snapshot import AllocationConflict, ClusterSnapshot, ClusterState

from .advance import steer
from .arrays import count_task, hold_throttled, tasks_running, throttle_message
from .backfill import may_use_block, reserve_block
from .batching import BatchPlan, plan_batches
from .begin import hold_until_begin
from .boards import BoardClaim, weigh_boards
from .capacity import Capacity, whole_gpus, working_copy
from .config import QueueConfig
from .dependencies import check_dependencies, singleton_key
from .elastic import (
    GROW_MIN_REMAINING_GRACES,
    MAX_GROWS_PER_CYCLE,
    may_grow,
    resize_pays_from,
    sized,
    smaller_sizes,
)
from .explain import classify_failure, count_message, fmt_ts, shape_key
from .fairshare import UsageHistory, fairshare_factors
from .model import (
    CycleCarry,
    CycleDecision,
    CycleStats,
    PendingJob,
    PendingReason,
    ReasonCode,
    Reservation,
    RunningJob,
    VictimChoice,
)
from .ordering import RankedJob, keep_protected_first, rank_pending
from .quota import QuotaLedger, held_by_queue
from .strategies import serving_order, strategy_of
from .victims import VictimPool, rate_budget, search_victims

_WAITS_FOR_GPUS: frozenset[ReasonCode] = frozenset({"Resources", "Topology", "Priority"})


def schedule_cycle(
    now: float,
    cluster_state: ClusterState | ClusterSnapshot,
    pending: Sequence[PendingJob],
    running: Sequence[RunningJob],
    config: QueueConfig,
    usage: UsageHistory,
    seed: int = 0,
    carry: CycleCarry | None = None,
    job_states: Mapping[str, str] | None = None,
    reservations: Sequence[AdvanceReservation] = (),
    in_flight: Mapping[str, int] | None = None,
    indexes: CapacityIndexes | None = None,
) -> CycleDecision:
    """Decide this cycle's placements, pending reasons, protected reservation and preemption wishes.

    `cluster_state` must hold the allocation of every job in `running` (and nothing of `pending`); it is not changed.
    `carry` is the previous decision's `carry`: a preemptor gets exactly the GPUs nominated for it once its victims
    are gone (until then nobody else gets the ones already free), and the job protected last cycle keeps its place
    ahead of every job of its priority or lower until it starts.
    `job_states`: the states of the jobs that pending jobs' dependencies name (pending and running ones are known
    from the lists); a job id found nowhere is no job, and a dependency on it can never be satisfied.
    `reservations`: the advance reservations (`oneplus_queueing.advance`): jobs are kept to the nodes they leave them.
    `in_flight`: array id → its tasks that earlier cycles placed and whose placement is not recorded yet (the live
    solver binds while the next cycle decides): they count against the array's `%N` like running ones.
    `indexes`: the per-node capacities of the last cycle, recounted where the nodes changed since (new ones if None).
    """
    t0 = time.perf_counter()
    stats = CycleStats()
    decision = CycleDecision(now=now, stats=stats)
    factors = fairshare_factors(config, usage.usage_at(now))
    pending = hold_until_begin(now, pending, decision.reasons)  # --begin in the future: not considered yet
    pending = steer(now, pending, reservations, config.backfill.default_time_limit_s, decision.reasons)
    pending = _dependencies_met(pending, running, job_states or {}, decision)
    array_running = tasks_running(running, in_flight)
    pending = hold_throttled(pending, array_running, decision.reasons)  # an array's tasks past its %N are not ranked
    carry = carry or CycleCarry()
    ranked, invalid = rank_pending(now, pending, config, factors)
    ranked = keep_protected_first(serving_order(ranked, config), carry.protected)
    decision.reasons.update(invalid)
    decision.order = [r.job_id for r in ranked]
    decision.scores = {r.job_id: r.score for r in ranked}
    cycle = _Cycle(
        now=now,
        capacity=Capacity.for_config(
            working_copy(cluster_state),
            stats,
            config,
            [*(p.spec for p in pending), *(r.spec for r in running)],
            indexes,
        ),
        config=config,
        ledger=QuotaLedger(config, held_by_queue(running, config)),
        running=list(running),
        budget=rate_budget(now, config, usage),
        seed=seed,
        decision=decision,
        busy={singleton_key(r.spec) for r in running},
        array_running=array_running,
    )
    cycle.keep_resizing(carry.nominations)
    served = cycle.honour_nominations(ranked, carry.nominations)
    cycle.plans = plan_batches(now, ranked, served, cycle.capacity.state, config, seed)
    stats.batch_solves = len(cycle.plans)
    for position, job in enumerate(ranked):
        if job.job_id not in served:
            cycle.serve(job, position)
        cycle.note_waiting(job)
    cycle.grow_elastic(ranked)
    stats.wall_s = time.perf_counter() - t0
    return decision


@dataclass
class _Cycle:
    now: float
    capacity: Capacity
    config: QueueConfig
    ledger: QuotaLedger
    running: list[RunningJob]
    budget: int
    seed: int
    decision: CycleDecision
    placed: list[RunningJob] = field(default_factory=list)
    hold: Allocation | None = None  # free GPUs of the head's block; backfill may use them under the rules
    head: RankedJob | None = None
    examined_after_head: int = 0
    searches: int = 0
    taken: set[str] = field(default_factory=set)  # victims (new or in flight) already promised to someone
    failed: dict[tuple[object, ...], tuple[int, ReasonCode, str]] = field(default_factory=dict)
    no_victims: dict[tuple[object, ...], int] = field(default_factory=dict)  # search key → state version
    busy: set[tuple[str, str]] = field(default_factory=set)  # (name, user) of jobs holding or given GPUs
    array_running: dict[str, int] = field(default_factory=dict)  # array id → its tasks holding or given GPUs
    board_waits: set[str] = field(default_factory=set)  # jobs that wait for a strong board rather than run slower
    board_claims: list[BoardClaim] = field(default_factory=list)  # where and when those jobs expect to run
    held_back_by: dict[str, str] = field(default_factory=dict)  # queue that holds back → its first job that waits
    plans: dict[str, BatchPlan] = field(default_factory=dict)  # cp-sat queues' joint answers (batching.py)
    grown: int = 0  # elastic jobs grown this cycle
    _pool: VictimPool | None = None
    _vacating: list[RunningJob] | None = None
    _growable: list[tuple[int, RunningJob]] | None = None

    @property
    def pool(self) -> VictimPool:
        """Built on first need: most cycles place what fits and evict no one."""
        if self._pool is None:
            self._pool = VictimPool(self.running, self.config)
        return self._pool

    @property
    def vacating(self) -> list[RunningJob]:
        if self._vacating is None:
            self._vacating = [r for r in self.running if r.preempting]
        return self._vacating

    @property
    def reservation(self) -> Reservation | None:
        return self.decision.reservation

    def reason(self, job: RankedJob, code: ReasonCode, message: str) -> None:
        self.decision.reasons[job.job_id] = PendingReason(job.job_id, code, message)

    # -- the steps --------------------------------------------------------------------------------------------

    def honour_nominations(self, ranked: Sequence[RankedJob], nominations: Mapping[str, Allocation]) -> set[str]:
        """Preemptors of earlier cycles: placed on their nominated GPUs once free, else those free are held."""
        if not nominations:
            return set()
        vacating = {(n, g): r for r in self.vacating for n, g in _gpus_of(r.allocation)}
        served: set[str] = set()
        for job in ranked:
            alloc = nominations.get(job.job_id)
            if alloc is None:
                continue
            job = _at_size(job, len(alloc.ranks))  # an elastic job comes back at the size nominated for it
            if self.ledger.blocking_queue(job.job.queue, job.gpus) is not None:
                continue
            try:
                self.capacity.apply(alloc)
            except AllocationConflict:
                free = self.capacity.free_part(alloc, job.job_id)
                free_gpus = set(_gpus_of(free)) if free else set()
                busy = [gpu for gpu in _gpus_of(alloc) if gpu not in free_gpus]
                if not busy or not all(gpu in vacating for gpu in busy):
                    continue  # held by someone not being evicted, or short of CPU or memory: the nomination is stale
                waiting = {vacating[gpu].job_id: vacating[gpu] for gpu in busy}
                self.nominate(job, alloc, list(waiting.values()))
                names = ", ".join(sorted(waiting))
                self.reason(job, "Preempting", f"waiting for {names} to checkpoint and stop; their GPUs are nominated")
            else:
                self.record_placement(job, alloc)
            served.add(job.job_id)
        return served

    def note_waiting(self, job: RankedJob) -> None:
        """After serving `job`: the first job of a strict-fifo queue that did not start holds back the rest."""
        queue = job.job.queue
        if job.job_id in self.decision.placements or queue in self.held_back_by:
            return
        if strategy_of(self.config, queue).holds_back:
            self.held_back_by[queue] = job.job_id

    def serve(self, job: RankedJob, position: int) -> None:
        spec = job.job.spec
        first = self.held_back_by.get(job.job.queue)
        if first is not None:
            strategy = strategy_of(self.config, job.job.queue).name
            self.reason(job, "Priority", f"queue {job.job.queue} is {strategy}: it waits behind {first}")
            return
        if spec.singleton and singleton_key(spec) in self.busy:
            self.reason(job, "Dependency", f"singleton: a job named {spec.name} of {spec.user} holds GPUs")
            return
        limit = throttle_message(spec.array_task, self.array_running)
        if limit is not None:
            self.reason(job, "JobArrayTaskLimit", limit)
            return
        if self.head is not None:
            self.examined_after_head += 1
            if self.examined_after_head > self.config.backfill.scan_limit:
                self.reason(
                    job,
                    "Priority",
                    f"{position} jobs are ahead of it; backfill looks at the first "
                    f"{self.config.backfill.scan_limit} behind the protected job {self.head.job_id}",
                )
                return
        sizes = [job, *(_at_size(job, k) for k in smaller_sizes(spec))]  # an elastic job: its maximum down to its min
        sizes = [j for j in sizes if self.ledger.blocking_queue(j.job.queue, j.gpus) is None] or sizes[-1:]
        job = sizes[0]
        if self.ledger.blocking_queue(job.job.queue, job.gpus) is not None:
            message = self.ledger.quota_message(job.job.queue, job.gpus)
            if not self.preempt(job, quota_only=True):
                self.reason(job, "QuotaExceeded", message)
            return
        plan = self.plans.get(job.job.queue)
        if plan is not None and not plan.dropped and self.follow_plan(job, plan):
            return
        for size in sizes:
            placed = self.try_place(size)
            if placed is not None:
                self.commit(size, *placed)
                return
        job = sizes[-1]  # an elastic job that fits at no size asks for its smallest: fewest victims, smallest block
        if job.job_id in self.board_waits:
            return  # it chose to wait for a strong board: no eviction for it, no block of the weak one kept for it
        if self.claim_in_flight(job) or self.preempt(job):
            return
        if self.head is None and self.now - job.job.submitted_ts >= self.config.backfill.min_age_reserve_s:
            self.protect(job)

    def follow_plan(self, job: RankedJob, plan: BatchPlan) -> bool:
        """Place or hold `job` as its queue's joint plan says; False when the plan has nothing for it (or no longer
        fits: then it is dropped and best fit serves the rest of the queue)."""
        alloc = plan.allocations.get(job.job_id)
        if alloc is None:
            if job.job_id not in plan.left_out:
                return False
            self.reason(job, "Resources", plan.left_out_message())
            return True
        if not self.capacity.state.fits(alloc):
            plan.dropped = True
            return False
        self.commit(job, alloc, False)
        return True

    def try_place(self, job: RankedJob) -> tuple[Allocation, bool] | None:
        """The job's allocation and whether it took reserved GPUs, or None with the reason recorded."""
        spec = job.job.spec
        use_block = self.may_use_block(job)
        key = (
            *shape_key(spec),
            use_block,
            spec.queue in self.capacity.mixing_queues,
            spec.queue in self.capacity.timeslice_queues,
        )
        seen = self.failed.get(key)
        if seen is not None and seen[0] == self.capacity.version:
            self.capacity.stats.skipped_by_memo += 1
            self.reason(job, seen[1], seen[2])
            return None
        if spec.constraint:
            never = self.capacity.static_reason(spec)
            if never is not None and never.constraint == "constraint":
                self.fail(job, key, "BadConstraints", never.message)
                return None
        held = _gpu_count(self.hold)
        free = self.capacity.free_gpus_for(spec)  # only the GPUs it may use (its models, --constraint)
        need = whole_gpus(spec)
        if need > free + held:
            self.capacity.stats.skipped_by_count += 1
            self.fail(job, key, "Resources", count_message(spec, free + (held if use_block else 0)))
            return None
        # Outside the reserved block first: a backfill that fits elsewhere leaves the block alone.
        result = self.place(spec, job.job_id, release_hold=False) if need <= free else None
        if result is not None and result.allocation is not None:
            if self.waits_for_board(job, result.allocation):
                return None
            return result.allocation, False
        if self.hold is not None:
            unheld = self.place(spec, job.job_id, release_hold=True)
            if unheld.allocation is not None:
                if use_block:
                    return unheld.allocation, True
                self.fail(job, key, "Priority", self.behind_reservation_message())
                return None
            result = result or unheld
        free_for_it = free + (held if use_block else 0)
        code, message = classify_failure(spec, result.explanation if result else None, free_for_it)
        self.fail(job, key, code, message)
        return None

    def waits_for_board(self, job: RankedJob, alloc: Allocation) -> bool:
        """Only a weaker board is free for it: wait when a strong board is expected to finish it sooner."""
        policy = self.config.boards
        if not policy.wait_for_faster:
            return False
        running = [*self.running, *self.placed]
        limit = self.config.backfill.default_time_limit_s
        spec = job.job.spec
        choice = weigh_boards(
            self.now, spec, alloc, self.capacity.state, running, limit, policy.comm_fraction, self.board_claims
        )
        if choice is None or not choice.wait:
            return False
        self.board_waits.add(job.job_id)
        length = spec.time_limit_s if spec.time_limit_s is not None else limit or math.inf
        self.board_claims.append(BoardClaim(choice.strong_node, choice.start_ts, choice.start_ts + length, choice.gpus))
        self.reason(job, "Topology", choice.message(alloc.ranks[0].node))
        return True

    def may_use_block(self, job: RankedJob) -> bool:
        if self.hold is None or self.reservation is None or self.head is None:
            return False
        return may_use_block(self.now, job, self.reservation, self.head, self.config, self.ledger)

    def place(self, spec: JobSpec, job_id: str, *, release_hold: bool) -> PlacementResult:
        if release_hold and self.hold is not None:
            with self.capacity.released([self.hold]):
                return self.capacity.place(spec, job_id, self.seed)
        return self.capacity.place(spec, job_id, self.seed)

    def fail(self, job: RankedJob, key: tuple[object, ...], code: ReasonCode, message: str) -> None:
        """Record why the job waits, and remember it for same-shaped jobs until the state changes."""
        self.failed[key] = (self.capacity.version, code, message)
        self.reason(job, code, message)

    def behind_reservation_message(self) -> str:
        res = self.reservation
        assert res is not None
        return (
            f"would fit, but the free GPUs of {res.domain} {res.domain_name} are reserved for {res.job_id} "
            f"from {fmt_ts(res.start_ts)}; it is not preemptible and does not end before then"
        )

    def commit(self, job: RankedJob, alloc: Allocation, took_reserved: bool) -> None:
        if took_reserved and self.hold is not None:
            self.capacity.release(self.hold)
            self.capacity.apply(alloc)
            self.hold = self.hold_for(self.reservation.allocation, self.reservation.job_id)  # type: ignore[union-attr]
        else:
            self.capacity.apply(alloc)
        self.record_placement(job, alloc)

    def record_placement(self, job: RankedJob, alloc: Allocation) -> None:
        self.ledger.admit(job.job.queue, job.gpus)
        self.decision.placements[job.job_id] = alloc
        self.busy.add(singleton_key(job.job.spec))
        count_task(job.job.spec.array_task, self.array_running)
        self.decision.reasons.pop(job.job_id, None)
        self.placed.append(RunningJob(job.job_id, job.job.spec, alloc, self.now, preemptions=job.job.preemptions))

    def hold_for(self, alloc: Allocation, job_id: str) -> Allocation | None:
        hold = self.capacity.free_part(alloc, job_id)
        if hold is not None:
            self.capacity.apply(hold)
        return hold

    # -- preemption -------------------------------------------------------------------------------------------

    def claim_in_flight(self, job: RankedJob) -> bool:
        """GPUs of jobs already being evicted go to the first job in order that they make placeable."""
        flight = [r for r in self.vacating if r.job_id not in self.taken]
        coming = sum(_gpu_count(r.allocation) for r in flight)
        if not flight or whole_gpus(job.job.spec) > self.capacity.free_gpus() + coming:
            return False
        with self.capacity.released([r.allocation for r in flight]):
            alloc = self.capacity.place(job.job.spec, job.job_id, self.seed).allocation
        if alloc is None:
            return False
        nodes = set(alloc.nodes)
        claimed = [r for r in flight if nodes & set(r.allocation.nodes)]
        self.nominate(job, alloc, claimed)
        names = ", ".join(r.job_id for r in claimed) or "nobody"
        self.reason(job, "Preempting", f"waiting for {names} to checkpoint and stop; their GPUs are nominated for it")
        return True

    def preempt(self, job: RankedJob, *, quota_only: bool = False) -> bool:
        pol = self.config.preemption
        if not pol.enabled or self.searches >= pol.searches_per_cycle or self.budget <= 0:
            return False
        if self.now - job.job.submitted_ts < pol.preemption_delay_s:
            return False
        key = (job.job.queue, job.priority, quota_only, *shape_key(job.job.spec))
        if self.no_victims.get(key) == self.capacity.version:
            return False  # the same search already failed on this very state
        self.searches += 1
        choice = search_victims(
            self.now,
            self.capacity,
            job,
            self.pool,
            self.config,
            self.ledger,
            self.budget,
            exclude=self.taken,
            same_queue_only=quota_only,  # only its own queue's jobs free quota it can use
            seed=self.seed,
        )
        if choice is None:
            self.no_victims[key] = self.capacity.version
            return False
        res = self.reservation
        if (
            res is not None
            and self.head is not None
            and job.priority <= self.head.priority
            and _overlaps(choice.nominated, res.allocation)
        ):
            return False  # it would take the protected job's block
        victims = [r for r in self.running if r.job_id in set(choice.victims)]
        self.budget -= len(victims)
        self.decision.preemptions.append(choice)
        self.nominate(job, choice.nominated, victims, choice.resized)
        for victim, keeps in choice.resized.items():
            self.decision.nominations[victim] = keeps  # it restarts smaller on the ranks it keeps
        hours = choice.lost_work_gpu_s / 3600
        self.reason(
            job,
            "Preempting",
            f"evicting {', '.join(choice.victims)} ({choice.kind}; {hours:.2f} GPU-hours lost); "
            f"GPUs on {', '.join(choice.nominated.nodes)} are nominated for it",
        )
        return True

    def nominate(
        self,
        job: RankedJob,
        alloc: Allocation,
        victims: Sequence[RunningJob],
        keeps: Mapping[str, Allocation] | None = None,
    ) -> None:
        """Hold the nominated GPUs that are free now; count the preemptor in its queue instead of the victims (a
        shrinking victim's `keeps` stay counted)."""
        self.taken.update(v.job_id for v in victims)
        for v in victims:
            kept = keeps.get(v.job_id) if keeps else None
            self.ledger.release(v.queue, v.gpus - (len(kept.ranks) * v.spec.resources.gpus if kept else 0.0))
        self.ledger.admit(job.job.queue, job.gpus)
        self.hold_for(alloc, job.job_id)
        self.decision.nominations[job.job_id] = alloc
        self.busy.add(singleton_key(job.job.spec))
        count_task(job.job.spec.array_task, self.array_running)

    # -- elastic gangs ---------------------------------------------------------------------------------------
    def keep_resizing(self, nominations: Mapping[str, Allocation]) -> None:
        """An elastic job checkpointing to change size keeps the GPUs nominated for its restart until it is back; so
        does one chosen to shrink that has not begun to stop yet (live, the preemption service's fact comes later)."""
        for r in self.running:
            alloc = nominations.get(r.job_id)
            if alloc is None or r.spec.elastic is None:
                continue
            if not r.preempting and not _within(alloc, r.allocation):
                continue  # a grow not begun yet is decided afresh this cycle
            self.taken.add(r.job_id)
            self.hold_for(alloc, r.job_id)
            self.decision.nominations[r.job_id] = alloc

    @property
    def growable(self) -> list[tuple[int, RunningJob]]:
        """Elastic jobs below their maximum not tried yet this cycle, highest priority (then oldest) first."""
        if self._growable is None:
            self._growable = sorted(
                ((self.config.priority_of(r.spec), r) for r in self.running if may_grow(r)),
                key=lambda t: (-t[0], t[1].started_ts, t[1].job_id),
            )
        return self._growable

    def try_grow(self, run: RunningJob) -> None:
        if run.job_id in self.taken:
            return
        alloc = self.larger_allocation(run)
        if alloc is not None:
            self.grow(run, alloc)
            self.grown += 1

    def grow_elastic(self, ranked: Sequence[RankedJob]) -> None:
        """Elastic jobs below their maximum grow into free GPUs when no job of a higher priority waits for
        GPUs: each is checkpointed and restarts at the largest size that fits (the head's block stays held)."""
        if not self.growable:
            return
        waiting = [
            j.priority
            for j in ranked
            if j.job_id not in self.decision.placements
            and j.job_id not in self.decision.nominations
            and (why := self.decision.reasons.get(j.job_id)) is not None
            and why.code in _WAITS_FOR_GPUS
        ]
        above = max(waiting, default=None)
        for priority, run in self.growable:
            if self.grown >= MAX_GROWS_PER_CYCLE or (above is not None and above > priority):
                break
            self.try_grow(run)
        self._growable = []

    def larger_allocation(self, run: RunningJob) -> Allocation | None:
        """The largest allocation above its size that fits with its own GPUs given back, or None (or not yet: it
        has run less than its minimum run time, or ends too soon for a restart to pay)."""
        spec, elastic = run.spec, run.spec.elastic
        assert elastic is not None
        if self.now < resize_pays_from(run):
            return None  # it has not run long enough at this size for another restart to pay
        end = run.end_ts(self.config.backfill.default_time_limit_s)
        if end is not None and end - self.now < GROW_MIN_REMAINING_GRACES * max(spec.checkpoint.grace_s, 1):
            return None
        per_rank = whole_gpus(sized(spec, 1))
        have = len(run.allocation.ranks)
        free = self.capacity.free_gpus_for(spec)
        top = elastic.max_ranks if per_rank == 0 else min(elastic.max_ranks, have + free // per_rank)
        with self.capacity.released([run.allocation]):
            for k in range(top, have, -1):
                extra = (k - have) * spec.resources.gpus
                if self.ledger.blocking_queue(run.queue, extra) is not None:
                    continue
                alloc = self.capacity.place(sized(spec, k), run.job_id, self.seed).allocation
                if alloc is not None:
                    return alloc
        return None

    def grow(self, run: RunningJob, alloc: Allocation) -> None:
        """The job is its own victim: checkpoint, release, and restart on `alloc` (nominated for it, free part held)."""
        grace = float(run.spec.checkpoint.grace_s)
        choice = VictimChoice(run.job_id, (run.job_id,), ("resize",), alloc, 0.0, 0.0, grace, {run.job_id: alloc})
        self.decision.preemptions.append(choice)
        self.taken.add(run.job_id)
        self.ledger.admit(run.queue, (len(alloc.ranks) - len(run.allocation.ranks)) * run.spec.resources.gpus)
        self.hold_for(alloc, run.job_id)
        self.decision.nominations[run.job_id] = alloc

    # -- head-of-line protection ------------------------------------------------------------------------------

    def protect(self, job: RankedJob) -> None:
        self.head = job
        holders = [r for r in self.running if r.job_id not in self.taken] + self.placed

        evictable = {e.job.job_id: e.protected_for(kind) for e, kind in self.pool.grounds(job, self.ledger)}

        def releasable_at(r: RunningJob) -> float | None:
            if r.preempting:
                return self.now + float(r.spec.checkpoint.grace_s)
            until = evictable.get(r.job_id)
            return None if until is None else max(self.now, until)  # the head may evict it then

        res = reserve_block(self.now, self.capacity, job, holders, self.config, releasable_at, self.seed)
        previous = self.decision.reasons.get(job.job_id)
        if res is None:
            return
        self.decision.reservation = res
        self.hold = self.hold_for(res.allocation, job.job_id)
        when = f"from {fmt_ts(res.start_ts)}" if res.start_ts is not None else "once jobs without a time limit end"
        note = f"; {res.domain} {res.domain_name} ({', '.join(res.nodes)}) is reserved for it {when}"
        if protected := _protected_there(self.now, res, holders, evictable):
            # The block frees because victims' protection ends, not because they end: say which knob sets that.
            note += (
                f", when {', '.join(protected[:3])}{' and others' if len(protected) > 3 else ''} may be preempted "
                "(a victim is protected for its first preemption.min_runtime_s, or its own min_runtime_s)"
            )
        if previous is not None:
            self.decision.reasons[job.job_id] = PendingReason(job.job_id, previous.code, previous.message + note)


def _at_size(job: RankedJob, ranks: int) -> RankedJob:
    """An elastic pending job asking for `ranks` (its quota and placement at that size)."""
    if ranks == job.job.spec.ranks or job.job.spec.elastic is None:
        return job
    return dataclasses.replace(job, job=dataclasses.replace(job.job, spec=sized(job.job.spec, ranks)))


def _within(part: Allocation, whole: Allocation) -> bool:
    held = set(_gpus_of(whole))
    return all(gpu in held for gpu in _gpus_of(part))


def _protected_there(
    now: float, res: Reservation, holders: Sequence[RunningJob], evictable: Mapping[str, float]
) -> list[str]:
    """The holders on the reserved nodes that the head may evict only at the reserved start, their protection's end."""
    if res.start_ts is None:
        return []
    nodes = set(res.nodes)
    return sorted(
        r.job_id
        for r in holders
        if (until := evictable.get(r.job_id)) is not None
        and now < until
        and abs(until - res.start_ts) < 1e-6
        and nodes.intersection(r.allocation.nodes)
    )


def _dependencies_met(
    pending: Sequence[PendingJob],
    running: Sequence[RunningJob],
    job_states: Mapping[str, str],
    decision: CycleDecision,
) -> list[PendingJob]:
    """The pending jobs whose dependencies hold; the others get `Dependency` or `DependencyNeverSatisfied`."""
    if not any(p.spec.dependencies for p in pending):
        return list(pending)
    known: dict[str, str] = {p.job_id: "ACCEPTED" for p in pending}
    known.update((r.job_id, "RUNNING") for r in running)
    known.update(job_states)
    out: list[PendingJob] = []
    for p in pending:
        check = check_dependencies(p.spec, known.get)
        if check.verdict == "ready":
            out.append(p)
        elif check.verdict == "wait":
            decision.reasons[p.job_id] = PendingReason(p.job_id, "Dependency", check.message)
        else:
            decision.reasons[p.job_id] = PendingReason(p.job_id, "DependencyNeverSatisfied", check.message)
            decision.unsatisfiable[p.job_id] = check.message
    return out


def _gpu_count(alloc: Allocation | None) -> int:
    if alloc is None:
        return 0
    return sum(len(r.gpus) for r in alloc.ranks if not r.gpu_milli)


def _gpus_of(alloc: Allocation) -> list[tuple[str, int]]:
    return [(r.node, g) for r in alloc.ranks for g in r.gpus]


def _overlaps(a: Allocation, b: Allocation) -> bool:
    held = set(_gpus_of(b))
    return any(gpu in held for gpu in _gpus_of(a))
