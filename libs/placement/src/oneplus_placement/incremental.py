"""Per-node capacities kept up to date across many decisions on one changing state.

Computing every node's capacity is the O(nodes) part of a decision. Requests of the same shape see the same
capacities, and an applied allocation changes only its own nodes, so a batch (or a simulator) recomputes just those.
"""

from __future__ import annotations

from collections.abc import Iterable

from oneplus_contracts import Allocation

from .capacity import CapacityIndexes
from .diagnosis import diagnose, static_reason
from .fitters import fitter_for
from .greedy import PlacementResult, materialise
from .levels import DomainSearch
from .request import GangRequest
from .snapshot import ClusterState, Holdings


class SearchCache:
    """Domain searches over `holdings` that share capacities between requests of equal `capacity_key`."""

    def __init__(self, holdings: Holdings, seed: int = 0) -> None:
        self.holdings = holdings
        self.seed = seed
        self._indexes = CapacityIndexes()

    def search(self, req: GangRequest) -> DomainSearch:
        fitter = fitter_for(self.holdings, req, self.seed)
        return DomainSearch(fitter, req, index=self._indexes.index(fitter, req))

    def touched(self, nodes: Iterable[int]) -> None:
        """Recompute the capacities of `nodes` after the holdings changed there."""
        self._indexes.touched(nodes)

    def place(self, req: GangRequest, solver: str = "greedy") -> PlacementResult:
        """The greedy decision for `req` on the current holdings (nothing is applied)."""
        static = static_reason(self.holdings, req)
        if static is not None:
            return PlacementResult(None, static)
        search = self.search(req)
        plan = search.best(search.levels())
        if plan is None:
            return PlacementResult(None, diagnose(self.holdings, req, search))
        return PlacementResult(materialise(search.fitter, req, plan, solver), None)


def apply_and_refresh(state: ClusterState, cache: SearchCache, alloc: Allocation) -> None:
    state.apply(alloc)
    cache.touched(state.layout.index(n) for n in alloc.nodes)
