"""The FGD protocol's `oneplus` policy: every GPU pod placed by the live placement code, as a queue with
`placement: fgd` places a job.

Each pod with GPUs becomes a one-rank `JobSpec` (whole GPUs, or a share of one) and goes through
`oneplus_placement.greedy.place_gang` with the live meter (`live_meter`: FGD's typical pods, and the memory they
ask, which the live measure reads and the reference's does not), on placement's own `ClusterState` of the openb
nodes (each one PCIe domain, 32 per leaf, as `oneplus sim run` loads them): the fitters, tie-breaks and GPU choice
are the live solver's (`fitters.FgdWholeGpuFitter`, `fitters.FgdShareFitter`). The protocol keeps what the platform
does not schedule: CPU-only pods, placed by FGD's own score (blind to memory, which only filters: the reference's)
with the same tie-break (an untouched node last, then the fixed node order of the seed). The seed draws the
arrivals exactly as for every other policy, or a `Workload` (the reference's own draw, `oneplus_sim.fgd_reference`)
gives them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from oneplus_contracts import Allocation, JobSpec, RankPlacement
from oneplus_placement.capacity import CapacityIndexes
from oneplus_placement.fgd import FragMeter, gradient_score, memory_asks, untouched
from oneplus_placement.fitters import gpu_left, tie_break
from oneplus_placement.greedy import place_gang
from oneplus_placement.snapshot import ClusterState

from .cluster import openb_cluster
from .fgd import (
    LIVE_POLICY,
    MILLI,
    FgdRun,
    Least,
    Node,
    Pod,
    PodRes,
    Workload,
    draw_workload,
    idle_at_end,
    typical_pods,
)


class OpenbState:
    """The live `ClusterState` of the openb nodes, with what the protocol reads of each node kept current."""

    def __init__(self, nodes: Sequence[Node], meter: FragMeter) -> None:
        entries = [(n.name, n.n_gpu, n.model, n.cpu, n.memory) for n in nodes]
        self.state = ClusterState.from_cluster(openb_cluster("openb", entries))
        self.meter = meter
        self.models = [n.model for n in nodes]
        self.frag = [0.0] * len(nodes)
        self.total_frag = 0.0  # the sum of `frag`, kept as nodes change
        self.left: list[tuple[int, ...]] = [()] * len(nodes)
        for i in range(len(nodes)):
            self._read(i)

    def _read(self, i: int) -> None:
        self.left[i] = tuple(sorted(gpu_left(self.state, i), reverse=True))
        frag = self.meter.frag(self.models[i], self.cpu_left(i), self.left[i], self.state.mem_free(i))
        self.total_frag += frag - self.frag[i]
        self.frag[i] = frag

    def cpu_left(self, i: int) -> int:
        return round(self.state.cpu_free(i) * 1000)

    def apply(self, alloc: Allocation) -> list[int]:
        self.state.apply(alloc)
        touched = [self.state.layout.index(n) for n in alloc.nodes]
        for i in touched:
            self._read(i)
        return touched


def live_meter(pods: Sequence[Pod]) -> FragMeter:
    """The live policy's measure of the pod list's mix: FGD's typical pods, and the memory each shape's pods ask
    (as a queue's `workload_meter` reads its jobs' memory)."""
    typical = typical_pods(pods)
    return FragMeter(typical, memory=memory_asks(typical, ((p.res, spec_memory(p)) for p in pods)))


def spec_memory(pod: Pod) -> int:
    """The memory (MiB) a pod asks as the platform's job: a pod may ask 0 MiB; the contract's least is 1."""
    return max(1, pod.memory)


def pod_spec(pod: Pod) -> JobSpec:
    """A pod with GPUs as the platform's job: one rank of whole GPUs, or of a share of one GPU."""
    res = pod.res
    gpus: float = res.n_gpu if res.milli >= MILLI else res.milli / MILLI
    resources: dict[str, object] = {"gpus": gpus, "cpus": res.cpu / 1000, "memory_mb": spec_memory(pod)}
    if res.models:
        resources["gpu_models"] = res.models.split("|")
    return JobSpec.model_validate({"name": "pod", "resources": resources})


def place_cpu_pod(cluster: OpenbState, pod: Pod, seed: int) -> int | None:
    """The node for a CPU-only pod: the best FGD score, an untouched node last, then the seed's node order.

    Memory only filters here: the score is FGD's own, memory-blind (the meter without `mem_left`), as the reference
    scores these pods. The platform never places CPU-only pods, so the live measure that reads memory is kept for
    GPU pods; on cpu250 (2,356 CPU-only pods) scoring these by it placed less than FGD (docs/simulator.md)."""
    state, meter, res = cluster.state, cluster.meter, pod.res
    best: tuple[int, bool, int] | None = None
    found = None
    for i in range(len(cluster.left)):
        cpu, mem = cluster.cpu_left(i), state.mem_free(i)
        if cpu < res.cpu or mem < pod.memory or not state.schedulable[i]:
            continue
        left, model = cluster.left[i], cluster.models[i]
        drop = meter.frag(model, cpu, left) - meter.frag(model, cpu - res.cpu, left)
        key = (-gradient_score(drop), untouched(left), tie_break(i, seed))
        if best is None or key < best:
            best, found = key, i
    return found


def run_live(
    nodes: Sequence[Node],
    pods: Sequence[Pod],
    seed: int,
    demand: float,
    on_pod: Callable[[int, int], None] | None = None,
    work: Workload | None = None,
) -> FgdRun:
    """The live policy on one seed's workload. Drawn here (`work` None), the nodes keep the list's order and ties
    follow the seed's fixed order (`fitters.tie_break`), as in the solver. Given a workload, the cluster lists its
    nodes in the workload's node order (the reference's names, sorted) and ties keep that order (seed 0): the same
    order FGD's ties follow on that workload."""
    capacity = sum(n.n_gpu for n in nodes) * MILLI
    tie_seed = seed
    if work is None:
        # The reference's node naming is drawn (and unused) so that the arrivals match the other policies'.
        arrivals: Sequence[Pod] = draw_workload(nodes, pods, seed, demand).arrivals
    else:
        arrivals, tie_seed = work.arrivals, 0
        nodes = [nodes[i] for i in sorted(range(len(nodes)), key=lambda i: work.node_rank[i])]
    meter = live_meter(pods)
    cluster = OpenbState(nodes, meter)
    indexes = CapacityIndexes()
    specs: dict[tuple[PodRes, int], JobSpec] = {}
    run = FgdRun(LIVE_POLICY, seed, capacity)
    idle, arrived = capacity, 0
    for n_pod, pod in enumerate(arrivals):
        arrived += pod.res.total_milli
        alloc: Allocation | None = None
        if pod.res.milli:
            key = (pod.res, pod.memory)
            spec = specs.get(key) or specs.setdefault(key, pod_spec(pod))
            alloc = place_gang(cluster.state, spec, seed=tie_seed, fgd=meter, indexes=indexes).allocation
        else:
            i = place_cpu_pod(cluster, pod, tie_seed)
            if i is not None:
                node = cluster.state.layout.slots[i].name
                rank = RankPlacement(rank=0, node=node, gpus=[], cpus=pod.res.cpu / 1000, memory_mb=pod.memory)
                alloc = Allocation(ranks=[rank])
        if alloc is None:
            run.fail(pod.res)
        else:
            indexes.touched(cluster.apply(alloc))
            idle -= pod.res.total_milli
        run.arrived_pct.append(100 * arrived / capacity)
        run.alloc_pct.append(100 * (capacity - idle) / capacity)
        run.frag_pct.append(100 * cluster.total_frag / idle if idle else 0.0)
        if on_pod:
            on_pod(n_pod + 1, len(arrivals))
    run.pods = len(arrivals)
    state = cluster.state
    ends = ((cluster.cpu_left(i), state.mem_free(i), cluster.left[i]) for i in range(len(nodes)))
    run.idle_end = idle_at_end(ends, capacity, Least.of(pods))
    return run
