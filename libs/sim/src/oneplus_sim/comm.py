"""The communication model of BENCHMARKS.md §1, on top of placement's ring bandwidth (one model for both).

B is `oneplus_placement.bandwidth.ring_of_masks` of the allocation, B* is `ideal_ring_gbps` of its shape on the
empty cluster; a job placed with ring bandwidth B runs `duration × ((1 − f) + f · B*/B)`.

A job with tensor-parallel groups (`SimJob.tp_group`) spends TP_SHARE of its communication in its groups' rings and
the rest in the data-parallel ring over the whole allocation: it runs
`duration × ((1 − f) + f · (TP_SHARE · B*_tp/B_tp + (1 − TP_SHARE) · B*/B))`, B_tp the slowest group's ring and
B*_tp the best ring of one group on the empty cluster (a job that is one group puts all of f on it).
"""

from __future__ import annotations

from collections.abc import Sequence

from oneplus_placement.bandwidth import ideal_ring_gbps, ring_of_masks, slowdown

from .cluster import SimCluster

# Share of a TP job's communication in its TP groups (per-layer all-reduces) rather than its data-parallel gradient
# ring: an assumption in the range Megatron-style profiles report, printed in the report with the rule.
TP_SHARE = 0.8

Slot = tuple[int, tuple[int, ...]]  # (node index, GPU indexes on that node)


def allocation_ring_gbps(cluster: SimCluster, slots: Sequence[Slot]) -> float:
    """B of an allocation; 0 for a single GPU (no ring hop)."""
    layout = cluster.layout
    masks: dict[int, int] = {}
    for node, gpus in slots:
        masks[node] = masks.get(node, 0) | layout.slots[node].shape.mask_of(list(gpus))
    return ring_of_masks(layout, masks)


class IdealRing:
    """B* per job shape (ranks, GPUs per rank), cached."""

    def __init__(self, cluster: SimCluster) -> None:
        self.cluster = cluster
        self._cache: dict[tuple[int, int], float] = {}

    def __call__(self, ranks: int, gpus_per_rank: int) -> float:
        key = (ranks, gpus_per_rank)
        v = self._cache.get(key)
        if v is None:
            v = self._cache[key] = ideal_ring_gbps(self.cluster.layout, ranks * gpus_per_rank, gpus_per_rank)
        return v


def tp_groups(slots: Sequence[Slot], tp: int) -> list[list[tuple[int, int]]]:
    """The job's GPUs as (node, GPU) in rank order, cut into consecutive groups of `tp` (Megatron's rank order)."""
    flat = [(node, g) for node, gpus in slots for g in gpus]
    return [flat[i : i + tp] for i in range(0, len(flat), tp)]


def group_in_nvlink_domain(cluster: SimCluster, group: Sequence[tuple[int, int]]) -> bool:
    """Is this group inside one NVLink domain: one node's (its GPUs inside one of the board's NVLink domains) or one
    multi-node domain such as an NVL72 rack?"""
    nodes = list(dict.fromkeys(n for n, _ in group))
    if len(nodes) == 1:
        gpus = {g for _, g in group}
        return any(gpus <= d for d in cluster.nodes[nodes[0]].kind.nvlink_domains)
    level = cluster.layout.level("nvlink")
    if level is None:
        return False
    first = level.of_node[nodes[0]]
    return len(level.members[first]) > 1 and all(level.of_node[n] == first for n in nodes)


def group_ring_gbps(cluster: SimCluster, group: Sequence[tuple[int, int]]) -> float:
    layout = cluster.layout
    masks: dict[int, int] = {}
    for node, g in group:
        masks[node] = masks.get(node, 0) | layout.slots[node].shape.mask_of([g])
    return ring_of_masks(layout, masks)


def tp_slowdown(
    cluster: SimCluster, ideal: IdealRing, f: float, tp: int, gpus_per_rank: int, slots: Sequence[Slot]
) -> tuple[float, float, float, int, int]:
    """(slowdown, B_tp, B*_tp, groups inside one NVLink domain, groups) of a TP job placed on `slots`."""
    groups = tp_groups(slots, tp)
    inside = sum(group_in_nvlink_domain(cluster, g) for g in groups)
    b_tp = min(group_ring_gbps(cluster, g) for g in groups)
    k = min(gpus_per_rank, tp)
    b_tp_star = ideal(tp // k, k)
    if f <= 0 or b_tp_star <= 0:
        return 1.0, b_tp, b_tp_star, inside, len(groups)
    if b_tp <= 0:
        raise ValueError("a TP group with zero ring bandwidth cannot run")
    ratio = b_tp_star / b_tp
    if len(groups) > 1:
        ranks = sum(1 for _ in slots)
        b_star = ideal(ranks, gpus_per_rank)
        b = allocation_ring_gbps(cluster, slots)
        ratio = TP_SHARE * ratio + (1 - TP_SHARE) * (b_star / b if b > 0 and b_star > 0 else 1.0)
    return max(1.0, (1 - f) + f * ratio), b_tp, b_tp_star, inside, len(groups)


__all__ = [
    "TP_SHARE",
    "IdealRing",
    "Slot",
    "allocation_ring_gbps",
    "group_in_nvlink_domain",
    "slowdown",
    "tp_groups",
    "tp_slowdown",
]
