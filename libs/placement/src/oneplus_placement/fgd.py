"""Fragmentation gradient descent (Weng et al., "Beware of Fragmentation", USENIX ATC '23): the measure and score.

A node's fragmentation for a workload mix is the GPU capacity (milli-GPUs) the typical jobs of the mix could not
use there, weighted by how common each is: all of its idle capacity for a job it cannot host (model, whole GPUs,
CPU, and memory for a meter given the mix's memory), else the GPUs too small for the job's share. FGD places a job
where this grows least, scored as its kube-scheduler plugin scores (`gradient_score`). The simulator's FGD protocol
(`oneplus_sim.fgd`) and the live placement policy (`fitters.FgdWholeGpuFitter`, `fitters.FgdShareFitter`) read the
same meter and score; the live policy's meter reads memory, the reference's (the `fgd` baseline) does not.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, TypeVar

from .snapshot import FULL_SHARE as MILLI  # a whole GPU, in milli-GPUs

GpuState = tuple[int, ...]  # milli-GPUs left per GPU, sorted descending
# The reference's fragmentation cases (NodeGpuShareFragAmount) that count: a job lacks GPUs and CPU, lacks GPUs, lacks
# CPU, is CPU-only and fits, is CPU-only and does not, or cannot use the GPU model.
FragCase = Literal["Q1", "Q2", "Q4", "XL", "XR", "NA"]
MAX_SCORE = 100  # kube-scheduler's MaxNodeScore: a plugin scores a node 0..100 in whole points


def gradient_score(drop: float) -> int:
    """FGD's score for a placement that lowers the node's expected fragmentation by `drop` milli-GPUs (negative: it
    grows): sigmoid(drop / 1000) in whole points of 0..100, as the FGD plugin hands it to kube-scheduler. The whole
    points are part of the policy, not a rounding: nodes within a point tie and the tie-break (an idle node last,
    then a fixed node order) packs them. On openb at 130% demand exact scores placed 94.0% of GPUs, whole points
    95.4% (docs/simulator.md)."""
    x = drop / 1000
    return int(1.0 / (1.0 + math.exp(-x)) * MAX_SCORE) if x > -700 else 0


class Shape(Protocol):
    """What the meter reads of a job: CPU (milli-cores), GPU share per GPU (milli, 0: no GPU), GPUs, models."""

    @property
    def cpu(self) -> int: ...
    @property
    def milli(self) -> int: ...
    @property
    def n_gpu(self) -> int: ...
    @property
    def models(self) -> str: ...


S = TypeVar("S", bound=Shape)


@dataclass(frozen=True, slots=True)
class WorkloadShape:
    cpu: int
    milli: int
    n_gpu: int
    models: str = ""  # "" = any GPU model, else "A|B"


def typical_shapes(shapes: Iterable[S], popularity: float = 95.0) -> list[tuple[S, float]]:
    """The most frequent shapes covering `popularity` % of the jobs, with renormalised frequencies (the paper's
    "typical pods"); ties go to the larger CPU, share, GPU count and model names, as the reference sorts."""
    counts: dict[S, int] = {}
    for s in shapes:
        counts[s] = counts.get(s, 0) + 1
    total = sum(counts.values())
    order = sorted(counts.items(), key=lambda kv: (kv[1], kv[0].cpu, kv[0].milli, kv[0].n_gpu, kv[0].models))
    order.reverse()
    chosen: list[tuple[S, int]] = []
    cum = 0
    for shape, n in order:
        if cum >= popularity * total / 100:
            break
        chosen.append((shape, n))
        cum += n
    return [(shape, n / cum) for shape, n in chosen]


K = TypeVar("K", bound=Hashable)


def memory_asks(typical: Sequence[tuple[K, float]], asks: Iterable[tuple[K, int]]) -> list[list[int]]:
    """For each typical shape, the memory (MiB) its jobs ask, from (shape, memory) of every job of the mix."""
    by_shape: Mapping[K, list[int]] = {shape: [] for shape, _ in typical}
    for shape, mem in asks:
        got = by_shape.get(shape)
        if got is not None:
            got.append(mem)
    return [by_shape[shape] for shape, _ in typical]


def accessible(model: str, wanted: str) -> bool:
    return not wanted or (bool(model) and model in wanted.split("|"))


def untouched(left: Sequence[int]) -> bool:
    """Every GPU of the node whole and free: FGD keeps such a node for last among nodes of equal score."""
    return bool(left) and all(x == MILLI for x in left)


def hosts(left: Sequence[int], shape: Shape) -> bool:
    return sum(1 for x in left if x >= shape.milli) >= shape.n_gpu


class FragMeter:
    """Expected milli-GPUs a node wastes for the typical mix (the reference's NodeGpuShareFragAmount).

    `multi_rank`: the mix holds gangs of several ranks, which need whole leaves (FGD then keeps leaf fill).
    `memory`: for each typical shape, in the mix's order, the memory (MiB) its jobs ask. Given it, the measure reads
    the node's memory left as FGD reads its CPU left: a job that memory cannot hold finds every idle GPU of the node
    unusable. Without it (the reference's measure) memory is not read."""

    def __init__(
        self,
        typical: Sequence[tuple[Shape, float]],
        multi_rank: bool = False,
        memory: Sequence[Sequence[int]] | None = None,
    ) -> None:
        self.typical = list(typical)
        self.multi_rank = multi_rank
        self._cache: dict[tuple[str, int, GpuState], float] = {}
        self.memory: list[list[int]] | None = None
        if memory is not None:
            if len(memory) != len(self.typical):
                raise ValueError(f"memory: {len(memory)} lists of asks for {len(self.typical)} typical shapes")
            if any(not asks for asks in memory):
                raise ValueError("memory: a typical shape has no memory asks")
            self.memory = [sorted(asks) for asks in memory]
        # Every memory left between two consecutive asks holds the same jobs, so one entry serves them all.
        self._cuts = sorted({m for asks in self.memory or () for m in asks})
        self._mem_cache: dict[tuple[str, int, GpuState, int], float] = {}

    def frag(self, model: str, cpu_left: int, left: GpuState, mem_left: int | None = None) -> float:
        """The node's expected fragmentation; `mem_left` (MiB) is read only by a meter given `memory`."""
        if self.memory is None or mem_left is None:
            key = (model, cpu_left, left)
            v = self._cache.get(key)
            if v is None:
                v = self._cache[key] = self._compute(model, cpu_left, left)
            return v
        mkey = (model, cpu_left, left, bisect.bisect_right(self._cuts, mem_left))
        v = self._mem_cache.get(mkey)
        if v is None:
            v = self._mem_cache[mkey] = self._compute_with_memory(model, cpu_left, left, mem_left, self.memory)
        return v

    def _compute(self, model: str, cpu_left: int, left: GpuState) -> float:
        out = 0.0
        for _case, amount in self.terms(model, cpu_left, left):
            out += amount
        return out

    def _compute_with_memory(
        self, model: str, cpu_left: int, left: GpuState, mem_left: int, memory: Sequence[Sequence[int]]
    ) -> float:
        """Each typical job's term as FGD has it for the share of its jobs that fit the memory left; for the rest,
        every idle GPU."""
        idle = sum(left)
        out = 0.0
        terms = zip(self.terms(model, cpu_left, left), self.typical, memory, strict=True)  # one term a typical shape
        for (_case, amount), (_shape, freq), asks in terms:
            fit = bisect.bisect_right(asks, mem_left) / len(asks)
            out += fit * amount + (1.0 - fit) * freq * idle
        return out

    def terms(self, model: str, cpu_left: int, left: GpuState) -> Iterator[tuple[FragCase, float]]:
        """Each typical job's share of the node's fragmentation, in the mix's order, with the reference's case for it
        (what counts: every idle GPU, or for a job that fits, the GPUs too small for its share)."""
        idle = sum(left)
        for shape, freq in self.typical:
            if not shape.milli:  # CPU-only jobs count every idle GPU, fitting or not (XL and XR: as the reference)
                yield ("XL" if cpu_left >= shape.cpu else "XR"), freq * idle
            elif not accessible(model, shape.models):
                yield "NA", freq * idle
            elif hosts(left, shape):
                if cpu_left >= shape.cpu:  # Q3: only GPUs too small for it count (the reference adds them to Q2)
                    yield "Q2", freq * sum(x for x in left if x < shape.milli)
                else:
                    yield "Q4", freq * idle
            else:
                yield ("Q2" if cpu_left >= shape.cpu else "Q1"), freq * idle


def after(left: GpuState, shape: Shape) -> list[GpuState]:
    """GPU states the job can leave behind: one per distinct GPU for a share, one for whole GPUs."""
    if not shape.milli:
        return [left]
    if shape.n_gpu == 1 and shape.milli < MILLI:
        outs = []
        for x in sorted(set(left)):
            if x >= shape.milli:
                lst = list(left)
                lst[lst.index(x)] = x - shape.milli
                outs.append(tuple(sorted(lst, reverse=True)))
        return outs
    lst = list(left)
    taken = 0
    for i in range(len(lst) - 1, -1, -1):  # ascending: pack into the least sufficient (full) GPUs
        if taken < shape.n_gpu and lst[i] >= shape.milli:
            lst[i] -= shape.milli
            taken += 1
    return [tuple(sorted(lst, reverse=True))]
