"""Who holds what: per-GPU free capacity (thousandths of a GPU), CPU and memory per node.

Kept incrementally, with the counters the metrics sample at every change (allocated GPUs and the
free GPUs an 8-GPU gang could use), so that a cycle never rescans the cluster to report.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .cluster import SimCluster
from .trace import SimJob

MILLI = 1000
GANG = 8  # frag_pct: free GPUs on nodes with fewer than min(GANG, node size) free (placement's definition)


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a job's ranks run: one (node, GPU indexes) per rank, in rank order."""

    slots: tuple[tuple[int, tuple[int, ...]], ...]
    gpu_milli: int = 0  # a share of each listed GPU; 0 = whole GPUs

    @property
    def nodes(self) -> list[int]:
        return list(dict.fromkeys(n for n, _ in self.slots))


class PlacementError(RuntimeError):
    """A policy tried to take capacity that is not free: a bug in the policy, never a simulation outcome."""


class Occupancy:
    def __init__(self, cluster: SimCluster) -> None:
        self.cluster = cluster
        self.gpu_left: list[list[int]] = [[MILLI] * n.kind.n_gpus for n in cluster.nodes]
        self.free_whole: list[int] = [n.kind.n_gpus for n in cluster.nodes]
        self.cpu_left: list[float] = [n.kind.cpus for n in cluster.nodes]
        self.mem_left: list[int] = [n.kind.memory_mb for n in cluster.nodes]
        self.n_gpus: list[int] = [n.kind.n_gpus for n in cluster.nodes]
        self.leaf_of: list[int] = [n.leaf for n in cluster.nodes]
        self.held: dict[str, Placement] = {}
        self.allocated_milli = 0
        self.total_free_whole = cluster.total_gpus
        self._gang_need = [min(GANG, g) for g in self.n_gpus]
        self.gang_usable_free = sum(f for f, need in zip(self.free_whole, self._gang_need, strict=True) if f >= need)

    # ---- queries -------------------------------------------------------------------------------
    def free_gpus(self, node: int) -> list[int]:
        """Indexes of wholly free GPUs on a node, lowest first."""
        return [g for g, left in enumerate(self.gpu_left[node]) if left == MILLI]

    def node_fits(self, node: int, job: SimJob, gpus_per_rank: int | None = None) -> bool:
        """Can one rank of `job` go on `node` now (GPUs, share, CPU, memory, GPU model)?"""
        if self.cpu_left[node] < job.cpus or self.mem_left[node] < job.memory_mb:
            return False
        if job.gpu_models and self.cluster.nodes[node].kind.gpu_model not in job.gpu_models:
            return False
        if job.gpu_milli:
            return any(left >= job.gpu_milli for left in self.gpu_left[node])
        need = job.gpus_per_rank if gpus_per_rank is None else gpus_per_rank
        return self.free_whole[node] >= need

    def whole_free_nodes(self, nodes: Iterable[int] | None = None) -> list[int]:
        it = range(len(self.n_gpus)) if nodes is None else nodes
        return [i for i in it if self.free_whole[i] == self.n_gpus[i] and self.n_gpus[i] > 0]

    @property
    def allocated_gpus(self) -> float:
        return self.allocated_milli / MILLI

    # ---- changes -------------------------------------------------------------------------------
    def take(self, job: SimJob, placement: Placement) -> None:
        if job.job_id in self.held:
            raise PlacementError(f"{job.job_id} already holds GPUs")
        self._check(job, placement)
        per_rank_cpu, per_rank_mem = job.cpus, job.memory_mb
        for node, gpus in placement.slots:
            self._node_delta(node, gpus, -(placement.gpu_milli or MILLI), -per_rank_cpu, -per_rank_mem)
        self.held[job.job_id] = placement

    def release(self, job: SimJob) -> Placement:
        placement = self.held.pop(job.job_id)
        for node, gpus in placement.slots:
            self._node_delta(node, gpus, placement.gpu_milli or MILLI, job.cpus, job.memory_mb)
        return placement

    def _check(self, job: SimJob, placement: Placement) -> None:
        if job.gpu_milli != placement.gpu_milli:
            raise PlacementError(f"{job.job_id}: share {job.gpu_milli} but placement share {placement.gpu_milli}")
        need = placement.gpu_milli or MILLI
        used: dict[tuple[int, int], int] = {}
        cpu: dict[int, float] = {}
        mem: dict[int, int] = {}
        for node, gpus in placement.slots:
            expected = 1 if job.gpu_milli else job.gpus_per_rank
            # An exclusive gang's ranks also hold the rest of their node's GPUs.
            short = len(gpus) < expected if job.exclusive and not job.gpu_milli else len(gpus) != expected
            if short or len(set(gpus)) != len(gpus):
                raise PlacementError(f"{job.job_id}: a rank needs {expected} distinct GPUs, got {gpus} on {node}")
            kind = self.cluster.nodes[node].kind
            if job.gpu_models and kind.gpu_model not in job.gpu_models:
                raise PlacementError(f"{job.job_id}: node {node} has {kind.gpu_model}, job wants {job.gpu_models}")
            for g in gpus:
                used[(node, g)] = used.get((node, g), 0) + need
            cpu[node] = cpu.get(node, 0.0) + job.cpus
            mem[node] = mem.get(node, 0) + job.memory_mb
        if len(placement.slots) != job.ranks:
            raise PlacementError(f"{job.job_id}: {job.ranks} ranks but {len(placement.slots)} placed")
        for (node, g), milli in used.items():
            if self.gpu_left[node][g] < milli:
                raise PlacementError(f"{job.job_id}: GPU {g} of node {node} has {self.gpu_left[node][g]} left")
        for node in cpu:
            if self.cpu_left[node] + 1e-9 < cpu[node] or self.mem_left[node] < mem[node]:
                raise PlacementError(f"{job.job_id}: node {node} lacks CPU or memory")

    def _node_delta(self, node: int, gpus: Sequence[int], milli: int, cpu: float, mem: int) -> None:
        need = self._gang_need[node]
        before = self.free_whole[node]
        left = self.gpu_left[node]
        for g in gpus:
            was_free = left[g] == MILLI
            left[g] += milli
            is_free = left[g] == MILLI
            self.free_whole[node] += is_free - was_free
        self.allocated_milli -= milli * len(gpus)
        after = self.free_whole[node]
        self.total_free_whole += after - before
        self.gang_usable_free += (after if after >= need else 0) - (before if before >= need else 0)
        self.cpu_left[node] += cpu
        self.mem_left[node] += mem
