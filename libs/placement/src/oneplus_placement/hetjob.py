"""A heterogeneous job (Slurm hetjob): its components placed as one gang, all or nothing.

Each component is placed as a job of its own (its ranks, resources and topology constraint, `JobSpec.component_specs`)
on a private copy of the cluster that holds the components placed before it, on nodes no other component has: the
executor then tells a component's nodes by the allocation's node order alone, as Slurm's `_HET_GROUP_<n>` lists them.
The largest component goes first (a small one placed first could take a node of the only domain a large one fits);
with few components every order is tried before the job is said not to fit. The components' allocations are one
allocation, ranks in component order: one decision, committed as one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from itertools import permutations
from typing import Protocol

from oneplus_contracts import Allocation, JobSpec, RankPlacement

from .diagnosis import Explanation
from .snapshot import Holdings

# Every order is tried up to this many components (3! = 6 trials); past it, the largest-first order only.
ALL_ORDERS_UP_TO = 3


class Placed(Protocol):
    """What placing one component answers (greedy.PlacementResult, which imports this module)."""

    @property
    def allocation(self) -> Allocation | None: ...

    @property
    def explanation(self) -> Explanation | None: ...


def _orders(parts: list[JobSpec]) -> Iterator[tuple[int, ...]]:
    first = tuple(sorted(range(len(parts)), key=lambda n: (-parts[n].total_gpus, -parts[n].ranks, n)))
    yield first
    if len(parts) <= ALL_ORDERS_UP_TO:
        for order in permutations(range(len(parts))):
            if order != first:
                yield order


def place_components(
    snapshot: Holdings, spec: JobSpec, place_one: Callable[[Holdings, JobSpec], Placed]
) -> tuple[Allocation | None, Explanation | None]:
    """Every component of `spec` placed, as one allocation; or none, with why the first order tried failed."""
    parts = spec.component_specs()
    first_failure: Explanation | None = None
    for order in _orders(parts):
        work = snapshot.mutable_copy()
        placed: dict[int, Allocation] = {}
        taken: set[str] = set()
        failure: Explanation | None = None
        for n in order:
            part = parts[n]
            if taken:
                never = sorted(set(part.exclude_nodes) | (taken - set(part.nodelist)))
                part = part.model_copy(update={"exclude_nodes": never})
                if part.nodelist and not set(part.nodelist) - taken:
                    mine = ", ".join(part.nodelist)
                    said = f"component {n}: its nodes ({mine}) are another component's; each has nodes of its own"
                    failure = Explanation("request", "nodelist", part.total_gpus, said)
                    break
            got = place_one(work, part)
            if got.allocation is None:
                why = got.explanation
                message = why.message if why is not None else "does not fit"
                failure = Explanation(
                    why.level if why is not None else "cluster",
                    why.constraint if why is not None else "capacity",
                    spec.total_gpus,
                    f"component {n} ({part.ranks} rank(s)): {message}",
                    best_candidate=why.best_candidate if why is not None else None,
                )
                break
            work.apply(got.allocation)
            placed[n] = got.allocation
            taken.update(got.allocation.nodes)
        else:
            return merge(spec, [placed[n] for n in range(len(parts))], snapshot), None
        first_failure = first_failure or failure
    return None, first_failure


def merge(spec: JobSpec, parts: list[Allocation], snapshot: Holdings) -> Allocation:
    """The components' allocations as the job's: ranks numbered on in component order; the widest domain."""
    ranks: list[RankPlacement] = []
    for start, alloc in zip(spec.component_offsets(), parts, strict=True):
        ranks.extend(r.model_copy(update={"rank": start + r.rank}) for r in sorted(alloc.ranks, key=lambda r: r.rank))
    names = snapshot.layout.level_names
    domain = max((a.domain for a in parts), key=lambda d: names.index(d) if d in names else len(names))
    score: dict[str, float] = {"components": float(len(parts))}
    for key in ("placed_gpus", "nodes", "leaves", "whole_nodes_broken"):
        score[key] = float(sum(a.score.get(key, 0.0) for a in parts))
    score["topology_quality"] = min(a.score.get("topology_quality", 1.0) for a in parts)
    score["preferred_domain_met"] = min(a.score.get("preferred_domain_met", 1.0) for a in parts)
    ring = max(parts, key=lambda a: a.score.get("placed_gpus", 0.0)).ring_gbps
    return Allocation(ranks=ranks, domain=domain, ring_gbps=ring, solver=parts[0].solver, score=score)
