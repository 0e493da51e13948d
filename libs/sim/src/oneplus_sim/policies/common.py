"""Pieces the baseline policies share: a scratch view of free capacity, GPU pickers, the skip memo, the best-effort
loop."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache
from itertools import combinations

from ..cluster import NodeKind, SimCluster
from ..engine import SimContext
from ..state import MILLI, Occupancy, Placement
from ..trace import SimJob


class FreeView:
    """Free GPUs per node that a policy can tentatively consume while it plans one gang."""

    def __init__(self, occ: Occupancy) -> None:
        self.occ = occ
        self.cluster: SimCluster = occ.cluster
        self._left: dict[int, list[int]] = {}
        self._cpu: dict[int, float] = {}
        self._mem: dict[int, int] = {}

    def left(self, node: int) -> list[int]:
        v = self._left.get(node)
        return v if v is not None else self.occ.gpu_left[node]

    def free_count(self, node: int) -> int:
        v = self._left.get(node)
        if v is None:
            return self.occ.free_whole[node]
        return sum(1 for x in v if x == MILLI)

    def free_gpus(self, node: int) -> list[int]:
        return [g for g, x in enumerate(self.left(node)) if x == MILLI]

    def fits(self, node: int, job: SimJob) -> bool:
        occ = self.occ
        if self._cpu.get(node, occ.cpu_left[node]) < job.cpus:
            return False
        if self._mem.get(node, occ.mem_left[node]) < job.memory_mb:
            return False
        if job.gpu_models and self.cluster.nodes[node].kind.gpu_model not in job.gpu_models:
            return False
        if job.gpu_milli:
            return any(x >= job.gpu_milli for x in self.left(node))
        return self.free_count(node) >= job.gpus_per_rank

    def capacity(self, node: int, job: SimJob) -> int:
        """How many more ranks of `job` this node can take (GPU count only, plus the CPU/memory/model gate)."""
        if not self.fits(node, job):
            return 0
        if job.gpu_milli:
            return sum(x // job.gpu_milli for x in self.left(node))
        return self.free_count(node) // max(job.gpus_per_rank, 1) if job.gpus_per_rank else 1

    def take(self, node: int, gpus: Sequence[int], job: SimJob) -> None:
        left = list(self.left(node))
        for g in gpus:
            left[g] -= job.gpu_milli or MILLI
        self._left[node] = left
        self._cpu[node] = self._cpu.get(node, self.occ.cpu_left[node]) - job.cpus
        self._mem[node] = self._mem.get(node, self.occ.mem_left[node]) - job.memory_mb


GpuPicker = Callable[[FreeView, int, SimJob], tuple[int, ...]]


def lowest_gpus(view: FreeView, node: int, job: SimJob) -> tuple[int, ...]:
    """Device-plugin default: the lowest free indexes (first GPU with room for a share)."""
    if job.gpu_milli:
        return (next(g for g, x in enumerate(view.left(node)) if x >= job.gpu_milli),)
    return tuple(view.free_gpus(node)[: job.gpus_per_rank])


def most_linked_gpus(view: FreeView, node: int, job: SimJob) -> tuple[int, ...]:
    """Slurm's GRES pick with NVLink links: the free GPUs with the most NVLink bandwidth among themselves."""
    if job.gpu_milli:
        fit = [(x, g) for g, x in enumerate(view.left(node)) if x >= job.gpu_milli]
        return (min(fit)[1],)
    free = tuple(view.free_gpus(node))
    kind = view.cluster.nodes[node].kind
    k = job.gpus_per_rank
    if k <= 1 or k >= len(free) or not any(any(row) for row in kind.nvlink):
        return free[:k]
    return _most_linked(kind, free, k)


@lru_cache(maxsize=8192)
def _most_linked(kind: NodeKind, free: tuple[int, ...], k: int) -> tuple[int, ...]:
    m, links = kind.pair_gbps, kind.nvlink

    def weight(combo: tuple[int, ...]) -> float:
        return sum(m[a][b] for a, b in combinations(combo, 2) if links[a][b])

    return max(combinations(free, k), key=lambda c: (weight(c), [-g for g in c]))


class SkipMemo:
    """Within one cycle: a plain gang of shape (ranks, GPUs per rank) that failed makes every bigger one fail."""

    def __init__(self) -> None:
        self.failed: list[tuple[int, int]] = []

    @staticmethod
    def _plain(job: SimJob) -> bool:
        return not (job.gpu_milli or job.cpus or job.memory_mb or job.gpu_models)

    def skip(self, job: SimJob) -> bool:
        if not self._plain(job):
            return False
        return any(job.ranks >= r and job.gpus_per_rank >= g for r, g in self.failed)

    def add(self, job: SimJob) -> None:
        if self._plain(job):
            self.failed.append((job.ranks, job.gpus_per_rank))


def nothing_fits(occ: Occupancy, job: SimJob) -> bool:
    """Cheap total-capacity test before any search."""
    if job.gpu_milli:
        return False
    return occ.total_free_whole < job.ranks * job.gpus_per_rank


def best_effort_schedule(ctx: SimContext, place: Callable[[FreeView, SimJob], Placement | None]) -> None:
    """BestEffortFIFO: every pending job in queue order is tried; one that does not fit blocks nobody."""
    memo = SkipMemo()
    for job in list(ctx.pending):
        if nothing_fits(ctx.occ, job) or memo.skip(job):
            continue
        p = place(FreeView(ctx.occ), job)
        if p is None:
            memo.add(job)
            continue
        ctx.start(job, p)
