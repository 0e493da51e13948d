"""The CP-SAT model of a batch: choose at most one candidate plan per gang under pooled node capacities.

Nodes of one leaf with the same board and the same free GPUs, CPU and memory are one pool: the model counts what
the pool has left instead of naming its nodes, so identical free nodes add no symmetric solutions. A chosen plan
names pools; the decoder puts it on real nodes afterwards (and repairs with greedy if the pooled count was optimistic).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .snapshot import FULL_SHARE, Holdings

if TYPE_CHECKING:
    from ortools.sat.python import cp_model

PoolKey = tuple[object, ...]


@dataclass
class Pool:
    nodes: list[int]
    whole: int  # whole free GPUs per node
    milli: int  # share capacity per node: free GPUs plus room left on shared ones, in thousandths
    cpus: float
    memory_mb: int


@dataclass
class Candidate:
    """One plan of one gang: per pool, the unit counts it puts on distinct nodes of that pool."""

    job: int
    pieces: dict[int, list[int]]
    whole: dict[int, int]
    milli: dict[int, int]
    cpus: dict[int, float]
    memory_mb: dict[int, int]
    coef: int
    terms: dict[str, int]
    hint: bool = False


@dataclass
class BatchModel:
    pools: list[Pool]
    pool_of: list[int]
    candidates: list[Candidate] = field(default_factory=list)

    @classmethod
    def pooled(cls, snap: Holdings) -> BatchModel:
        keys: dict[PoolKey, int] = {}
        pools: list[Pool] = []
        pool_of: list[int] = []
        lowest = snap.layout.levels[0].of_node  # a pool never spans two domains of the lowest level (leaf or NVLink)
        for slot in snap.layout.slots:
            i = slot.index
            key = (
                slot.leaf,
                lowest[i],
                id(slot.shape),
                snap.free[i],
                snap.shares[i],
                snap.cpu_used[i],
                snap.mem_used[i],
            )
            p = keys.get(key)
            if p is None:
                p = keys[key] = len(pools)
                room = 0
                shares = snap.shares[i]
                if shares is not None and snap.schedulable[i]:
                    room = sum(FULL_SHARE - shares[q] for q in range(slot.shape.n) if snap.share_mask[i] >> q & 1)
                pools.append(
                    Pool(
                        [],
                        snap.free_count[i],
                        snap.free_count[i] * FULL_SHARE + room,
                        snap.cpu_free(i),
                        snap.mem_free(i),
                    )
                )
            pools[p].nodes.append(i)
            pool_of.append(p)
        return cls(pools, pool_of)


@dataclass(frozen=True)
class Solution:
    status: str
    chosen: dict[int, Candidate]
    objective: float | None
    bound: float | None
    gap: float | None


def solve(
    model: BatchModel,
    n_jobs: int,
    same_as_previous: Sequence[int | None],
    time_limit_s: float,
    seed: int,
    workers: int,
) -> Solution:
    """Maximise the sum of chosen candidates' coefficients; hints are the greedy answer."""
    # Imported here: OR-Tools brings pandas, 60 MB and 0.4 s to every process that imports oneplus_placement (the
    # intake, the preemption service), and only a cp-sat queue's solver ever builds a model.
    from ortools.sat.python import cp_model

    m = cp_model.CpModel()
    x = [m.new_bool_var(f"x{n}") for n in range(len(model.candidates))]
    by_job: list[list[int]] = [[] for _ in range(n_jobs)]
    for n, c in enumerate(model.candidates):
        by_job[c.job].append(n)
    placed = [m.new_bool_var(f"placed{j}") for j in range(n_jobs)]
    for j, cands in enumerate(by_job):
        m.add(sum(x[n] for n in cands) == placed[j])
    # Symmetry: of two identical gangs the earlier one is placed first.
    for j, prev in enumerate(same_as_previous):
        if prev is not None:
            m.add_implication(placed[j], placed[prev])
    _add_pool_limits(m, model, x)
    m.maximize(sum(c.coef * x[n] for n, c in enumerate(model.candidates)))
    for n, c in enumerate(model.candidates):
        m.add_hint(x[n], c.hint)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(time_limit_s, 1e-6)
    solver.parameters.num_workers = max(1, workers)
    solver.parameters.random_seed = seed
    status = solver.solve(m)
    name = solver.status_name(status)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return Solution(name, {}, None, None, None)
    chosen = {c.job: c for n, c in enumerate(model.candidates) if solver.boolean_value(x[n])}
    obj, bound = solver.objective_value, solver.best_objective_bound
    gap = max(0.0, (bound - obj) / max(1.0, abs(bound)))
    return Solution(name, chosen, obj, bound, gap)


def _add_pool_limits(m: cp_model.CpModel, model: BatchModel, x: list[cp_model.IntVar]) -> None:
    use: dict[int, list[int]] = {}
    for n, c in enumerate(model.candidates):
        for p in c.pieces:
            use.setdefault(p, []).append(n)
    cands = model.candidates
    for p, ns in use.items():
        pool = model.pools[p]
        count = len(pool.nodes)
        if len(ns) < 2:
            continue  # a single candidate was built to fit the pool on its own
        m.add(sum(cands[n].whole.get(p, 0) * x[n] for n in ns) <= pool.whole * count)
        m.add(sum(cands[n].milli.get(p, 0) * x[n] for n in ns) <= pool.milli * count)
        # CPU in hundredths and memory in MB keep the sums integral.
        m.add(sum(round(cands[n].cpus.get(p, 0.0) * 100) * x[n] for n in ns) <= int(pool.cpus * 100 + 1e-6) * count)
        m.add(sum(cands[n].memory_mb.get(p, 0) * x[n] for n in ns) <= pool.memory_mb * count)
