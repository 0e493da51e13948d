"""GPU shares that are isolated: a share runs under MPS, so it may only go to nodes that run the MPS daemon.

A node running MPS carries the `mps` feature (`layout.NodeSlot.features`, from `NodeTopology.mps`); a share whose
queue does not allow unisolated time-slicing is placed as if it had asked `--constraint mps` too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from oneplus_contracts import Allocation
from oneplus_contracts.features import FeatureConstraint

if TYPE_CHECKING:
    from .layout import Layout

MPS_FEATURE = "mps"


def with_feature(constraint: FeatureConstraint | None, feature: str) -> FeatureConstraint:
    """`constraint` AND `feature`: every alternative of it also needs the feature."""
    if constraint is None:
        return FeatureConstraint(feature, (frozenset({feature}),))
    terms = tuple(term | {feature} for term in constraint.any_of)
    return FeatureConstraint(f"({constraint.text})&{feature}", terms, constraint.matching)


def stamp_sharing(layout: Layout, alloc: Allocation) -> Allocation:
    """Each share rank marked with how it runs where it landed: under MPS, or time-sliced on a node without it."""
    ranks = [
        r.model_copy(update={"sharing": "mps" if layout.slots[layout.index(r.node)].topology.mps else "time-slice"})
        for r in alloc.ranks
    ]
    return alloc.model_copy(update={"ranks": ranks})
