"""Place a window of pending gangs jointly: greedy first, then CP-SAT over candidate plans under a time bound.

Objective (integers, GPU amounts in thousandths): for every placed gang
    weight(priority) x GPUs                     -- priority-weighted placed GPUs, weight 10..100
  + 2 x GPUs x ring_gbps / ideal_ring_gbps      -- topology quality, never worth more than placing a gang
  - min(2000, half the first term) per idle node the gang breaks -- fragmentation
The greedy answer is the warm start (hints) and the fallback when the solver finds nothing within the bound or
finds less than greedy did.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from oneplus_contracts import Allocation, JobSpec

from .bandwidth import ideal_ring_gbps, ring_of_masks
from .batch_model import BatchModel, Candidate, Solution, solve
from .diagnosis import Explanation
from .fitters import adapt
from .greedy import PlacementResult, materialise
from .incremental import SearchCache, apply_and_refresh
from .layout import AllocationConflict, Layout
from .levels import DomainSearch, Plan
from .request import GangRequest, InvalidRequest
from .snapshot import Holdings

_QUALITY_WEIGHT = 2
_BREAK_PENALTY = 2000
_PLANS_PER_LEVEL = 2
_MAX_SHARED_PLANS = 12


@dataclass(frozen=True)
class PendingGang:
    job_id: str
    spec: JobSpec
    priority: int | None = None
    mix_gpu_models: bool = False  # its queue lets a gang span GPU models (else one model, unless it lists several)

    @property
    def effective_priority(self) -> int:
        return self.spec.priority if self.priority is None else self.priority


@dataclass
class BatchResult:
    """Per job an allocation or an explanation; the solver used, objective, bound, gap and objective terms.

    `objective` is the value of the answer returned. `model_objective`, `bound` and `gap` are CP-SAT's over its
    candidate plans (None when it found nothing in time); gangs it left out may still be placed by greedy
    afterwards, so `objective` can exceed `bound`. `upper_bound` holds for every possible answer.
    """

    decisions: dict[str, PlacementResult]
    solver: str
    objective: float
    bound: float | None
    gap: float | None
    wall_s: float
    terms: dict[str, float]
    status: str
    greedy: dict[str, PlacementResult]
    greedy_objective: float
    requested_gpus: float
    model_objective: float | None = None
    upper_bound: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def allocations(self) -> dict[str, Allocation]:
        return {j: r.allocation for j, r in self.decisions.items() if r.allocation is not None}

    @property
    def placed_gpus(self) -> float:
        return _gpus(self.decisions)

    @property
    def greedy_placed_gpus(self) -> float:
        return _gpus(self.greedy)

    @property
    def placed_gpu_pct(self) -> float:
        return 100.0 * self.placed_gpus / self.requested_gpus if self.requested_gpus else 0.0

    @property
    def greedy_placed_gpu_pct(self) -> float:
        return 100.0 * self.greedy_placed_gpus / self.requested_gpus if self.requested_gpus else 0.0


def _gpus(decisions: dict[str, PlacementResult]) -> float:
    return sum(
        sum(len(r.gpus) * (r.gpu_milli / 1000 if r.gpu_milli else 1) for r in d.allocation.ranks)
        for d in decisions.values()
        if d.allocation is not None
    )


@dataclass
class _Job:
    gang: PendingGang
    req: GangRequest
    weight: int
    gpus_milli: int
    ideal_gbps: float

    def coef(self, quality: float, broken: int) -> tuple[int, dict[str, int]]:
        primary = self.weight * self.gpus_milli
        q = round(_QUALITY_WEIGHT * self.gpus_milli * max(0.0, min(1.0, quality)))
        frag = broken * min(_BREAK_PENALTY, primary // 2)
        return primary + q - frag, {"priority_gpus": primary, "topology_quality": q, "fragmentation": -frag}


def place_batch(
    snapshot: Holdings,
    jobs: Sequence[PendingGang],
    time_limit_s: float = 0.2,
    seed: int = 0,
    workers: int = 1,
    contested_only: bool = False,
) -> BatchResult:
    """Place `jobs` jointly on `snapshot` (unchanged); CP-SAT runs at most `time_limit_s` seconds.

    `contested_only`: when greedy places every gang of the window, return its answer without running CP-SAT (the
    live cycle's use: a joint decision can then only polish topology terms, not place more)."""
    t0 = time.perf_counter()
    if time_limit_s <= 0:
        raise ValueError(f"time_limit_s must be positive, got {time_limit_s}")
    ids = [g.job_id for g in jobs]
    if len(set(ids)) != len(ids):
        raise ValueError("job ids in a batch must be unique")
    order, invalid = _prepare(snapshot, jobs)
    requested = sum(g.spec.total_gpus for g in jobs)

    greedy, greedy_plans = _greedy(snapshot, order, seed)
    if contested_only and len(greedy_plans) == len(order):
        return _greedy_only(snapshot, order, greedy, invalid, ids, requested, t0)
    model, fits_alone = _build_model(snapshot, order, greedy_plans, seed)
    solution = solve(model, len(order), _same_as_previous(order), time_limit_s, seed, workers)
    greedy_value, greedy_terms = _evaluate(snapshot, order, greedy)

    notes: list[str] = []
    decisions, solver, value, terms = greedy, "greedy-fallback", greedy_value, greedy_terms
    if solution.status in ("OPTIMAL", "FEASIBLE"):
        decoded, repaired, filled = _decode(snapshot, model, order, solution, seed)
        decoded_value, decoded_terms = _evaluate(snapshot, order, decoded)
        if repaired:
            notes.append(f"{repaired} gang(s) re-placed by greedy after pooled capacity proved optimistic")
        if filled:
            notes.append(f"{filled} gang(s) outside the solver's candidate plans placed by greedy afterwards")
        if decoded_value >= greedy_value:
            decisions, solver, value, terms = decoded, "cp-sat", decoded_value, decoded_terms
        else:
            notes.append("cp-sat answer was worse than greedy within the bound")
    else:
        notes.append(f"cp-sat found no solution within {time_limit_s:g}s ({solution.status})")
    decisions = _stamp(decisions, solver, solution.gap, order)
    decisions.update(invalid)
    greedy.update(invalid)
    return BatchResult(
        decisions={j: decisions[j] for j in ids},
        solver=solver,
        objective=value / 1000,
        bound=None if solution.bound is None else solution.bound / 1000,
        gap=solution.gap,
        wall_s=time.perf_counter() - t0,
        terms={k: v / 1000 for k, v in terms.items()},
        status=solution.status,
        greedy={j: greedy[j] for j in ids},
        greedy_objective=greedy_value / 1000,
        requested_gpus=requested,
        model_objective=None if solution.objective is None else solution.objective / 1000,
        upper_bound=_knapsack_bound(snapshot, [order[j] for j in fits_alone]) / 1000,
        notes=notes,
    )


def _greedy_only(
    snapshot: Holdings,
    order: list[_Job],
    greedy: dict[str, PlacementResult],
    invalid: dict[str, PlacementResult],
    ids: list[str],
    requested: float,
    t0: float,
) -> BatchResult:
    """The answer when greedy placed the whole window and CP-SAT was not asked."""
    value, terms = _evaluate(snapshot, order, greedy)
    decisions = {**greedy, **invalid}
    return BatchResult(
        decisions={j: decisions[j] for j in ids},
        solver="greedy",
        objective=value / 1000,
        bound=None,
        gap=None,
        wall_s=time.perf_counter() - t0,
        terms={k: v / 1000 for k, v in terms.items()},
        status="NOT_RUN",
        greedy={j: decisions[j] for j in ids},
        greedy_objective=value / 1000,
        requested_gpus=requested,
        notes=["greedy placed every gang of the window: CP-SAT not run"],
    )


def _prepare(snapshot: Holdings, jobs: Sequence[PendingGang]) -> tuple[list[_Job], dict[str, PlacementResult]]:
    """Highest priority first; priority maps to a weight of 10..100 across the window."""
    invalid: dict[str, PlacementResult] = {}
    order: list[_Job] = []
    prios = [g.effective_priority for g in jobs]
    lo, hi = (min(prios), max(prios)) if prios else (0, 0)
    for g in sorted(jobs, key=lambda g: -g.effective_priority):
        try:
            req = adapt(snapshot.layout, GangRequest.of(g.spec))  # as this cluster places it (segments)
        except InvalidRequest as exc:
            invalid[g.job_id] = PlacementResult(None, Explanation("request", "spec", g.spec.total_gpus, str(exc)))
            continue
        if g.mix_gpu_models:
            req = replace(req, one_kind=False)
        weight = 10 + (round(90 * (g.effective_priority - lo) / (hi - lo)) if hi > lo else 0)
        ideal = 0.0 if req.shared else ideal_ring_gbps(snapshot, req.ranks * req.gpus_per_rank, req.gpus_per_rank)
        order.append(_Job(g, req, weight, round(req.total_gpus * 1000), ideal))
    return order, invalid


def _knapsack_bound(snapshot: Holdings, jobs: list[_Job]) -> float:
    """A bound no placement of the window can beat: best terms per gang, packed fractionally into the free GPUs."""
    room = float(snapshot.total_free_gpus() * 1000 + sum(_share_room(snapshot, i) for i in range(len(snapshot.free))))
    best = 0.0
    for job in sorted(jobs, key=lambda j: -(j.weight + _QUALITY_WEIGHT)):
        if room <= 0:
            break
        take = min(1.0, room / job.gpus_milli) if job.gpus_milli else 1.0
        best += take * (job.weight + _QUALITY_WEIGHT) * job.gpus_milli
        room -= take * job.gpus_milli
    return best


def _share_room(snapshot: Holdings, i: int) -> int:
    shares = snapshot.shares[i]
    if shares is None or not snapshot.schedulable[i]:
        return 0
    return sum(1000 - v for v in shares if v)


def _greedy(snapshot: Holdings, order: list[_Job], seed: int) -> tuple[dict[str, PlacementResult], dict[str, Plan]]:
    """Highest priority first, each on what the earlier ones left."""
    state = snapshot.mutable_copy()
    cache = SearchCache(state, seed)
    results: dict[str, PlacementResult] = {}
    plans: dict[str, Plan] = {}
    for job in order:
        search = cache.search(job.req)
        plan = search.best(search.levels())
        if plan is None:
            results[job.gang.job_id] = cache.place(job.req)
            continue
        alloc = materialise(search.fitter, job.req, plan)
        apply_and_refresh(state, cache, alloc)
        results[job.gang.job_id] = PlacementResult(alloc, None)
        plans[job.gang.job_id] = plan
    return results, plans


def _build_model(
    snapshot: Holdings, order: list[_Job], greedy_plans: dict[str, Plan], seed: int
) -> tuple[BatchModel, list[int]]:
    """Identical gangs share one list of plans, long enough for all of them; each also gets its greedy plan."""
    model = BatchModel.pooled(snapshot)
    cache = SearchCache(snapshot, seed)
    alike: dict[GangRequest, int] = {}
    for job in order:
        alike[job.req] = alike.get(job.req, 0) + 1
    shared: dict[GangRequest, list[Plan]] = {}
    for j, job in enumerate(order):
        search = cache.search(job.req)
        if job.req not in shared:
            per_level = min(_MAX_SHARED_PLANS, _PLANS_PER_LEVEL * alike[job.req])
            shared[job.req] = _candidate_plans(search, job.req, per_level)
        hinted = greedy_plans.get(job.gang.job_id)
        seen: set[tuple[tuple[int, int], ...]] = set()
        for plan in [*([hinted] if hinted else []), *shared[job.req]]:
            key = tuple(sorted(plan.pieces))
            if key in seen:
                continue
            seen.add(key)
            model.candidates.append(_candidate(snapshot, model, search, job, j, plan, hint=plan is hinted))
    fits_alone = [j for j, job in enumerate(order) if shared[job.req] or job.gang.job_id in greedy_plans]
    return model, fits_alone


def _candidate_plans(search: DomainSearch, req: GangRequest, per_level: int) -> list[Plan]:
    """The best plans at the tightest level that has any, and a few one level wider."""
    levels = search.levels()
    for n, level in enumerate(levels):
        plans = search.plans(level, limit=per_level)
        if plans:
            if n + 1 < len(levels):
                plans += search.plans(levels[n + 1], limit=2)
            return plans
    return []


def _candidate(
    snap: Holdings, model: BatchModel, search: DomainSearch, job: _Job, j: int, plan: Plan, hint: bool
) -> Candidate:
    req, fitter = job.req, search.fitter
    c = Candidate(j, {}, {}, {}, {}, {}, 0, {}, hint)
    masks: dict[int, int] = {}
    broken = 0
    for i, units in plan.pieces:
        p = model.pool_of[i]
        c.pieces.setdefault(p, []).append(units)
        whole = units * req.unit_gpus
        c.whole[p] = c.whole.get(p, 0) + whole
        c.milli[p] = c.milli.get(p, 0) + (units * req.ranks_per_unit * req.milli if req.shared else whole * 1000)
        c.cpus[p] = c.cpus.get(p, 0.0) + units * req.unit_cpus
        c.memory_mb[p] = c.memory_mb.get(p, 0) + units * req.unit_memory_mb
        if snap.idle(i) and whole < snap.layout.slots[i].shape.n:
            broken += 1
        if not req.shared:
            masks[i] = fitter.union(i, units) if snap.free_count[i] >= whole else 0  # type: ignore[attr-defined]
    quality = 1.0
    if job.ideal_gbps > 0 and masks and all(masks.values()):
        quality = ring_of_masks(snap.layout, masks) / job.ideal_gbps
    c.coef, c.terms = job.coef(quality, broken)
    return c


def _same_as_previous(order: list[_Job]) -> list[int | None]:
    """For each gang, the nearest earlier gang with the same request and priority (a symmetry to break)."""
    last: dict[tuple[object, ...], int] = {}
    out: list[int | None] = []
    for j, job in enumerate(order):
        key = (job.req, job.gang.effective_priority)
        out.append(last.get(key))
        last[key] = j
    return out


def _decode(
    snapshot: Holdings, pools: BatchModel, order: list[_Job], solution: Solution, seed: int
) -> tuple[dict[str, PlacementResult], int, int]:
    """Put chosen candidates on real nodes of their pools, then greedy for the rest; count repairs and fill-ins."""
    state = snapshot.mutable_copy()
    cache = SearchCache(state, seed)
    results: dict[str, PlacementResult] = {}
    repaired = filled = 0
    packed = _pack(snapshot, pools, order, solution.chosen)
    for j, job in enumerate(order):
        cand = solution.chosen.get(j)
        if cand is None:
            continue
        search = cache.search(job.req)
        plan = packed[j] if j in packed else _realise(search, pools, cand)
        if plan is not None and any(search.caps.get(i, 0) < units for i, units in plan.pieces):
            plan = None  # counted GPUs fit, the board's shape does not (an NVLink island too small): greedy repairs
        alloc = None
        if plan is not None:
            try:
                alloc = materialise(search.fitter, job.req, plan, "cp-sat")
                apply_and_refresh(state, cache, alloc)
            except AllocationConflict:
                alloc = None
        if alloc is None:
            repaired += 1
            got = cache.place(job.req, "greedy")
            if got.allocation is not None:
                apply_and_refresh(state, cache, got.allocation)
            results[job.gang.job_id] = got
        else:
            results[job.gang.job_id] = PlacementResult(alloc, None)
    for job in order:
        if job.gang.job_id in results:
            continue
        got = cache.place(job.req, "greedy")
        if got.allocation is not None:
            apply_and_refresh(state, cache, got.allocation)
            filled += 1
        results[job.gang.job_id] = got
    return results, repaired, filled


def _pack(snap: Holdings, pools: BatchModel, order: list[_Job], chosen: dict[int, Candidate]) -> dict[int, Plan | None]:
    """Whole-GPU gangs' pieces on real nodes, first-fit decreasing over the whole batch: the largest pieces first,
    each on the node of its pool it fills best. Placing gang by gang instead (a small gang first, best fit) can
    leave every node too short for a large gang that the pooled count said would fit: the packing is the batch's
    whole point. None for a gang whose pieces do not all fit (greedy repairs it)."""
    free = list(snap.free_count)
    cpus = [snap.cpu_free(i) for i in range(len(free))]
    mem = [snap.mem_free(i) for i in range(len(free))]
    pieces: list[tuple[int, int, int, int]] = []  # (-GPUs, job, pool, units)
    for j, cand in chosen.items():
        req = order[j].req
        if req.shared:
            continue
        for p, units_list in cand.pieces.items():
            pieces += [(-units * req.unit_gpus, j, p, units) for units in units_list]
    placed: dict[int, list[tuple[int, int]]] = {}
    failed: set[int] = set()
    for neg, j, p, units in sorted(pieces):
        if j in failed:
            continue
        req, need = order[j].req, -neg
        taken = {i for i, _ in placed.get(j, [])}
        cpu, mb = units * req.unit_cpus, units * req.unit_memory_mb
        fits = [
            i
            for i in pools.pools[p].nodes
            if i not in taken and free[i] >= need and cpus[i] + 1e-9 >= cpu and mem[i] >= mb
        ]
        if not fits:
            failed.add(j)
            continue
        best = min(fits, key=lambda i: (free[i] - need, i))
        free[best] -= need
        cpus[best] -= cpu
        mem[best] -= mb
        placed.setdefault(j, []).append((best, units))
    layout = snap.layout
    return {j: None if j in failed else _plan_of(placed.get(j, []), layout) for j in chosen if not order[j].req.shared}


def _plan_of(pieces: list[tuple[int, int]], layout: Layout) -> Plan | None:
    if not pieces:
        return None
    return Plan(tuple(pieces), layout.domain_of_nodes([i for i, _ in pieces]))


def _realise(search: DomainSearch, pools: BatchModel, cand: Candidate) -> Plan | None:
    """Largest pieces first, each on the best-fitting node of its pool that still has room."""
    pieces: list[tuple[int, int]] = []
    used: set[int] = set()
    caps = search.caps
    for p, units_list in cand.pieces.items():
        for units in sorted(units_list, reverse=True):
            fits = [i for i in pools.pools[p].nodes if i not in used and caps.get(i, 0) >= units]
            if not fits:
                return None
            best = min(fits, key=lambda i: search.fitter.node_key(i, units))
            used.add(best)
            pieces.append((best, units))
    return _plan_of(pieces, search.layout)


def _evaluate(
    snapshot: Holdings, order: list[_Job], decisions: dict[str, PlacementResult]
) -> tuple[int, dict[str, int]]:
    """The objective of a set of decisions, by the same terms the model maximises."""
    total = 0
    terms = {"priority_gpus": 0, "topology_quality": 0, "fragmentation": 0}
    layout = snapshot.layout
    for job in order:
        d = decisions.get(job.gang.job_id)
        if d is None or d.allocation is None:
            continue
        alloc = d.allocation
        per_node: dict[int, int] = {}
        for r in alloc.ranks:
            i = layout.index(r.node)
            per_node[i] = per_node.get(i, 0) + (0 if r.gpu_milli else len(r.gpus))
        broken = sum(1 for i, n in per_node.items() if snapshot.idle(i) and n < layout.slots[i].shape.n)
        value, t = job.coef(alloc.score.get("topology_quality", 1.0), broken)
        total += value
        for k, v in t.items():
            terms[k] += v
    return total, terms


def _stamp(
    decisions: dict[str, PlacementResult], solver: str, gap: float | None, order: list[_Job]
) -> dict[str, PlacementResult]:
    """Record the batch's solver and gap on every allocation it made."""
    out: dict[str, PlacementResult] = {}
    for job in order:
        d = decisions[job.gang.job_id]
        if d.allocation is None:
            out[job.gang.job_id] = d
            continue
        alloc = d.allocation
        used = solver if alloc.solver != "greedy" or solver == "greedy-fallback" else "cp-sat+greedy-repair"
        score = dict(alloc.score)
        score["batch_gap"] = gap if gap is not None else -1.0
        score["priority_weight"] = float(job.weight)
        out[job.gang.job_id] = PlacementResult(alloc.model_copy(update={"solver": used, "score": score}), None)
    return out
