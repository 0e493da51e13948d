"""Victim choice: the cheapest set of whole gangs whose eviction frees a domain the preemptor can be placed in.

Cost of a victim = its GPUs × seconds since its last checkpoint (the work thrown away) + GPUs × the restart cost.
Every candidate set is checked by running the real placement on the state with the set released, so a choice
never frees GPUs the preemptor cannot use. Per domain (node, leaf, spine, cluster) the search is exact over all
subsets when there are few candidates, else greedy by cost per freed GPU followed by pruning.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from oneplus_contracts import Allocation, JobSpec
from oneplus_placement.mig import free_instances, instances
from oneplus_placement.request import GangRequest
from oneplus_placement.snapshot import ClusterSnapshot, ClusterState

from .capacity import Capacity, DomainKey, gpus_by_node, whole_gpus, working_copy
from .config import QueueConfig, QueueConfigError
from .elastic import resize_pays_from, shrink_part
from .fairshare import UsageHistory
from .model import CycleStats, PendingJob, PreemptionKind, RunningJob, VictimChoice
from .ordering import RankedJob
from .quota import QuotaLedger, held_by_queue

_MAX_DOMAINS = 12  # domains searched per preemptor, best lower bound first
_MAX_TRIALS = 48  # placement trials per domain


@dataclass(frozen=True, slots=True)
class Candidate:
    job: RunningJob
    kind: PreemptionKind
    cost: float
    on_node: dict[int, int]  # node index → GPUs it holds there
    keeps: Allocation | None = None  # an elastic victim that shrinks: `job` is the part it gives up, this it keeps
    full: RunningJob | None = None  # that shrinking victim as it runs


def protected_until(job: RunningJob, config: QueueConfig, kind: PreemptionKind = "priority") -> float:
    """Until when the job may not be evicted on these grounds: its minimum run time, longer after each earlier
    preemption. The site's floor (`preemption.min_runtime_s`) guards against priority preemption only: a borrower's
    GPUs go back to the lending queue as soon as the job's own minimum allows."""
    pol = config.preemption
    floor = float(job.spec.min_runtime_s)
    if kind == "priority":
        floor = max(floor, pol.min_runtime_s)
    if job.preemptions > 0:
        floor = max(floor, pol.restart_cost_s) * pol.protection_backoff**job.preemptions
    return job.started_ts + floor


def eviction_grounds(
    preemptor: RankedJob, victim: RunningJob, config: QueueConfig, ledger: QuotaLedger
) -> PreemptionKind | None:
    """On what grounds `victim` could ever be evicted for `preemptor` (its run time aside); None: never."""
    entry = Evictable.of(victim, config)
    if entry is None or victim.job_id == preemptor.job_id:
        return None
    return ledger.preemption_kind(preemptor.job.queue, preemptor.priority, preemptor.gpus, victim, entry.priority)


@dataclass(frozen=True, slots=True)
class Evictable:
    """A running job that could ever be a victim, with what the checks need resolved once."""

    job: RunningJob
    priority: int
    protected_until: float  # against priority preemption
    reclaimable_from: float  # against reclaim of borrowed GPUs

    def protected_for(self, kind: PreemptionKind) -> float:
        return self.reclaimable_from if kind == "reclaim" else self.protected_until

    @classmethod
    def of(cls, job: RunningJob, config: QueueConfig) -> Evictable | None:
        if job.preempting or job.preemptions >= config.preemption.max_preemptions_per_job:
            return None  # already leaving, or preempted often enough to be protected from now on
        try:
            config.path(job.queue)
            if not config.preemptible(job.spec):
                return None
            return cls(
                job,
                config.priority_of(job.spec),
                protected_until(job, config, "priority"),
                protected_until(job, config, "reclaim"),
            )
        except QueueConfigError:
            return None  # a job of a queue no longer configured is left alone rather than guessed about


class VictimPool:
    """The evictable running jobs of one cycle, by priority, so each search looks only at plausible ones."""

    def __init__(self, running: Sequence[RunningJob], config: QueueConfig) -> None:
        entries = [e for e in (Evictable.of(j, config) for j in running) if e is not None]
        entries.sort(key=lambda e: (e.priority, e.job.job_id))
        self.entries = entries
        self.priorities = [e.priority for e in entries]

    def grounds(self, preemptor: RankedJob, ledger: QuotaLedger) -> list[tuple[Evictable, PreemptionKind]]:
        """Every entry the preemptor may evict once its protection ends, with the grounds."""
        queue, prio, gpus = preemptor.job.queue, preemptor.priority, preemptor.gpus
        # Only a queue inside its guarantee at some level may reclaim; else only lower priorities can go.
        reclaim = any(
            ledger.held[q] + gpus <= ledger.config.queue(q).guarantee_gpus + 1e-9 for q in ledger.config.path(queue)
        )
        pool = self.entries if reclaim else self.entries[: bisect.bisect_left(self.priorities, prio)]
        out = []
        for e in pool:
            if e.job.job_id == preemptor.job_id or (e.priority >= prio and e.job.queue == queue):
                continue
            kind = ledger.preemption_kind(queue, prio, gpus, e.job, e.priority)
            if kind is not None:
                out.append((e, kind))
        return out


def rate_budget(now: float, config: QueueConfig, usage: UsageHistory | None, used_this_cycle: int = 0) -> int:
    """Victim gangs that may still be evicted in the current rate window."""
    recent = usage.preemptions_since(now - config.preemption.rate_window_s) if usage is not None else 0
    return max(0, config.preemption.rate_limit_gangs - recent - used_this_cycle)


def choose_victims(
    now: float,
    state: ClusterState | ClusterSnapshot,
    preemptor: PendingJob,
    running: Sequence[RunningJob],
    config: QueueConfig,
    *,
    usage: UsageHistory | None = None,
    exclude: Collection[str] = (),
    seed: int = 0,
) -> VictimChoice | None:
    """The victim set with the least lost work that lets `preemptor` be placed, or None.

    `state` holds every running job's allocation; it is not changed. `usage` supplies the preemptions of the
    current rate window; `exclude` names jobs that must not be chosen (e.g. already victims of someone else).
    """
    config.validate_job(preemptor.spec)
    ranked = RankedJob(preemptor, config.priority_of(preemptor.spec), config.preemptible(preemptor.spec), 0.0)
    if not config.preemption.enabled or now - preemptor.submitted_ts < config.preemption.preemption_delay_s:
        return None
    jobs = [preemptor.spec, *(r.spec for r in running)]
    capacity = Capacity.for_config(working_copy(state), CycleStats(), config, jobs)
    ledger = QuotaLedger(config, held_by_queue(running, config))
    return search_victims(
        now,
        capacity,
        ranked,
        VictimPool(running, config),
        config,
        ledger,
        rate_budget(now, config, usage),
        exclude=exclude,
        seed=seed,
    )


def search_victims(
    now: float,
    capacity: Capacity,
    preemptor: RankedJob,
    pool: VictimPool,
    config: QueueConfig,
    ledger: QuotaLedger,
    budget: int,
    *,
    exclude: Collection[str] = (),
    same_queue_only: bool = False,
    seed: int = 0,
) -> VictimChoice | None:
    """`choose_victims` on a working capacity the caller owns (the cycle's); it is left as it was found."""
    if budget <= 0:
        return None
    restart = config.preemption.restart_cost_s
    spec = preemptor.job.spec
    cands = [
        _candidate(capacity, e.job, kind, now, restart, spec)
        for e, kind in pool.grounds(preemptor, ledger)
        if now >= _protected_until(e, kind)
        and e.job.job_id not in exclude
        and (not same_queue_only or e.job.queue == preemptor.job.queue)
    ]
    if not cands:
        return None
    capacity.stats.victim_searches += 1
    cands.sort(key=lambda c: (c.cost, c.job.job_id))
    search = _Search(capacity, preemptor, config, ledger, budget, seed)
    best: tuple[float, tuple[Candidate, ...], Allocation] | None = None
    for bound, key, in_domain in _domains(capacity, preemptor, cands, config)[:_MAX_DOMAINS]:
        if best is not None and bound >= best[0] - 1e-9:
            break
        found = search.in_domain(key, in_domain)
        if found is not None and (best is None or found[0] < best[0] - 1e-9):
            best = found
    if best is None:
        return None
    cost, victims, nominated = search.fewest_dropped(search.trim(best), now, restart)
    return VictimChoice(
        preemptor=preemptor.job_id,
        victims=tuple(v.job.job_id for v in victims),
        kinds=tuple(v.kind for v in victims),
        nominated=nominated,
        lost_work_gpu_s=cost,
        freed_gpus=sum(v.job.gpus for v in victims),  # a shrinking victim's job is the part it gives up
        grace_s=max(float(v.job.spec.checkpoint.grace_s) for v in victims),
        resized={v.job.job_id: v.keeps for v in victims if v.keeps is not None},
    )


def _protected_until(entry: Evictable, kind: PreemptionKind) -> float:
    """An elastic gang above its minimum may shrink once a restart pays (it checkpoints first, so it loses no work);
    a whole gang keeps the protection of its kind."""
    if shrink_part(entry.job) is not None:
        return min(entry.protected_for(kind), resize_pays_from(entry.job))
    return entry.protected_for(kind)


def _candidate(
    capacity: Capacity,
    job: RunningJob,
    kind: PreemptionKind,
    now: float,
    restart: float,
    spec: JobSpec,
    drop: int | None = None,
) -> Candidate:
    """A whole gang, or for an elastic gang above its minimum the ranks it can give up (it shrinks rather than goes).

    A shrink costs the part given up (its GPUs × work since the checkpoint, plus the restart): the kept ranks write
    a checkpoint at the signal and go on from it at the smaller size."""
    shrink = shrink_part(job, drop)
    if shrink is None:
        return Candidate(job, kind, _cost(job, now, restart), _held(capacity, job.allocation, spec))
    part, keeps = shrink
    return Candidate(part, kind, _cost(part, now, restart), _held(capacity, part.allocation, spec), keeps, job)


def _cost(job: RunningJob, now: float, restart_cost_s: float) -> float:
    return job.lost_work_gpu_s(now) + job.gpus * restart_cost_s


def _domains(
    capacity: Capacity, preemptor: RankedJob, cands: list[Candidate], config: QueueConfig
) -> list[tuple[float, DomainKey, list[Candidate]]]:
    """Every domain a candidate touches where enough GPUs could be freed, with a lower bound on its cost."""
    spec = preemptor.job.spec
    need = _need(spec)
    out: list[tuple[float, DomainKey, list[Candidate]]] = []
    names = capacity.layout.level_names  # node, the site's levels (nvlink, leaf, spine, ...), cluster
    for level in GangRequest.of(preemptor.job.spec).levels(names):
        touched: dict[DomainKey, list[Candidate]] = {}
        for c in cands:
            for key in {capacity.domain_of_node(level, i) for i in c.on_node}:
                touched.setdefault(key, []).append(c)
        for key, in_domain in touched.items():
            nodes = set(capacity.domain_nodes(key))
            gain = [(c, sum(g for i, g in c.on_node.items() if i in nodes)) for c in in_domain]
            short = need - _free(capacity, key, spec)
            if sum(g for _, g in gain) < short:
                continue
            in_domain = sorted(in_domain, key=lambda c: (c.cost, c.job.job_id))[: config.preemption.max_candidates]
            out.append((_fractional_bound(gain, short), key, in_domain))
    out.sort(key=lambda t: (t[0], names.index(t[1][0]), t[1][1]))
    return out


# A MIG preemptor counts in instances of its profile: only gangs holding such instances can free what it needs.
def _need(spec: JobSpec) -> int:
    return spec.ranks if spec.resources.mig is not None else whole_gpus(spec)


def _free(capacity: Capacity, key: DomainKey, spec: JobSpec) -> int:
    profile = spec.resources.mig
    if profile is None:
        return capacity.free_in(key)
    return sum(len(free_instances(capacity.state, i, profile)) for i in capacity.domain_nodes(key))


def _held(capacity: Capacity, alloc: Allocation, spec: JobSpec) -> dict[int, int]:
    """Per node, what `alloc` would free for `spec`: whole GPUs, or instances of its MIG profile."""
    profile = spec.resources.mig
    if profile is None:
        return gpus_by_node(capacity, alloc)
    out: dict[int, int] = {}
    for r in alloc.ranks:
        if r.mig:
            i = capacity.node_index(r.node)
            mine = {m.uuid for _, m in instances(capacity.layout.slots[i].topology, profile)}
            if got := sum(u in mine for u in r.mig):
                out[i] = out.get(i, 0) + got
    return out


def _fractional_bound(gain: list[tuple[Candidate, int]], short: int) -> float:
    """Lower bound on the cost of freeing `short` GPUs: fractional knapsack by cost per GPU."""
    if short <= 0:
        return min((c.cost for c, _ in gain), default=0.0)
    bound = 0.0
    for c, g in sorted((p for p in gain if p[1] > 0), key=lambda p: p[0].cost / p[1]):
        take = min(g, short)
        bound += c.cost * take / g
        short -= take
        if short <= 0:
            break
    return bound


class _Search:
    """Trial placements with the candidate set released, remembered per set."""

    def __init__(
        self, capacity: Capacity, preemptor: RankedJob, config: QueueConfig, ledger: QuotaLedger, budget: int, seed: int
    ) -> None:
        self.capacity = capacity
        self.preemptor = preemptor
        self.config = config
        self.ledger = ledger
        self.budget = budget
        self.seed = seed
        self.need = _need(preemptor.job.spec)
        self.memo: dict[frozenset[str], Allocation | None] = {}

    def placeable(self, victims: Sequence[Candidate]) -> Allocation | None:
        key = frozenset(v.job.job_id if v.keeps is None else f"{v.job.job_id}-{v.job.spec.ranks}" for v in victims)
        if key in self.memo:
            return self.memo[key]
        got: Allocation | None = None
        if len(victims) <= self.budget and self.ledger.victims_keep_quota_rules(
            self.preemptor.job.queue, self.preemptor.gpus, [v.job for v in victims]
        ):
            with self.capacity.released([v.job.allocation for v in victims]):
                got = self.capacity.place(self.preemptor.job.spec, self.preemptor.job_id, self.seed).allocation
        self.memo[key] = got
        return got

    def in_domain(
        self, key: DomainKey, cands: list[Candidate]
    ) -> tuple[float, tuple[Candidate, ...], Allocation] | None:
        nodes = set(self.capacity.domain_nodes(key))
        short = self.need - _free(self.capacity, key, self.preemptor.job.spec)
        freed = {c.job.job_id: sum(g for i, g in c.on_node.items() if i in nodes) for c in cands}
        if len(cands) <= self.config.preemption.exact_search_max:
            return self._exact(cands, freed, short)
        return self._greedy(cands, freed, short)

    def _exact(
        self, cands: list[Candidate], freed: dict[str, int], short: int
    ) -> tuple[float, tuple[Candidate, ...], Allocation] | None:
        subsets = []
        for r in range(1, min(len(cands), self.budget) + 1):
            for combo in itertools.combinations(cands, r):
                if sum(freed[c.job.job_id] for c in combo) >= short:
                    subsets.append((sum(c.cost for c in combo), r, combo))
        subsets.sort(key=lambda s: (s[0], s[1], [c.job.job_id for c in s[2]]))
        for cost, _, combo in subsets[:_MAX_TRIALS]:
            alloc = self.placeable(combo)
            if alloc is not None:
                return cost, combo, alloc
        return None

    def _greedy(
        self, cands: list[Candidate], freed: dict[str, int], short: int
    ) -> tuple[float, tuple[Candidate, ...], Allocation] | None:
        order = sorted(cands, key=lambda c: (c.cost / max(freed[c.job.job_id], 1e-9), c.job.job_id))
        chosen: list[Candidate] = []
        alloc: Allocation | None = None
        got = 0
        trials = 0
        for c in order:
            if len(chosen) >= self.budget:
                break
            chosen.append(c)
            got += freed[c.job.job_id]
            if got < short:
                continue
            trials += 1
            alloc = self.placeable(chosen)
            if alloc is not None or trials >= _MAX_TRIALS:
                break
        if alloc is None:
            return None
        for c in sorted(chosen, key=lambda c: -c.cost):  # drop whatever is not needed, most expensive first
            rest = [x for x in chosen if x is not c]
            if rest and sum(freed[x.job.job_id] for x in rest) >= short:
                smaller = self.placeable(rest)
                if smaller is not None:
                    chosen, alloc = rest, smaller
        return sum(c.cost for c in chosen), tuple(chosen), alloc

    def fewest_dropped(
        self, best: tuple[float, tuple[Candidate, ...], Allocation], now: float, restart: float
    ) -> tuple[float, tuple[Candidate, ...], Allocation]:
        """Each shrinking victim gives up only as many ranks as the preemptor needs: fewest first, the others fixed."""
        _, victims, nominated = best
        for i, v in enumerate(victims):
            if v.full is None:
                continue
            for drop in range(1, v.job.spec.ranks):
                fewer = _candidate(self.capacity, v.full, v.kind, now, restart, self.preemptor.job.spec, drop)
                trial = (*victims[:i], fewer, *victims[i + 1 :])
                alloc = self.placeable(trial)
                if alloc is not None:
                    victims, nominated = trial, alloc
                    break
        return sum(v.cost for v in victims), victims, nominated

    def trim(
        self, best: tuple[float, tuple[Candidate, ...], Allocation]
    ) -> tuple[float, tuple[Candidate, ...], Allocation]:
        """Spare victims that share no node with the nominated GPUs: evicting them would free nothing used."""
        _, victims, nominated = best
        nodes = set(nominated.nodes)
        keep = tuple(v for v in victims if nodes & set(v.job.allocation.nodes))
        if len(keep) == len(victims) or not keep:
            return best
        if not self.ledger.victims_keep_quota_rules(
            self.preemptor.job.queue, self.preemptor.gpus, [v.job for v in keep]
        ):
            return best
        return sum(v.cost for v in keep), keep, nominated
