"""`oneplus jobs explain`: why a job is pending, what is ahead of it, and whose preemption would make room."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Protocol

from oneplus_contracts import Allocation, JobSpec

from .diagnosis import Explanation
from .greedy import place_request
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
) -> Explanation:
    """Which constraint blocks at which level; the jobs queued ahead; the cheapest preemption that makes room.

    Only preemptible jobs of lower priority than `spec` are considered, lowest priority (then fewest GPUs) first;
    one victim is preferred to several.
    """
    ahead_ids = tuple(a if isinstance(a, str) else a.job_id for a in ahead)
    try:
        req = GangRequest.of(spec)
    except InvalidRequest as exc:
        return Explanation("request", "spec", spec.total_gpus, str(exc))
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


def _ahead_phrase(ahead: tuple[str, ...]) -> str:
    if not ahead:
        return ""
    shown = ", ".join(ahead[:3]) + (", ..." if len(ahead) > 3 else "")
    return f"{len(ahead)} higher-priority job{'s' if len(ahead) > 1 else ''} ahead ({shown})"


def _victims(
    snapshot: Holdings, req: GangRequest, priority: int, preemptible: Sequence[Preemptible], seed: int
) -> tuple[str, ...]:
    """One victim if any suffices (lowest priority, smallest first); else the shortest such prefix of all of them."""
    pool = sorted(
        (p for p in preemptible if p[2] < priority),
        key=lambda p: (p[2], _gpus(p[1]), p[0]),
    )
    for job_id, alloc, _ in pool:
        if _fits_without(snapshot, req, [alloc], seed):
            return (job_id,)
    taken: list[Allocation] = []
    for n, (_, alloc, _) in enumerate(pool):
        taken.append(alloc)
        if n > 0 and _fits_without(snapshot, req, taken, seed):
            return tuple(p[0] for p in pool[: n + 1])
    return ()


def _fits_without(snapshot: Holdings, req: GangRequest, allocs: list[Allocation], seed: int) -> bool:
    state = snapshot.mutable_copy()
    try:
        for a in allocs:
            state.release(a)
    except AllocationConflict:
        return False
    return place_request(state, req, seed=seed).placed


def _gpus(alloc: Allocation) -> float:
    return sum(len(r.gpus) * (r.gpu_milli / 1000 if r.gpu_milli else 1) for r in alloc.ranks)
