"""`oneplus jobs explain`: why a job is pending, what is ahead of it, and whose preemption would make room."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Protocol

from oneplus_contracts import Allocation, JobSpec

from .diagnosis import Explanation
from .fitters import adapt, static_eligible
from .greedy import place_gang, place_request
from .layout import AllocationConflict
from .request import GangRequest, InvalidRequest
from .snapshot import Holdings

Preemptible = tuple[str, Allocation, int]  # (job id, what it holds, its priority)


class _HasJobId(Protocol):
    @property
    def job_id(self) -> str: ...


def explain_pending(
    snapshot: Holdings,
    spec: JobSpec,
    *,
    ahead: Sequence[str | _HasJobId] = (),
    preemptible: Sequence[Preemptible] = (),
    seed: int = 0,
    mix_gpu_models: bool = False,
) -> Explanation:
    """Which constraint blocks at which level; the jobs queued ahead; the cheapest preemption that makes room.

    Only preemptible jobs of lower priority than `spec` are considered, lowest priority (then fewest GPUs) first;
    one victim is preferred to several. `mix_gpu_models`: the job's queue lets a gang span GPU models.
    """
    ahead_ids = tuple(a if isinstance(a, str) else a.job_id for a in ahead)
    if spec.components is not None:
        return _explain_het(snapshot, spec, ahead_ids, seed, mix_gpu_models)
    try:
        req = GangRequest.of(spec)
    except InvalidRequest as exc:
        return Explanation("request", "spec", spec.total_gpus, str(exc))
    if mix_gpu_models:
        req = replace(req, one_kind=False)
    result = place_request(snapshot, req, seed=seed)
    queue = _ahead_phrase(ahead_ids)
    if result.allocation is not None:
        alloc = result.allocation
        where = ", ".join(alloc.nodes)
        message = f"fits now: {req.describe()} on {alloc.domain} ({where})"
        message += f"; waiting because {queue}" if queue else "; it will be placed in the next cycle"
        return Explanation(
            level=alloc.domain,
            constraint="queue" if ahead_ids else "none",
            needed_gpus=req.total_gpus,
            message=message,
            best_candidate=where,
            ahead=ahead_ids,
            fits_now=True,
        )
    exp = result.explanation
    assert exp is not None
    victims: tuple[str, ...] = ()
    message = exp.message
    if queue:
        message += f"; {queue}"
    if exp.level != "request":
        victims = _victims(snapshot, req, spec.priority, preemptible, seed)
        if victims:
            jobs = ", ".join(victims)
            message += f"; would fit if preemptible job{'s' if len(victims) > 1 else ''} {jobs} were preempted"
        elif any(p < spec.priority for _, _, p in preemptible):
            message += "; preempting every lower-priority preemptible job would still not make room"
    return replace(exp, message=message, ahead=ahead_ids, preempt_to_fit=victims)


def _explain_het(
    snapshot: Holdings, spec: JobSpec, ahead: tuple[str, ...], seed: int, mix_gpu_models: bool
) -> Explanation:
    """A heterogeneous job: placed as it will be (every component or none), or which component does not fit. No
    preemption is suggested: the victim search works on one gang shape."""
    got = place_gang(snapshot, spec, seed=seed, mix_gpu_models=mix_gpu_models)
    queue = _ahead_phrase(ahead)
    if got.allocation is not None:
        where = ", ".join(got.allocation.nodes)
        message = f"fits now: {len(spec.components or [])} components, {spec.total_gpus:g} GPUs on {where}"
        message += f"; waiting because {queue}" if queue else "; it will be placed in the next cycle"
        constraint = "queue" if ahead else "none"
        return Explanation(
            got.allocation.domain, constraint, spec.total_gpus, message, where, ahead=ahead, fits_now=True
        )
    exp = got.explanation
    assert exp is not None
    return replace(exp, message=exp.message + (f"; {queue}" if queue else ""), ahead=ahead)


def _ahead_phrase(ahead: tuple[str, ...]) -> str:
    if not ahead:
        return ""
    shown = ", ".join(ahead[:3]) + (", ..." if len(ahead) > 3 else "")
    return f"{len(ahead)} higher-priority job{'s' if len(ahead) > 1 else ''} ahead ({shown})"


def _victims(
    snapshot: Holdings, req: GangRequest, priority: int, preemptible: Sequence[Preemptible], seed: int
) -> tuple[str, ...]:
    """One victim if any suffices (lowest priority, smallest first); else the fewest of them that make room.

    Only jobs holding GPUs the gang may use (its models, --constraint, rank size) are candidates, and every set is
    checked by placement, as the preemption service checks its victims: a job whose nodes the placement that its
    eviction allows does not touch is spared, so the answer never names a job on GPUs of another kind."""
    # As the cluster places it: a TP group over NVL72 trays is eligible tray by tray (`fitters.adapt`).
    eligible = static_eligible(snapshot.layout, adapt(snapshot.layout, req))
    by_name = snapshot.layout.by_name
    pool = sorted(
        (p for p in preemptible if p[2] < priority and any(eligible[by_name[n]] for n in p[1].nodes if n in by_name)),
        key=lambda p: (p[2], _gpus(p[1]), p[0]),
    )
    for job_id, alloc, _ in pool:
        if _placed_without(snapshot, req, [alloc], seed) is not None:
            return (job_id,)
    for n in range(2, len(pool) + 1):
        got = _placed_without(snapshot, req, [a for _, a, _ in pool[:n]], seed)
        if got is not None:
            return _fewest(snapshot, req, pool[:n], got, seed)
    return ()


def _fewest(
    snapshot: Holdings, req: GangRequest, chosen: Sequence[Preemptible], placed: Allocation, seed: int
) -> tuple[str, ...]:
    """Spare the victims the placement does not touch, then each one (most costly first) it can do without."""
    nodes = set(placed.nodes)
    kept = [p for p in chosen if nodes.intersection(p[1].nodes)]
    if _placed_without(snapshot, req, [a for _, a, _ in kept], seed) is None:
        kept = list(chosen)
    for victim in sorted(kept, key=lambda p: (-p[2], -_gpus(p[1]), p[0])):
        rest = [p for p in kept if p is not victim]
        if rest and _placed_without(snapshot, req, [a for _, a, _ in rest], seed) is not None:
            kept = rest
    return tuple(p[0] for p in chosen if p in kept)


def _placed_without(snapshot: Holdings, req: GangRequest, allocs: list[Allocation], seed: int) -> Allocation | None:
    """Where the gang goes once `allocs` are released, or None."""
    state = snapshot.mutable_copy()
    try:
        for a in allocs:
            state.release(a)
    except AllocationConflict:
        return None
    return place_request(state, req, seed=seed).allocation


def _gpus(alloc: Allocation) -> float:
    return sum(len(r.gpus) * (r.gpu_milli / 1000 if r.gpu_milli else 1) for r in alloc.ranks)
