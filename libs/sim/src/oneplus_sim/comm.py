"""The communication model of BENCHMARKS.md §1: ring bandwidth B of an allocation, the ideal B*, the slowdown.

B is the slowest hop of the best ring over the allocation's GPUs: inside a node from the node kind's GPU×GPU
matrix, between nodes the NIC rate per GPU, divided by the oversubscription when the ring crosses a leaf.
B* is the best B any placement of that shape reaches on an empty cluster. Slowdown = (1 − f) + f·B*/B.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from itertools import combinations

from .cluster import NodeKind, SimCluster

Slot = tuple[int, tuple[int, ...]]  # (node index, GPU indexes on that node)


def _bottleneck(kind: NodeKind, gpus: tuple[int, ...], cycle: bool) -> float:
    """Best achievable slowest hop over a Hamiltonian cycle (or path) through `gpus`."""
    k = len(gpus)
    if k < 2:
        return float("inf")
    m = kind.pair_gbps
    values = sorted({m[a][b] for a in gpus for b in gpus if a != b}, reverse=True)
    for v in values:
        if _hamiltonian(tuple(tuple(m[a][b] >= v for b in gpus) for a in gpus), cycle):
            return v
    return 0.0


@lru_cache(maxsize=4096)
def _hamiltonian(adj: tuple[tuple[bool, ...], ...], cycle: bool) -> bool:
    k = len(adj)
    if k == 2:
        return adj[0][1]
    full = (1 << k) - 1
    starts = [0] if cycle else list(range(k))
    for s in starts:
        reach = {(1 << s, s)}
        for _ in range(k - 1):
            reach = {(mask | 1 << b, b) for mask, a in reach for b in range(k) if not mask >> b & 1 and adj[a][b]}
            if not reach:
                break
        if any(mask == full and (not cycle or adj[a][s]) for mask, a in reach):
            return True
    return False


_ring_cache: dict[tuple[str, tuple[int, ...], bool], float] = {}


def node_ring_gbps(kind: NodeKind, gpus: Sequence[int], cycle: bool = True) -> float:
    key = (kind.name, tuple(sorted(gpus)), cycle)
    v = _ring_cache.get(key)
    if v is None:
        v = _bottleneck(kind, key[1], cycle)
        _ring_cache[key] = v
    return v


def allocation_ring_gbps(cluster: SimCluster, slots: Sequence[Slot]) -> float:
    """B of an allocation; infinite for a single GPU (no communication)."""
    by_node: dict[int, set[int]] = {}
    for node, gpus in slots:
        by_node.setdefault(node, set()).update(gpus)
    if len(by_node) == 1:
        ((node, gpus),) = by_node.items()
        return node_ring_gbps(cluster.nodes[node].kind, tuple(gpus), cycle=True)
    b = float("inf")
    leaves = set()
    for node, gpus in by_node.items():
        n = cluster.nodes[node]
        leaves.add(n.leaf)
        b = min(b, n.nic_gbps_per_gpu, node_ring_gbps(n.kind, tuple(gpus), cycle=False))
    if len(leaves) > 1:
        b = min(b, min(cluster.nodes[i].nic_gbps_per_gpu for i in by_node) / cluster.oversubscription)
    return b


class IdealRing:
    """B* per job shape (ranks, GPUs per rank) on the empty cluster, cached."""

    def __init__(self, cluster: SimCluster) -> None:
        self.cluster = cluster
        self._cache: dict[tuple[int, int], float] = {}

    def best_subset(self, kind: NodeKind, n: int, cycle: bool) -> float:
        if n < 2:
            return float("inf")
        if n > kind.n_gpus:
            return 0.0
        return max(node_ring_gbps(kind, c, cycle) for c in combinations(range(kind.n_gpus), n))

    def __call__(self, ranks: int, gpus_per_rank: int) -> float:
        key = (ranks, gpus_per_rank)
        v = self._cache.get(key)
        if v is None:
            v = self._compute(ranks, gpus_per_rank)
            self._cache[key] = v
        return v

    def _compute(self, ranks: int, per_rank: int) -> float:
        c = self.cluster
        if ranks == 1:
            return max(self.best_subset(k, per_rank, cycle=True) for k in c.kinds)
        # Ranks on distinct nodes: the best kind for the intra-node path and NIC, inside one leaf if any leaf has room.
        best = 0.0
        for leaf_nodes in c.leaves.values():
            fitting = [c.nodes[i] for i in leaf_nodes if c.nodes[i].kind.n_gpus >= per_rank]
            if len(fitting) < ranks:
                continue
            by_speed = sorted(
                (min(n.nic_gbps_per_gpu, self.best_subset(n.kind, per_rank, cycle=False)) for n in fitting),
                reverse=True,
            )
            best = max(best, by_speed[ranks - 1])
        if best > 0:
            return best
        speeds = sorted(
            (
                min(n.nic_gbps_per_gpu / c.oversubscription, self.best_subset(n.kind, per_rank, cycle=False))
                for n in c.nodes
                if n.kind.n_gpus >= per_rank
            ),
            reverse=True,
        )
        return speeds[ranks - 1] if len(speeds) >= ranks else 0.0


def slowdown(comm_fraction: float, ideal_gbps: float, gbps: float) -> float:
    """(1 − f) + f·B*/B, never below 1 (an allocation cannot beat the ideal)."""
    if comm_fraction <= 0 or gbps == float("inf") or ideal_gbps == float("inf"):
        return 1.0
    if gbps <= 0:
        raise ValueError("an allocation with zero ring bandwidth cannot run")
    return max(1.0, (1 - comm_fraction) + comm_fraction * ideal_gbps / gbps)
