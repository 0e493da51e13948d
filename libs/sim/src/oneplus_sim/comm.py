"""The communication model of BENCHMARKS.md §1, on top of placement's ring bandwidth (one model for both).

B is `oneplus_placement.bandwidth.ring_of_masks` of the allocation, B* is `ideal_ring_gbps` of its shape on the
empty cluster; a job placed with ring bandwidth B runs `duration × ((1 − f) + f · B*/B)`.
"""

from __future__ import annotations

from collections.abc import Sequence

from oneplus_placement.bandwidth import ideal_ring_gbps, ring_of_masks, slowdown

from .cluster import SimCluster

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


__all__ = ["IdealRing", "Slot", "allocation_ring_gbps", "slowdown"]
