"""The FGD protocol (Weng et al., USENIX ATC'23, "Beware of Fragmentation") on Alibaba openb, BENCHMARKS.md §2.

Read from hkust-adsl/kubernetes-scheduler-simulator @8f3d6417 and re-implemented (no code copied):
- workload: every pod of the list, sorted by name then shuffled with the seed; then "tune-up" inflation appends
  pods drawn uniformly (with replacement) from the name-sorted list until one more would push the requested GPU
  milli past `demand` × capacity (the reference checks the per-GPU milli of the candidate but adds its total:
  kept as is). Pods arrive one by one and never leave; a pod that fits nowhere fails, the next one comes.
- filter: CPU, memory, GPU model, and GPUs (a share needs one GPU with enough milli left, n whole GPUs need n idle).
- the node with the highest score wins; ties go to the smallest node name, and the reference prefixes every node
  name with a seeded random permutation index, so ties follow one random node order per seed (its selectHost).
- allocation ratio = allocated GPU milli / capacity; the figure at 130% is the mean over the pod events whose
  arrived demand rounds to 130% (the reference's analysis_allo_discrete); fragmentation = frag milli / idle milli.
Python's random streams draw other workloads than Go's for the same seed, so single seeds differ and means over
seeds are what compare; `oneplus_sim.fgd_reference` loads the reference's own draws (bench/fgd_reference), and a run
given one of those (`Workload`) replays exactly the pods, order and node names behind a published per-seed result.
"""

from __future__ import annotations

import bisect
import csv
import math
import random
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from oneplus_placement.fgd import (
    FragCase,
    FragMeter,
    GpuState,
    accessible,
    after,
    gradient_score,
    hosts,
    typical_shapes,
)

MILLI = 1000
MAX_SCORE = 100
# BestFit's normalisers in the reference (open-gpu-share utils: MaxSpecCpu, MaxSpecGpu)
MAX_SPEC_CPU, MAX_SPEC_GPU = 128_000, 8_000


class FgdInputError(ValueError):
    """A node or pod list that cannot be used, with the file and line."""


@dataclass(frozen=True, slots=True)
class PodRes:
    """What scoring sees of a pod (memory is only filtered, as in the reference's PodResource)."""

    cpu: int
    milli: int  # per GPU; 0 for CPU-only pods
    n_gpu: int
    models: str  # "" = any GPU model, else "A|B"

    @property
    def total_milli(self) -> int:
        return self.milli * self.n_gpu

    @property
    def is_share(self) -> bool:
        return self.n_gpu == 1 and self.milli < MILLI


@dataclass(frozen=True, slots=True)
class Pod:
    name: str
    res: PodRes
    memory: int


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    cpu: int
    memory: int
    n_gpu: int
    model: str


def _int(p: Path, line: int, row: dict[str, str], key: str, default: int | None = None) -> int:
    raw = (row.get(key) or "").strip()
    if raw == "" and default is not None:
        return default
    try:
        return int(float(raw))
    except ValueError:
        raise FgdInputError(f"{p}:{line}: column {key!r} must be a number, got {raw!r}") from None


def _rows(path: Path | str, kind: str, need: set[str]) -> tuple[Path, list[dict[str, str]]]:
    """The rows of an openb CSV after checking it exists and has the columns `need`; errors name the file."""
    p = Path(path)
    if not p.is_file():
        raise FgdInputError(f"{p}: no such {kind}")
    with p.open(newline="") as fh:
        reader = csv.DictReader(fh)
        if not need <= set(reader.fieldnames or ()):
            raise FgdInputError(f"{p}: a {kind} needs columns {sorted(need)}, found {reader.fieldnames}")
        return p, list(reader)


def load_nodes(path: Path | str) -> list[Node]:
    p, rows = _rows(path, "node list", {"sn", "cpu_milli", "memory_mib", "gpu", "model"})
    nodes = [
        Node(
            row["sn"].strip(),
            _int(p, i + 2, row, "cpu_milli"),
            _int(p, i + 2, row, "memory_mib"),
            _int(p, i + 2, row, "gpu"),
            (row.get("model") or "").strip(),
        )
        for i, row in enumerate(rows)
    ]
    if not nodes or not sum(n.n_gpu for n in nodes):
        raise FgdInputError(f"{p}: the node list has no GPU")
    return nodes


def load_pods(path: Path | str) -> list[Pod]:
    p, rows = _rows(path, "pod list", {"name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli"})
    pods = []
    for i, row in enumerate(rows):
        n_gpu, milli = _int(p, i + 2, row, "num_gpu"), _int(p, i + 2, row, "gpu_milli", 0)
        if n_gpu < 0 or milli < 0:
            raise FgdInputError(f"{p}:{i + 2}: num_gpu and gpu_milli must be >= 0")
        milli = 0 if n_gpu == 0 else min(milli, MILLI)
        if n_gpu and not milli:
            n_gpu = 0  # the reference's annotation: a GPU count without milli asks for no GPU
        cpu = _int(p, i + 2, row, "cpu_milli") or 100  # kube-scheduler's non-zero default request
        models = "|".join(x for x in (row.get("gpu_spec") or "").strip().split("|") if x)
        pods.append(Pod(row["name"].strip(), PodRes(cpu, milli, n_gpu, models), _int(p, i + 2, row, "memory_mib")))
    if not pods:
        raise FgdInputError(f"{p}: the pod list is empty")
    return pods


# ---- typical pods and the fragmentation measure -------------------------------------------------------------
def typical_pods(pods: Sequence[Pod], popularity: float = 95.0) -> list[tuple[PodRes, float]]:
    """The most frequent pod shapes covering `popularity` % of pods, with renormalised frequencies."""
    return typical_shapes((pod.res for pod in pods), popularity)


def reference_typical_pods(pods: Sequence[Pod], popularity: float = 95.0) -> list[tuple[PodRes, float]]:
    """`typical_pods` with each frequency divided as the reference divides it: by all pods, then by the typical
    ones' share (the same value, but not always the same last bit)."""
    counts = Counter(pod.res for pod in pods)
    chosen = typical_pods(pods, popularity)
    total, cum = float(len(pods)), float(sum(counts[shape] for shape, _ in chosen))
    return [(shape, (counts[shape] / total) / (cum / total)) for shape, _ in chosen]


REFERENCE_CASE_ORDER: tuple[FragCase, ...] = ("Q1", "Q2", "Q4", "XL", "XR", "NA")  # FragRatioDataMap, Q3 left out


class ReferenceFragMeter(FragMeter):
    """The fragmentation measure summed in the reference's order, for the FGD baseline: per case (Q1, Q2, Q4, XL, XR,
    no access; NodeGpuShareFragAmount), then the cases in that order. The sum is the live meter's, but its last bits
    can differ, and FGD's whole-point score turns a drop of exactly 0 into 50 and one of -5e-13 into 49: the reference
    then prefers another node, and so must a reproduction of it. The live policy keeps the exact sum: ties stay ties.
    """

    def _compute(self, model: str, cpu_left: int, left: GpuState) -> float:
        cases: dict[FragCase, float] = dict.fromkeys(REFERENCE_CASE_ORDER, 0.0)
        for case, amount in self.terms(model, cpu_left, left):
            cases[case] += amount
        out = 0.0
        for case in REFERENCE_CASE_ORDER:
            out += cases[case]
        return out


# What a score depends on: GPU model, CPU and memory left, GPUs left, and (only for scorers that read them,
# else empty) the GPU-affinity tags of the pods already on the node. Nodes with one key score the same.
NodeKey = tuple[str, int, int, GpuState, frozenset[str]]


# ---- the cluster ------------------------------------------------------------------------------------------
@dataclass(slots=True)
class NodeState:
    node: Node
    cpu_left: int
    mem_left: int
    left: list[int]
    tags: set[str] = field(default_factory=set)  # affinity tags of its pods (GpuClustering)
    keep_tags: bool = False

    @property
    def sorted_left(self) -> GpuState:
        return tuple(sorted(self.left, reverse=True))

    def key(self) -> NodeKey:
        tags = frozenset(self.tags) if self.keep_tags else frozenset()
        return (self.node.model, self.cpu_left, self.mem_left, self.sorted_left, tags)


def fits(state: NodeKey, pod: Pod) -> bool:
    model, cpu, mem, left, _tags = state
    res = pod.res
    if cpu < res.cpu or mem < pod.memory:
        return False
    if not res.milli:
        return True
    return bool(left) and accessible(model, res.models) and hosts(left, res)


ScoreFn = Callable[[NodeKey, PodRes], float]


class Scorer(ABC):
    """A node-scoring policy: score(state, pod) (higher wins) and the GPU choice on the winning node."""

    name = "base"
    uniform = False  # pick uniformly among feasible nodes instead of by score
    uses_tags = False  # scores read the GPU-affinity tags of the pods on a node
    normalize = False  # the reference's min-max NormalizeScore (integer) before picking

    def __init__(self, meter: FragMeter, rng: random.Random) -> None:
        self.meter = meter
        self.rng = rng

    @abstractmethod
    def score(self, state: NodeKey, res: PodRes) -> float:
        """The node's score for the pod: the highest score wins."""

    def pick_share_gpu(self, ns: NodeState, res: PodRes) -> int:
        cands = [(x, g) for g, x in enumerate(ns.left) if x >= res.milli]
        return min(cands)[1]  # tightest fit, lowest index


class FgdScorer(Scorer):
    """FGD: sigmoid of the drop in expected fragmentation, ×100, truncated to an integer (the reference)."""

    name = "fgd"

    def _delta(self, model: str, cpu: int, left: GpuState, new_left: GpuState, res: PodRes) -> float:
        m = self.meter
        return m.frag(model, cpu, left) - m.frag(model, cpu - res.cpu, new_left)

    def score(self, state: NodeKey, res: PodRes) -> float:
        model, cpu, _mem, left, _tags = state
        best = max(self._delta(model, cpu, left, nl, res) for nl in after(left, res))
        return float(gradient_score(best))

    def pick_share_gpu(self, ns: NodeState, res: PodRes) -> int:
        model, cpu, left = ns.node.model, ns.cpu_left, ns.sorted_left
        best_g, best_s = -1, -math.inf
        for g, x in enumerate(ns.left):
            if x < res.milli:
                continue
            lst = list(ns.left)
            lst[g] -= res.milli
            s = float(gradient_score(self._delta(model, cpu, left, tuple(sorted(lst, reverse=True)), res)))
            if s > best_s:
                best_g, best_s = g, s
        return best_g


class BestFitScorer(Scorer):
    """BestFit: least CPU and GPU left after the pod, normalised by the reference's max node spec."""

    name = "bestfit"
    normalize = True

    def score(self, state: NodeKey, res: PodRes) -> float:
        _model, cpu, _mem, left, _tags = state
        waste = 0.5 * (cpu - res.cpu) / MAX_SPEC_CPU + 0.5 * (sum(left) - res.total_milli) / MAX_SPEC_GPU
        return float(int((1.0 - waste) * MAX_SCORE))


class DotProdScorer(Scorer):
    """DotProd (Tetris-like alignment), as the reference runs it (`-dimext merge -norm max`): 1 - the mean of the
    pod's and the node's free (CPU, total GPU) vectors multiplied, each divided by the largest node spec."""

    name = "dotprod"

    def score(self, state: NodeKey, res: PodRes) -> float:
        _model, cpu, _mem, left, _tags = state
        dot = (cpu / MAX_SPEC_CPU) * (res.cpu / MAX_SPEC_CPU) + (sum(left) / MAX_SPEC_GPU) * (
            res.total_milli / MAX_SPEC_GPU
        )
        return float(int(MAX_SCORE * (1.0 - dot / 2)))


class GpuClusteringScorer(Scorer):
    """GpuClustering: pods go where pods of the same GPU shape (share, 1-GPU, 2-GPU, ...) already are; each of four
    bands (only that shape / that shape among others / an idle node / other shapes) is ordered by GPU already used."""

    name = "gpuclustering"
    uses_tags = True

    def score(self, state: NodeKey, res: PodRes) -> float:
        _model, _cpu, _mem, left, tags = state
        tag = affinity_tag(res)
        if tag is None:
            return 0.0
        quarter = MAX_SCORE // 4
        used = quarter * (MAX_SPEC_GPU - sum(left)) // MAX_SPEC_GPU  # Go's integer arithmetic, left to right
        if tag in tags:
            return float(used + (3 * quarter if len(tags) == 1 else 2 * quarter))
        return float(used + (quarter if not tags else 0))


class GpuPackingScorer(Scorer):
    """GpuPacking: first a pod that fits on partly used GPUs (the fuller, the better), then one that takes idle
    GPUs of a node already in use (fewer, better), and an idle node last (a smaller node first)."""

    name = "gpupacking"

    def score(self, state: NodeKey, res: PodRes) -> float:
        left = state[3]
        if res.milli <= 0:
            return 0.0
        idle = sum(1 for x in left if x == MILLI)
        if idle == len(left):
            return float(max(MAX_SCORE // 3 - idle, idle))
        need, idle_used, fill = res.n_gpu, 0, 0
        for x in sorted(left):  # the least GPU left first
            if need == 0:
                break
            if res.milli <= x:
                need -= 1
                idle_used += x == MILLI
                fill += x * 100 // MILLI
        if idle_used:
            return float(max(MAX_SCORE // 2 - idle_used, MAX_SCORE // 3))
        return float(max(MAX_SCORE - fill // 10, MAX_SCORE // 2))


def affinity_tag(res: PodRes) -> str | None:
    """The reference's GPU affinity of a pod: `share`, `N-gpu` for N whole GPUs, None without GPUs."""
    if not res.milli or not res.n_gpu:
        return None
    return "share" if res.is_share else f"{res.n_gpu}-gpu"


def shape_of(res: PodRes) -> str:
    """How a report counts pods: `share`, `N-gpu` for N whole GPUs, `cpu-only`."""
    return affinity_tag(res) or "cpu-only"


IDLE_KINDS = ("shared_gpu_remainders", "whole_gpus", "stranded")  # they add up to the idle share; the CLI shows them


@dataclass(frozen=True)
class Least:
    """The least any GPU pod of the list asks: below it a node's CPU or memory, or a GPU's remainder, serves none."""

    cpu: int
    memory: int
    share_milli: int

    @classmethod
    def of(cls, pods: Sequence[Pod]) -> Least:
        gpu = [p for p in pods if p.res.milli]
        shares = [p.res.milli for p in gpu if p.res.is_share]
        if not gpu:
            return cls(0, 0, MILLI)
        return cls(min(p.res.cpu for p in gpu), min(p.memory for p in gpu), min(shares, default=MILLI))


def idle_at_end(nodes: Iterable[tuple[int, int, Sequence[int]]], capacity_milli: int, least: Least) -> dict[str, float]:
    """Where the idle GPU capacity sits, each in % of the capacity, from each node's (CPU left, memory left, milli
    left on each GPU). The first three add up to the idle share: `stranded`, on nodes where no GPU pod of the list
    fits by CPU or memory any more; `whole_gpus`, idle GPUs elsewhere; `shared_gpu_remainders`, what shares leave
    of the GPUs they use. `remainders_no_share_fits` is the part of the last one smaller than any share of the list:
    no later pod can use it, wherever the policy put things after."""
    out = dict.fromkeys((*IDLE_KINDS, "remainders_no_share_fits"), 0)
    for cpu_left, mem_left, left in nodes:
        if not any(left):
            continue
        if cpu_left < least.cpu or mem_left < least.memory:
            out["stranded"] += sum(left)
            continue
        for x in left:
            if x == MILLI:
                out["whole_gpus"] += x
            elif x:
                out["shared_gpu_remainders"] += x
                if x < least.share_milli:
                    out["remainders_no_share_fits"] += x
    return {k: round(100 * v / capacity_milli, 3) for k, v in out.items()}


class RandomScorer(Scorer):
    """Random: every feasible node scores the same; the tie-break picks one uniformly."""

    name = "random"
    uniform = True

    def score(self, state: NodeKey, res: PodRes) -> float:
        return 0.0

    def pick_share_gpu(self, ns: NodeState, res: PodRes) -> int:
        return self.rng.choice([g for g, x in enumerate(ns.left) if x >= res.milli])


SCORERS: dict[str, type[Scorer]] = {
    c.name: c
    for c in (
        FgdScorer,
        BestFitScorer,
        RandomScorer,
        DotProdScorer,
        GpuClusteringScorer,
        GpuPackingScorer,
    )
}
# The platform's own policy: the live placement code with FGD (oneplus_sim.fgd_live), not a scorer of this module.
LIVE_POLICY = "oneplus"
POLICIES = (*SCORERS, LIVE_POLICY)


# ---- the protocol -----------------------------------------------------------------------------------------
@dataclass
class FgdRun:
    policy: str
    seed: int
    capacity_milli: int
    arrived_pct: list[float] = field(default_factory=list)
    alloc_pct: list[float] = field(default_factory=list)
    frag_pct: list[float] = field(default_factory=list)
    failed: int = 0
    pods: int = 0
    failed_by_shape: dict[str, int] = field(default_factory=dict)  # `shape_of` the pods that fit nowhere
    idle_end: dict[str, float] = field(default_factory=dict)  # `idle_at_end` once every pod has arrived

    def fail(self, res: PodRes) -> None:
        self.failed += 1
        shape = shape_of(res)
        self.failed_by_shape[shape] = self.failed_by_shape.get(shape, 0) + 1

    def alloc_at(self, demand_pct: float) -> float:
        """Mean allocation over events whose arrived demand rounds to `demand_pct` (±1 if none), as the reference."""
        target = round(demand_pct)
        vals = [a for d, a in zip(self.arrived_pct, self.alloc_pct, strict=True) if round(d) == target]
        if not vals:
            vals = [a for d, a in zip(self.arrived_pct, self.alloc_pct, strict=True) if abs(round(d) - target) <= 1]
        return sum(vals) / len(vals) if vals else 0.0

    def series(self, step: float = 1.0) -> list[dict[str, float]]:
        """Allocation and fragmentation at each `step` % of arrived demand (first event at or past it)."""
        out, nxt = [], 0.0
        for d, a, f in zip(self.arrived_pct, self.alloc_pct, self.frag_pct, strict=True):
            if d >= nxt:
                out.append({"arrived_pct": round(d, 2), "alloc_pct": round(a, 3), "frag_pct": round(f, 3)})
                nxt = math.floor(d / step) * step + step
        return out


def workload(pods: Sequence[Pod], capacity_milli: int, demand: float, rng: random.Random) -> list[Pod]:
    """The arrival sequence: name-sorted, shuffled, then inflated to `demand` × capacity (or trimmed to it)."""
    base = sorted(pods, key=lambda p: p.name)
    order = list(base)
    rng.shuffle(order)
    target = demand * capacity_milli
    total = sum(p.res.total_milli for p in order)
    if total > target:
        while total > target and order:
            victim = order.pop(rng.randrange(len(order)))
            total -= victim.res.total_milli
        return order
    i = 0
    while True:
        cand = base[rng.randrange(len(base))]
        if total + cand.res.milli > target:
            return order
        total += cand.res.total_milli
        order.append(Pod(f"{cand.name}-tuned-{i}", cand.res, cand.memory))
        i += 1


@dataclass(frozen=True)
class Workload:
    """One seed's arrivals and node order: `node_rank[i]` is node i's place among nodes of equal score (the
    reference's random name prefix). `source` says who drew it: "python" (`draw_workload`) or "reference"."""

    seed: int
    arrivals: tuple[Pod, ...]
    node_rank: tuple[int, ...]
    source: str = "python"


def draw_workload(
    nodes: Sequence[Node], pods: Sequence[Pod], seed: int, demand: float, rng: random.Random | None = None
) -> Workload:
    """The seed's workload from Python's random streams (`rng`, seeded with `seed` when not given): the node order
    first, then the arrivals."""
    rng = random.Random(seed) if rng is None else rng
    rank_of = list(range(len(nodes)))
    rng.shuffle(rank_of)
    arrivals = workload(pods, sum(n.n_gpu for n in nodes) * MILLI, demand, rng)
    return Workload(seed, tuple(arrivals), tuple(rank_of))


def check_workload(nodes: Sequence[Node], work: Workload) -> None:
    if sorted(work.node_rank) != list(range(len(nodes))):
        raise FgdInputError(f"seed {work.seed}: the node order does not rank the {len(nodes)} nodes of this list")


def run_fgd(
    nodes: Sequence[Node],
    pods: Sequence[Pod],
    policy: str,
    seed: int,
    demand: float = 1.3,
    on_pod: Callable[[int, int], None] | None = None,
    work: Workload | None = None,
) -> FgdRun:
    """One policy on one seed's workload: `work`, or the one Python's streams draw for `seed`."""
    if policy not in POLICIES:
        raise FgdInputError(f"unknown FGD policy {policy!r}; choose from {', '.join(POLICIES)}")
    if demand <= 0:
        raise FgdInputError(f"--demand must be > 0, got {demand}")
    if not pods:
        raise FgdInputError("no pods to replay: the pod list has no rows")
    if work is not None:
        check_workload(nodes, work)
    if policy == LIVE_POLICY:
        from .fgd_live import run_live  # it builds on this module

        return run_live(nodes, pods, seed, demand, on_pod, work)
    rng = random.Random(seed)
    capacity = sum(n.n_gpu for n in nodes) * MILLI
    drawn = draw_workload(nodes, pods, seed, demand, rng) if work is None else work
    # The reference names nodes "<random permutation index>-<name>" and breaks score ties by the smallest name.
    rank_of, arrivals = list(drawn.node_rank), drawn.arrivals
    meter = ReferenceFragMeter(reference_typical_pods(pods))
    scorer = SCORERS[policy](meter, random.Random(f"{seed}/gpu"))
    states = [NodeState(n, n.cpu, n.memory, [MILLI] * n.n_gpu, keep_tags=scorer.uses_tags) for n in nodes]
    by_rank = [0] * len(nodes)
    groups: dict[NodeKey, list[int]] = {}  # state -> ranks of its nodes, ascending
    for i, st in enumerate(states):
        by_rank[rank_of[i]] = i
        bisect.insort(groups.setdefault(st.key(), []), rank_of[i])
    run = FgdRun(policy, seed, capacity)
    cluster_frag = sum(meter.frag(k[0], k[1], k[3]) * len(v) for k, v in groups.items())
    idle = capacity
    arrived = 0
    score_cache: dict[tuple[NodeKey, PodRes], float] = {}
    for n_pod, pod in enumerate(arrivals):
        arrived += pod.res.total_milli
        scored: list[tuple[float, NodeKey]] = []
        for key in groups:
            if fits(key, pod):
                ck = (key, pod.res)
                sc = score_cache.get(ck)
                if sc is None:
                    sc = score_cache[ck] = scorer.score(key, pod.res)
                scored.append((sc, key))
        if not scored:
            run.fail(pod.res)
        else:
            node_idx = by_rank[_select(scored, groups, scorer, rng)]
            ns = states[node_idx]
            old_key = ns.key()
            old_frag = meter.frag(ns.node.model, ns.cpu_left, ns.sorted_left)
            _bind(ns, pod, scorer)
            ranks = groups[old_key]
            ranks.remove(rank_of[node_idx])
            if not ranks:
                del groups[old_key]
            bisect.insort(groups.setdefault(ns.key(), []), rank_of[node_idx])
            cluster_frag += meter.frag(ns.node.model, ns.cpu_left, ns.sorted_left) - old_frag
            idle -= pod.res.total_milli
        run.arrived_pct.append(100 * arrived / capacity)
        run.alloc_pct.append(100 * (capacity - idle) / capacity)
        run.frag_pct.append(100 * cluster_frag / idle if idle else 0.0)
        if on_pod:
            on_pod(n_pod + 1, len(arrivals))
    run.pods = len(arrivals)
    run.idle_end = idle_at_end(((s.cpu_left, s.mem_left, s.left) for s in states), capacity, Least.of(pods))
    return run


def _select(
    scored: list[tuple[float, NodeKey]],
    groups: dict[NodeKey, list[int]],
    scorer: Scorer,
    rng: random.Random,
) -> int:
    """The rank of the winning node: highest (normalised) score, then the smallest rank; Random: uniform."""
    if scorer.uniform:
        total = sum(len(groups[k]) for _, k in scored)
        r = rng.randrange(total)
        for _, k in scored:
            if r < len(groups[k]):
                return groups[k][r]
            r -= len(groups[k])
    if scorer.normalize:
        lo, hi = min(sc for sc, _ in scored), max(sc for sc, _ in scored)
        span = hi - lo
        scored = [(0.0 if span == 0 else float(int((sc - lo) * MAX_SCORE // span)), k) for sc, k in scored]
    best = max(sc for sc, _ in scored)
    return min(groups[k][0] for sc, k in scored if sc == best)


def _bind(ns: NodeState, pod: Pod, scorer: Scorer) -> None:
    res = pod.res
    # A share's GPU is chosen on the node as it was, before the pod's CPU is taken: FGD's choice takes the CPU off
    # itself (choosing after took it twice, and on a node short of CPU chose another GPU than the reference).
    share_gpu = scorer.pick_share_gpu(ns, res) if res.milli and res.is_share else None
    ns.cpu_left -= res.cpu
    ns.mem_left -= pod.memory
    if not res.milli:
        return
    tag = affinity_tag(res)
    if tag is not None:
        ns.tags.add(tag)
    if share_gpu is not None:
        ns.left[share_gpu] -= res.milli
        return
    taken = 0
    for g, x in enumerate(ns.left):  # whole GPUs: the lowest idle indexes (AllocateExclusiveGpuId)
        if taken < res.n_gpu and x == MILLI:
            ns.left[g] = 0
            taken += 1


def parse_seeds(text: str) -> list[int]:
    """`42-51` or `42,43,47` (or one number) to a list of seeds."""
    try:
        if "-" in text.strip("-"):
            lo, hi = (int(x) for x in text.split("-", 1))
            if hi < lo:
                raise ValueError
            return list(range(lo, hi + 1))
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise FgdInputError(f"--seeds {text!r}: expected FIRST-LAST (e.g. 42-51) or a comma list") from None


def run_protocol(
    nodes_path: Path | str,
    pods_path: Path | str,
    policies: Sequence[str],
    seeds: Sequence[int],
    demand: float = 1.3,
    on_pod: Callable[[str, int, int, int], None] | None = None,
    arrivals: Path | str | None = None,
) -> dict[str, object]:
    """Every policy on every seed; per policy the mean allocation at `demand` and the mean series along the way.
    With `arrivals` (a file of `bench/fgd_reference`), each seed's workload is the reference's own draw."""
    nodes, pods = load_nodes(nodes_path), load_pods(pods_path)
    if not seeds:
        raise FgdInputError("at least one seed is needed")
    works: dict[int, Workload] = {}
    if arrivals is not None:
        from .fgd_reference import load_reference_workloads  # it builds on this module

        works = load_reference_workloads(arrivals, nodes_path, pods_path, nodes, pods, demand)
        missing = [s for s in seeds if s not in works]
        if missing:
            raise FgdInputError(f"{arrivals}: has no workload for seed(s) {missing}; it has {sorted(works)}")
    out: dict[str, object] = {}
    for policy in policies:
        runs = []
        for seed in seeds:
            cb = (lambda done, total, _p=policy, _s=seed: on_pod(_p, _s, done, total)) if on_pod else None
            runs.append(run_fgd(nodes, pods, policy, seed, demand, cb, works.get(seed)))
        per_seed = {str(r.seed): round(r.alloc_at(100 * demand), 3) for r in runs}
        out[policy] = {
            "gpu_alloc_pct": round(sum(per_seed.values()) / len(per_seed), 3),
            "gpu_alloc_pct_by_seed": per_seed,
            "failed_pods_mean": round(sum(r.failed for r in runs) / len(runs), 1),
            "failed_pods_by_shape_mean": _mean_counts([r.failed_by_shape for r in runs]),
            "idle_at_end_pct": _mean_counts([r.idle_end for r in runs], 3),
            "pods_mean": round(sum(r.pods for r in runs) / len(runs), 1),
            "series": _mean_series([r.series() for r in runs]),
        }
    return {
        "protocol": "FGD workload inflation (hkust-adsl/kubernetes-scheduler-simulator @8f3d6417), see oneplus_sim.fgd",
        "nodes": str(nodes_path),
        "pods": str(pods_path),
        "capacity_gpus": sum(n.n_gpu for n in nodes),
        "demand": demand,
        "seeds": list(seeds),
        "workloads": f"the reference's own draws, from {arrivals}" if arrivals else "drawn by Python's random streams",
        "typical_pods": len(typical_pods(pods)),
        "policies": out,
    }


def _mean_counts(per_run: Sequence[Mapping[str, float]], digits: int = 1) -> dict[str, float]:
    """Key-wise mean over runs (a key a run lacks counts 0), largest first."""
    keys = {k for d in per_run for k in d}
    means = {k: round(sum(d.get(k, 0) for d in per_run) / len(per_run), digits) for k in keys}
    return dict(sorted(means.items(), key=lambda kv: -kv[1]))


def _mean_series(series: Sequence[list[dict[str, float]]]) -> list[dict[str, float]]:
    """Point-wise mean over seeds at each arrived-demand step that every seed reached."""
    n = min(len(s) for s in series)
    keys = ("arrived_pct", "alloc_pct", "frag_pct")
    return [{k: round(sum(s[i][k] for s in series) / len(series), 3) for k in keys} for i in range(n)]
