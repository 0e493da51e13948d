"""Topology-aware gang placement: pure decisions as functions of a cluster snapshot.

- `ClusterSnapshot` / `ClusterState`: what is free and held (`apply` / `release` allocations, `seeded_fill`).
- `place_gang`: greedy, tightest domain first (node, leaf, spine, cluster), best fit inside it.
- `place_batch`: a window of gangs jointly with CP-SAT under a time bound, greedy as warm start and fallback.
- `explain_pending`: why a gang waits, in words a person can act on.
- `fragmentation`: largest placeable gang per tier, stranded GPUs, fragmentation share.
- `allocation_ring_gbps` / `ideal_ring_gbps`: the communication model the simulator shares.
"""

from .bandwidth import allocation_ring_gbps, ideal_ring_gbps
from .batch import BatchResult, PendingGang, place_batch
from .diagnosis import Explanation
from .explain import explain_pending
from .fill import seeded_fill
from .fragmentation import FragmentationReport, TierFragmentation, fragmentation
from .greedy import PlacementResult, place_gang
from .incremental import SearchCache
from .layout import AllocationConflict, Layout
from .request import GangRequest, InvalidRequest
from .snapshot import ClusterSnapshot, ClusterState, Holdings

__all__ = [
    "AllocationConflict",
    "BatchResult",
    "ClusterSnapshot",
    "ClusterState",
    "Explanation",
    "FragmentationReport",
    "GangRequest",
    "Holdings",
    "InvalidRequest",
    "Layout",
    "PendingGang",
    "PlacementResult",
    "SearchCache",
    "TierFragmentation",
    "allocation_ring_gbps",
    "explain_pending",
    "fragmentation",
    "ideal_ring_gbps",
    "place_batch",
    "place_gang",
    "seeded_fill",
]
