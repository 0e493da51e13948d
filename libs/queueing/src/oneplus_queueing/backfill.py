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

from .capacity import Capacity, whole_gpus
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
    gpus: int


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
        gpus = sum(len(r.gpus) for r in job.allocation.ranks if not r.gpu_milli)
        rel = Release(max(now, ends) if ends is not None else 0.0, job.job_id, job.allocation, gpus)
        (timed if ends is not None else never).append(rel)
    timed.sort(key=lambda r: (r.ts, r.job_id))
    return timed, never


class _Prefix:
    """Keeps the first `k` releases released on the capacity, moving `k` with as few changes as possible."""

    def __init__(self, capacity: Capacity, releases: Sequence[Release]) -> None:
        self.capacity = capacity
        self.releases = releases
        self.k = 0

    def move(self, k: int) -> None:
        state = self.capacity.state
        while self.k < k:
            state.release(self.releases[self.k].allocation)
            self.k += 1
        while self.k > k:
            self.k -= 1
            state.apply(self.releases[self.k].allocation)


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

    `holders` are the jobs whose allocations are applied on `capacity` and may end; the capacity is restored.
    Returns None when the head cannot be placed even with every holder gone (e.g. a constraint no domain meets).
    """
    timed, never = planned_releases(now, holders, config, releasable_at)
    spec = head.job.spec
    prefix = _Prefix(capacity, [*timed, *never])
    try:
        k, alloc = _earliest(capacity, prefix, timed, spec, head.job_id, seed)
        if alloc is not None:
            start = timed[k - 1].ts if k > 0 else now
        else:
            prefix.move(len(timed) + len(never))
            alloc = capacity.place(spec, head.job_id, seed).allocation
            start = None
    finally:
        prefix.move(0)
    if alloc is None:
        return None
    domain, name = capacity.alloc_domain(alloc)
    return Reservation(head.job_id, domain, name, tuple(alloc.nodes), start, alloc)


def _earliest(
    capacity: Capacity, prefix: _Prefix, timed: Sequence[Release], spec: JobSpec, job_id: str, seed: int
) -> tuple[int, Allocation | None]:
    """Smallest number of timed releases after which the head fits (binary search; fitting only gets easier)."""
    short = whole_gpus(spec) - capacity.free_gpus()
    freed = 0
    steps: list[int] = []  # release counts that end a group of equal end times, and free enough GPUs
    for k, r in enumerate(timed, start=1):
        freed += r.gpus
        if freed >= short and (k == len(timed) or timed[k].ts != r.ts):
            steps.append(k)
    lo, hi = 0, len(steps) - 1
    found: tuple[int, Allocation | None] = (0, None)
    while lo <= hi:
        mid = (lo + hi) // 2
        prefix.move(steps[mid])
        alloc = capacity.place(spec, job_id, seed).allocation
        if alloc is not None:
            found = (steps[mid], alloc)
            hi = mid - 1
        else:
            lo = mid + 1
    return found


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
    if eviction_grounds(head, as_running, config, ledger) is None:
        return False
    return start is None or protected_until(as_running, config) <= start
