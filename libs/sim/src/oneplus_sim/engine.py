"""The discrete-event simulator: arrivals, completions and preemptions drive one policy's scheduling cycles.

Time advances from event to event; after all events of one instant are applied, the policy runs one cycle
against the live `Occupancy` through this module's `SimContext` (start a job, preempt a job). A job runs
`remaining × slowdown` where the slowdown comes from the communication model of its placement.
"""

from __future__ import annotations

import bisect
import heapq
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from .cluster import SimCluster
from .comm import IdealRing, allocation_ring_gbps, slowdown, tp_slowdown
from .state import MILLI, Occupancy, Placement
from .trace import SimJob

ARRIVE, FINISH, RELEASE, WAKE = 0, 1, 2, 3
ELASTIC_RECHECK_S = 600.0  # how often an elastic policy looks for growth when no event comes


class Policy(Protocol):
    name: str

    def queue_key(self, job: SimJob) -> tuple[float, ...]:
        """Order of the pending queue this policy keeps."""
        ...

    def schedule(self, ctx: SimContext) -> None:
        """One scheduling cycle at ctx.now: call ctx.start / ctx.preempt."""
        ...


@dataclass(slots=True)
class Running:
    job: SimJob
    placement: Placement
    start_s: float
    slowdown: float
    done_at_start: float
    epoch: int
    end_s: float

    def limit_end_s(self) -> float:
        """When a scheduler that knows only the job's time limit expects it to end: the limit less the work done
        before this start (with oracle limits, start + the remaining run time)."""
        return self.start_s + self.job.limit_s - self.done_at_start


@dataclass(slots=True)
class JobRecord:
    job: SimJob
    queued_since: float
    wait_s: float = 0.0
    first_start_s: float | None = None
    finish_s: float | None = None
    preemptions: int = 0
    lost_gpu_s: float = 0.0
    # (gpu-weighted ideal work of the segment, slowdown, B, B*, tightest?)
    segments: list[tuple[float, float, float, float, bool]] = field(default_factory=list)
    placements: list[tuple[tuple[int, tuple[int, ...]], ...]] = field(default_factory=list)
    # Per start of a job with TP groups: (groups inside one NVLink domain, groups)
    tp_groups: list[tuple[int, int]] = field(default_factory=list)


@dataclass
class SimResult:
    policy: str
    records: dict[str, JobRecord]
    unplaced: list[str]
    start_s: float
    end_s: float
    alloc_gpu_s: float
    free_gpu_s: float
    unusable_free_gpu_s: float
    cycle_ms: list[float]
    preemptions: int
    series_t: list[float]
    series_alloc: list[float]
    series_pending: list[int]
    gpu_busy: list[list[float]]
    total_gpus: int
    counters: dict[str, int] = field(default_factory=dict)  # the policy's own (`oneplus`: cp-sat plans used)

    @property
    def placements(self) -> dict[str, list[tuple[tuple[int, tuple[int, ...]], ...]]]:
        """Per job, the (node, GPUs) of each rank, for every time it started."""
        return {k: r.placements for k, r in self.records.items()}


class SimContext:
    """What a policy sees and may do during one cycle."""

    def __init__(self, sim: Simulation) -> None:
        self._sim = sim

    @property
    def now(self) -> float:
        return self._sim.now

    @property
    def cluster(self) -> SimCluster:
        return self._sim.cluster

    @property
    def occ(self) -> Occupancy:
        return self._sim.occ

    @property
    def pending(self) -> Sequence[SimJob]:
        """Pending jobs in the policy's queue order. Do not mutate; start() removes from it."""
        return self._sim.pending

    @property
    def running(self) -> dict[str, Running]:
        return self._sim.running

    def start(self, job: SimJob, placement: Placement) -> None:
        self._sim.start(job, placement)

    def preempt(self, job_id: str, *, checkpoint: bool = False, counted: bool = True) -> None:
        """`checkpoint`: it writes a checkpoint at the signal (an elastic resize) and loses no work; `counted`: a
        preemption in the figures (an elastic job growing is not)."""
        self._sim.preempt(job_id, checkpoint=checkpoint, counted=counted)


class Simulation:
    def __init__(
        self,
        cluster: SimCluster,
        jobs: Sequence[SimJob],
        policy: Policy,
        *,
        preempt_grace_s: float = 30.0,
        on_progress: Callable[[int], None] | None = None,
    ) -> None:
        self.cluster = cluster
        self.policy = policy
        self.occ = Occupancy(cluster)
        self.ideal = IdealRing(cluster)
        self.grace = preempt_grace_s
        self.on_progress = on_progress
        self.now = 0.0
        self.pending: list[SimJob] = []
        self._pending_keys: list[tuple[float, ...]] = []
        self.running: dict[str, Running] = {}
        self.records: dict[str, JobRecord] = {}
        self._events: list[tuple[float, int, int, str, int]] = []
        self._seq = 0
        self._jobs = {j.job_id: j for j in jobs}
        if len(self._jobs) != len(jobs):
            raise ValueError("job ids in a trace must be unique")
        for j in jobs:
            self._push(j.submit_s, ARRIVE, j.job_id, 0)
        self._epochs: dict[str, int] = {}
        self._cycle_ms: list[float] = []
        self._preemptions = 0
        self._last_t = jobs[0].submit_s if jobs else 0.0
        self._t0 = self._last_t
        self._alloc_gpu_s = self._free_gpu_s = self._unusable_gpu_s = 0.0
        self._series: tuple[list[float], list[float], list[int]] = ([], [], [])
        self._busy = [[0.0] * g for g in self.occ.n_gpus]
        self._busy_since: dict[tuple[int, int], tuple[float, int]] = {}
        self._finished = 0
        self._interval = float(getattr(policy, "min_cycle_interval_s", 0.0))
        self._last_cycle = -math.inf
        self._wake_at: float | None = None

    # ---- event plumbing ------------------------------------------------------------------------
    def _push(self, t: float, kind: int, job_id: str, epoch: int) -> None:
        self._seq += 1
        heapq.heappush(self._events, (t, kind, self._seq, job_id, epoch))

    def _advance(self, t: float) -> None:
        dt = t - self._last_t
        if dt > 0:
            occ = self.occ
            self._alloc_gpu_s += occ.allocated_gpus * dt
            self._free_gpu_s += occ.total_free_whole * dt
            self._unusable_gpu_s += (occ.total_free_whole - occ.gang_usable_free) * dt
        self._last_t = t
        self.now = t

    def _sample(self) -> None:
        ts, alloc, pend = self._series
        ts.append(self.now)
        alloc.append(self.occ.allocated_gpus)
        pend.append(len(self.pending))

    def run(self) -> SimResult:
        while self._events:
            t = self._events[0][0]
            self._advance(t)
            while self._events and self._events[0][0] == t:
                _, kind, _, job_id, epoch = heapq.heappop(self._events)
                if kind == ARRIVE:
                    self._enqueue(self._jobs[job_id])
                elif kind == FINISH:
                    self._finish(job_id, epoch)
                elif kind == RELEASE:
                    self._release_preempted(job_id)
                else:
                    self._wake_at = None
            if self.pending or self._may_grow():
                self._cycle()
            self._sample()
        return self._result()

    def _cycle(self) -> None:
        """Run the policy now, or wake up when its minimum interval between cycles has passed."""
        due = self._last_cycle + self._interval
        if self.now < due:
            if self._wake_at is None:
                self._wake_at = due
                self._push(due, WAKE, "", 0)
            return
        self._last_cycle = self.now
        t0 = time.perf_counter()
        self.policy.schedule(SimContext(self))
        self._cycle_ms.append((time.perf_counter() - t0) * 1000)
        if self._wake_at is None and self._may_grow():
            # A gang below its maximum may grow once its minimum run time has passed: look again later even if no
            # event comes.
            self._wake_at = self.now + max(self._interval, ELASTIC_RECHECK_S)
            self._push(self._wake_at, WAKE, "", 0)

    def _may_grow(self) -> bool:
        """An elastic policy runs a cycle with nobody pending while an elastic gang runs below its maximum."""
        if not getattr(self.policy, "elastic", False):
            return False
        return any(r.job.elastic_max and r.job.ranks < r.job.elastic_max for r in self.running.values())

    def _result(self) -> SimResult:
        ts, alloc, pend = self._series
        end = max((r.finish_s or 0.0) for r in self.records.values()) if self.records else self._t0
        return SimResult(
            policy=self.policy.name,
            records=self.records,
            unplaced=[j.job_id for j in self.pending],
            start_s=self._t0,
            end_s=max(end, self._t0),
            alloc_gpu_s=self._alloc_gpu_s,
            free_gpu_s=self._free_gpu_s,
            unusable_free_gpu_s=self._unusable_gpu_s,
            cycle_ms=self._cycle_ms,
            preemptions=self._preemptions,
            series_t=ts,
            series_alloc=alloc,
            series_pending=pend,
            gpu_busy=self._busy,
            total_gpus=self.cluster.total_gpus,
            counters=dict(getattr(self.policy, "counters", {})),
        )

    # ---- queue ---------------------------------------------------------------------------------
    def _enqueue(self, job: SimJob) -> None:
        rec = self.records.get(job.job_id)
        if rec is None:
            self.records[job.job_id] = JobRecord(job, queued_since=self.now)
        else:
            rec.queued_since = self.now
        key = self.policy.queue_key(job)
        i = bisect.bisect_right(self._pending_keys, key)
        self._pending_keys.insert(i, key)
        self.pending.insert(i, job)

    def _dequeue(self, job: SimJob) -> None:
        key = self.policy.queue_key(job)
        i = bisect.bisect_left(self._pending_keys, key)
        while self.pending[i] is not job:
            i += 1
        del self.pending[i]
        del self._pending_keys[i]

    # ---- what policies call --------------------------------------------------------------------
    def start(self, job: SimJob, placement: Placement) -> None:
        if job.elastic_max:
            job.ranks = len(placement.slots)  # an elastic gang runs with the ranks it was placed with
        self.occ.take(job, placement)
        self._dequeue(job)
        self._mark_busy(placement)
        rec = self.records[job.job_id]
        rec.wait_s += self.now - rec.queued_since
        if rec.first_start_s is None:
            rec.first_start_s = self.now
        if job.tp_group and job.is_multi_gpu:
            s, b, b_star, inside, groups = tp_slowdown(
                self.cluster, self.ideal, job.comm_fraction, job.tp_group, job.gpus_per_rank, placement.slots
            )
            rec.tp_groups.append((inside, groups))
        else:
            b = allocation_ring_gbps(self.cluster, placement.slots) if job.is_multi_gpu else 0.0
            b_star = self.ideal(job.ranks, job.gpus_per_rank) if job.is_multi_gpu else 0.0
            s = slowdown(job.comm_fraction, b_star, b)
        epoch = self._epochs.get(job.job_id, 0) + 1
        self._epochs[job.job_id] = epoch
        pace = s / job.speed  # wall seconds per second of full-size work: comm slowdown, and fewer ranks if elastic
        end = self.now + job.remaining_s * pace
        self.running[job.job_id] = Running(job, placement, self.now, pace, job.done_s, epoch, end)
        rec.segments.append((0.0, s, b, b_star, self._tightest(job, placement)))
        rec.placements.append(placement.slots)
        self._push(end, FINISH, job.job_id, epoch)

    def preempt(self, job_id: str, *, checkpoint: bool = False, counted: bool = True) -> None:
        run = self.running.pop(job_id)
        job = run.job
        progress = min(job.duration_s, run.done_at_start + (self.now - run.start_s) / run.slowdown)
        interval = job.checkpoint_interval_s
        saved = max(job.saved_s, math.floor(progress / interval) * interval) if interval else 0.0
        if checkpoint:
            saved = progress  # written at the signal, during the grace it holds its GPUs for
        rec = self.records[job_id]
        rec.preemptions += counted
        rec.lost_gpu_s += (progress - saved) * job.gpus * job.speed
        self._close_segment(rec, job, progress - run.done_at_start)
        job.done_s = job.saved_s = saved
        self._epochs[job_id] = run.epoch + 1
        self._preemptions += counted
        # The victim holds its GPUs while it writes its checkpoint, then goes back to the queue.
        self._push(self.now + self.grace, RELEASE, job_id, 0)

    # ---- event handlers ------------------------------------------------------------------------
    def _finish(self, job_id: str, epoch: int) -> None:
        run = self.running.get(job_id)
        if run is None or run.epoch != epoch:
            return
        del self.running[job_id]
        job = run.job
        self._close_segment(self.records[job_id], job, job.duration_s - run.done_at_start)
        job.done_s = job.duration_s
        placement = self.occ.release(job)
        self._mark_free(placement)
        self._tell_released(job)
        self.records[job_id].finish_s = self.now
        self._finished += 1
        if self.on_progress:
            self._report_progress()

    def _report_progress(self) -> None:
        assert self.on_progress is not None
        self.on_progress(self._finished)

    def _release_preempted(self, job_id: str) -> None:
        job = self._jobs[job_id]
        self._mark_free(self.occ.release(job))
        self._tell_released(job)
        self._enqueue(job)

    def _tell_released(self, job: SimJob) -> None:
        """Policies that mirror the cluster (oneplus) hear when a job gives its GPUs back."""
        hook = getattr(self.policy, "released", None)
        if hook is not None:
            hook(job)

    def _close_segment(self, rec: JobRecord, job: SimJob, work_s: float) -> None:
        _, s, b, bs, tight = rec.segments[-1]
        rec.segments[-1] = (max(work_s, 0.0) * job.gpus, s, b, bs, tight)

    # ---- accounting ----------------------------------------------------------------------------
    def _mark_busy(self, p: Placement) -> None:
        share = (p.gpu_milli or MILLI) / MILLI
        for node, gpus in p.slots:
            for g in gpus:
                self._bank((node, g))
                _, cur = self._busy_since.get((node, g), (self.now, 0))
                self._busy_since[(node, g)] = (self.now, cur + round(share * MILLI))

    def _mark_free(self, p: Placement) -> None:
        share = p.gpu_milli or MILLI
        for node, gpus in p.slots:
            for g in gpus:
                self._bank((node, g))
                t, cur = self._busy_since[(node, g)]
                self._busy_since[(node, g)] = (t, cur - share)

    def _bank(self, key: tuple[int, int]) -> None:
        since = self._busy_since.get(key)
        if since is not None:
            t, milli = since
            self._busy[key[0]][key[1]] += (self.now - t) * milli / MILLI
            self._busy_since[key] = (self.now, milli)

    def _tightest(self, job: SimJob, p: Placement) -> bool:
        """Is the job inside the tightest domain that could hold it on the empty cluster?"""
        c = self.cluster
        total = job.ranks * max(job.gpus_per_rank, 1)
        if job.ranks == 1:
            kind = c.nodes[p.slots[0][0]].kind
            if total <= max(k.largest_nvlink_domain for k in c.kinds):
                gpus = set(p.slots[0][1])
                return any(gpus <= d for d in kind.nvlink_domains)
            return True
        nvlink = c.layout.level("nvlink")
        if nvlink is not None:
            # A multi-node NVLink domain (an NVL72 rack) that could hold the gang is tighter than any leaf.
            per_rank = max(job.gpus_per_rank, 1)
            fits_domain = any(
                len(m) > 1 and sum(c.nodes[i].kind.n_gpus // per_rank for i in m) >= job.ranks for m in nvlink.members
            )
            if fits_domain:
                return len({nvlink.of_node[n] for n in p.nodes}) == 1
        fits_leaf = any(
            sum(1 for i in nodes if c.nodes[i].kind.n_gpus >= job.gpus_per_rank) >= job.ranks
            for nodes in c.leaves.values()
        )
        return not fits_leaf or len({c.nodes[n].leaf for n in p.nodes}) == 1
