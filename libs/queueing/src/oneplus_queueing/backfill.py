"""Head-of-line protection: when the head job cannot fit, find the block (a domain) and the time it will start.

The blockers' end times come from their time limits (a job with none never ends, for planning). Placement is
re-run on the state with the earliest-ending jobs released, binary-searching the number released, so the reserved
block is a real placement of the head, not a GPU count. Jobs that jumped the queue by backfill while the head
waited and may be evicted for it count as releasable once their protection runs out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from oneplus_contracts import Allocation, JobSpec
from oneplus_placement.fitters import adapt, static_eligible
from oneplus_placement.request import GangRequest, InvalidRequest

from .capacity import Capacity, working_copy
from .config import QueueConfig
from .model import Reservation, RunningJob
from .ordering import RankedJob
from .quota import QuotaLedger
from .victims import eviction_grounds, protected_until


@dataclass(frozen=True, slots=True)
class Release:
    ts: float
    job_id: str
    allocation: Allocation


def planned_releases(
    now: float,
    jobs: Sequence[RunningJob],
    config: QueueConfig,
    releasable_at: Callable[[RunningJob], float | None],
) -> tuple[list[Release], list[Release]]:
    """(releases with a known time, sorted; releases that never come) for the jobs that hold GPUs."""
    timed: list[Release] = []
    never: list[Release] = []
    default = config.backfill.default_time_limit_s
    for job in jobs:
        ends = job.end_ts(default)
        early = releasable_at(job)
        if early is not None:
            ends = early if ends is None else min(ends, early)
        rel = Release(max(now, ends) if ends is not None else 0.0, job.job_id, job.allocation)
        (timed if ends is not None else never).append(rel)
    timed.sort(key=lambda r: (r.ts, r.job_id))
    return timed, never


class _Prefix:
    """A private copy of the state with the first `k` releases released; moves `k` with as few changes as possible."""

    def __init__(self, capacity: Capacity, releases: Sequence[Release]) -> None:
        self.capacity = capacity.derived(working_copy(capacity.state))
        self.releases = releases
        self.k = 0

    def move(self, k: int) -> None:
        while self.k < k:
            self.capacity.release(self.releases[self.k].allocation)
            self.k += 1
        while self.k > k:
            self.k -= 1
            self.capacity.apply(self.releases[self.k].allocation)

    def place(self, k: int, spec: JobSpec, job_id: str, seed: int) -> Allocation | None:
        self.move(k)
        return self.capacity.place(spec, job_id, seed).allocation


def reserve_block(
    now: float,
    capacity: Capacity,
    head: RankedJob,
    holders: Sequence[RunningJob],
    config: QueueConfig,
    releasable_at: Callable[[RunningJob], float | None],
    seed: int = 0,
) -> Reservation | None:
    """The head's future block and its start; start None when only jobs without a time limit stand in the way.

    `holders` are the jobs whose allocations are applied on `capacity` and may end; `capacity` is not changed.
    Returns None when the head cannot be placed even with every holder gone (e.g. a constraint no domain meets).
    """
    timed, never = planned_releases(now, holders, config, releasable_at)
    spec = head.job.spec
    prefix = _Prefix(capacity, [*timed, *never])
    k, alloc = _earliest(prefix, timed, spec, head.job_id, seed)
    if alloc is not None:
        start: float | None = timed[k - 1].ts if k > 0 else now
    else:
        alloc = prefix.place(len(timed) + len(never), spec, head.job_id, seed)
        start = None
    if alloc is None:
        return None
    domain, name = capacity.alloc_domain(alloc)
    return Reservation(head.job_id, domain, name, tuple(alloc.nodes), start, alloc)


def _earliest(
    prefix: _Prefix, timed: Sequence[Release], spec: JobSpec, job_id: str, seed: int
) -> tuple[int, Allocation | None]:
    """Smallest number of timed releases after which the head fits (binary search; fitting only gets easier).

    Only counts that end a group of equal end times are tried (a start is a release time), from the first count
    at which some allowed domain has enough free units by counting alone.
    """
    first = _first_countable(prefix.capacity, timed, spec)
    steps = [k for k in range(first, len(timed) + 1) if k > 0 and (k == len(timed) or timed[k].ts != timed[k - 1].ts)]
    if first == 0:
        steps.insert(0, 0)
    lo, hi = 0, len(steps) - 1
    found: tuple[int, Allocation | None] = (0, None)
    if steps:  # counting is usually close: try its answer first
        alloc = prefix.place(steps[0], spec, job_id, seed)
        if alloc is not None:
            return steps[0], alloc
        lo = 1
    while lo <= hi:
        mid = (lo + hi) // 2
        alloc = prefix.place(steps[mid], spec, job_id, seed)
        if alloc is not None:
            found = (steps[mid], alloc)
            hi = mid - 1
        else:
            lo = mid + 1
    return found


def _first_countable(capacity: Capacity, timed: Sequence[Release], spec: JobSpec) -> int:
    """The fewest releases after which an allowed domain holds enough whole units of the gang, by count only.

    A node counts `free // unit` units (0 when no unit could ever fit there): an upper bound on what placement finds,
    so fewer releases can never be enough. Shares are not counted (0 is returned).
    """
    try:
        req = GangRequest.of(spec)
    except InvalidRequest:
        return 0
    if req.shared or req.unit_gpus == 0:
        return 0
    layout = capacity.layout
    req = adapt(layout, req)  # a TP group over trays counts its ranks, not whole groups per node
    eligible = static_eligible(layout, req)
    level = req.levels(layout.level_names)[-1]
    site = layout.level(level)
    unit, need = req.unit_gpus, req.units
    free = list(capacity.state.free_count)
    groups: dict[int, int] = {}

    def group_of(i: int) -> int:
        if level == "node":
            return i
        return site.of_node[i] if site is not None else 0

    for i, f in enumerate(free):
        if eligible[i]:
            g = group_of(i)
            groups[g] = groups.get(g, 0) + f // unit
    if any(v >= need for v in groups.values()):
        return 0
    for k, rel in enumerate(timed, start=1):
        for r in rel.allocation.ranks:
            if r.gpu_milli:
                continue
            i = layout.index(r.node)
            if not eligible[i]:
                continue
            g = group_of(i)
            before = free[i] // unit
            free[i] += len(r.gpus)
            groups[g] = groups.get(g, 0) + free[i] // unit - before
            if groups[g] >= need:
                return k
    return len(timed) + 1


def may_use_block(
    now: float, job: RankedJob, reservation: Reservation, head: RankedJob, config: QueueConfig, ledger: QuotaLedger
) -> bool:
    """A job may take reserved GPUs if it ends before the reserved start, or if the head may evict it by then."""
    start = reservation.start_ts
    limit = job.job.spec.time_limit_s
    limit_s = float(limit) if limit is not None else config.backfill.default_time_limit_s
    if start is not None and limit_s is not None and now + limit_s <= start:
        return True
    if not job.preemptible:
        return False
    as_running = RunningJob(job.job_id, job.job.spec, Allocation(ranks=[]), now, preemptions=job.job.preemptions)
    kind = eviction_grounds(head, as_running, config, ledger)
    if kind is None:
        return False
    return start is None or protected_until(as_running, config, kind) <= start
