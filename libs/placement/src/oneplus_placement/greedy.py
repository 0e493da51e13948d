"""Topology-aware greedy placement of one gang: the tightest domain that fits, best fit inside it."""

from __future__ import annotations

from dataclasses import dataclass, replace

from oneplus_contracts import Allocation, JobSpec, RankPlacement

from .bandwidth import ideal_ring_gbps, ring_of_masks
from .capacity import CapacityIndexes
from .diagnosis import Explanation, diagnose, static_reason
from .exclusive import hold_whole_nodes
from .fgd import FragMeter
from .fitters import Fitter, RankPick, fitter_for, ordered_gpus
from .hetjob import place_components
from .levels import DomainSearch, Plan
from .mig import place_mig
from .request import GangRequest, InvalidRequest
from .sharing import MPS_FEATURE, stamp_sharing, with_feature
from .snapshot import Holdings


@dataclass(frozen=True)
class PlacementResult:
    """Either an allocation (every rank placed) or an explanation of why not."""

    allocation: Allocation | None
    explanation: Explanation | None

    @property
    def placed(self) -> bool:
        return self.allocation is not None


def place_gang(
    snapshot: Holdings,
    spec: JobSpec,
    job_id: str = "",
    seed: int = 0,
    *,
    keep_strong_boards: bool = True,
    fgd: FragMeter | None = None,
    indexes: CapacityIndexes | None = None,
    mix_gpu_models: bool = False,
    shares_need_mps: bool = False,
) -> PlacementResult:
    """Place every rank of `spec` or none; never changes `snapshot`.

    `job_id` is the caller's name for the decision; the decision itself depends only on the snapshot, the spec,
    `seed` and `keep_strong_boards` (False: a gang that gains nothing from a fast board is placed by best fit
    alone, as every other gang among the board kinds at par for it) and `fgd` (the FGD policy, measuring
    fragmentation for that workload mix; None: best fit). `indexes`: capacities the caller keeps current across
    decisions on this same `snapshot` (it tells them which nodes it changed); None: computed here.
    `mix_gpu_models`: the job's queue lets a gang span nodes of several GPU models (else it keeps to one, unless its
    own gpu_models lists several). `shares_need_mps`: a GPU share goes only to nodes that run MPS (its queue does not
    allow unisolated time-slicing).
    """
    if spec.components is not None:  # a heterogeneous job: each component as a job of its own, all or none
        alloc, why = place_components(
            snapshot,
            spec,
            lambda snap, part: place_gang(snap, part, job_id, seed, keep_strong_boards=keep_strong_boards, fgd=fgd,
                                          mix_gpu_models=mix_gpu_models, shares_need_mps=shares_need_mps),
        )  # fmt: skip
        return PlacementResult(alloc, why)
    if spec.resources.mig is not None:  # MIG instances are their own units (mig.py), not GPUs of the level tree
        got = place_mig(snapshot, spec)
        return PlacementResult(got, None) if isinstance(got, Allocation) else PlacementResult(None, got)
    try:
        req = GangRequest.of(spec)
    except InvalidRequest as exc:
        return PlacementResult(None, Explanation("request", "spec", spec.total_gpus, str(exc)))
    if not keep_strong_boards:
        req = replace(req, keep_strong_boards=False)
    if mix_gpu_models:
        req = replace(req, one_kind=False)
    if shares_need_mps and spec.resources.isolated_share:
        req = replace(req, features=with_feature(req.features, MPS_FEATURE))
    result = place_request(snapshot, req, seed=seed, fgd=fgd, indexes=indexes)
    if result.allocation is not None and spec.resources.isolated_share:
        return PlacementResult(stamp_sharing(snapshot.layout, result.allocation), None)
    return result


def place_request(
    snapshot: Holdings,
    req: GangRequest,
    seed: int = 0,
    solver: str = "greedy",
    fgd: FragMeter | None = None,
    indexes: CapacityIndexes | None = None,
) -> PlacementResult:
    if req.features is not None and req.features.matching and len(req.features.any_of) > 1:
        # Slurm's matching OR [a|b]: every node of the gang has the same one; try each in turn.
        first: PlacementResult | None = None
        for alt in req.features.alternatives():
            got = _place_one(snapshot, replace(req, features=alt), seed, solver, fgd, indexes)
            if got.placed:
                return got
            first = first or got
        # For the reason only: a mixed placement is not allowed.
        mixed = _place_one(snapshot, req, seed, solver, fgd, indexes)
        return first if mixed.placed and first is not None else mixed
    return _place_one(snapshot, req, seed, solver, fgd, indexes)


def _place_one(
    snapshot: Holdings,
    req: GangRequest,
    seed: int,
    solver: str,
    fgd: FragMeter | None,
    indexes: CapacityIndexes | None,
) -> PlacementResult:
    static = static_reason(snapshot, req)
    if static is not None:
        return PlacementResult(None, static)
    fitter = fitter_for(snapshot, req, seed, fgd)
    search = DomainSearch(fitter, req, index=indexes.index(fitter, req) if indexes is not None else None)
    plan = search.best(search.levels())
    if plan is None:
        return PlacementResult(None, diagnose(snapshot, req, search))
    return PlacementResult(materialise(fitter, req, plan, solver), None)


def materialise(fitter: Fitter, req: GangRequest, plan: Plan, solver: str = "greedy") -> Allocation:
    """Turn a plan into ranks with GPU indexes, rails lined up across nodes where ties allow.

    Nodes are taken domain by domain (top level down), so the consecutive ranks of a tensor-parallel group that
    spans nodes are the ranks of one domain."""
    layout = fitter.layout
    req = fitter.req  # as this cluster places it (segments of ranks, `fitters.adapt`)
    pieces = sorted(plan.pieces, key=lambda p: layout.path(p[0]))
    picks: list[RankPick] = []
    rails: frozenset[int] | None = None
    for i, units in pieces:
        got = fitter.pick(i, units, rails if len(pieces) > 1 else None)
        if rails is None and not req.shared:
            mask = 0
            for p in got:
                mask |= p.mask
            rails = layout.slots[i].shape.rail_set(mask)
        picks.extend(got)
    ranks = [
        RankPlacement(
            rank=n,
            node=layout.slots[p.node].name,
            gpus=ordered_gpus(layout.slots[p.node].shape, p.mask),
            gpu_milli=p.milli,
            gpu_memory_mb=req.gpu_memory_mb if p.milli else None,
            cpus=req.cpus,
            memory_mb=req.memory_mb,
        )
        for n, p in enumerate(picks)
    ]
    if req.exclusive:
        ranks = hold_whole_nodes(fitter.snap, ranks)
    score = score_terms(fitter, req, plan, picks)
    return Allocation(ranks=ranks, domain=plan.domain, ring_gbps=score["ring_gbps"], solver=solver, score=score)


def score_terms(fitter: Fitter, req: GangRequest, plan: Plan, picks: list[RankPick]) -> dict[str, float]:
    """The objective terms of one decision, recorded with it."""
    snap = fitter.snap
    layout = fitter.layout
    masks: dict[int, int] = {}
    for p in picks:
        masks[p.node] = masks.get(p.node, 0) | p.mask
    req = fitter.req
    ring = 0.0 if req.shared else ring_of_masks(layout, masks)
    ideal = 0.0 if req.shared else ideal_ring_gbps(layout, req.ranks * req.gpus_per_rank, req.gpus_per_rank)
    broken = sum(1 for i in masks if snap.idle(i) and masks[i] != layout.slots[i].shape.full)
    leaves = {layout.slots[i].leaf for i in masks}
    preferred_met = 1.0
    order = layout.level_names
    if req.domain is not None and req.domain in order:
        preferred_met = 1.0 if order.index(plan.domain) <= order.index(req.domain) else 0.0
    gpus = float(sum(m.bit_count() for m in masks.values())) if not req.shared else req.total_gpus
    return {
        "placed_gpus": gpus,
        "ring_gbps": round(ring, 3),
        "ideal_ring_gbps": round(ideal, 3),
        "topology_quality": round(min(1.0, ring / ideal), 4) if ideal > 0 else 1.0,
        "nodes": float(len(masks)),
        "leaves": float(len(leaves)),
        "whole_nodes_broken": float(broken),
        "free_left_on_nodes": float(
            sum(snap.free_count[i] - (m.bit_count() if not req.shared else 0) for i, m in masks.items())
        ),
        "preferred_domain_met": preferred_met,
    }


def search_for(snapshot: Holdings, req: GangRequest, seed: int = 0) -> DomainSearch | None:
    """The domain search for a request, or None when no node could ever host it (for batch candidates)."""
    if static_reason(snapshot, req) is not None:
        return None
    return DomainSearch(fitter_for(snapshot, req, seed), req)
