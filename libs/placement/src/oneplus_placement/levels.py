"""The domain search: one node, then one leaf, one spine, then the whole cluster, tightest first.

At each level every domain that can hold the gang yields one plan; plans are sorted best fit first (fewest nodes,
then the fullest domain), so small gangs land in fragments and whole nodes and leaves stay free for large gangs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from oneplus_contracts import Domain

from .fitters import Fitter, tie_break
from .request import GangRequest

Piece = tuple[int, int]  # (node index, units placed there)


@dataclass(frozen=True)
class Plan:
    """Which nodes host how many units; `domain` is the tightest domain that holds them all."""

    pieces: tuple[Piece, ...]
    domain: Domain

    @property
    def nodes(self) -> list[int]:
        return [i for i, _ in self.pieces]


class DomainSearch:
    """Capacities of every node for one request, and plans per level built from them."""

    def __init__(self, fitter: Fitter, req: GangRequest) -> None:
        self.fitter = fitter
        self.req = req
        self.layout = fitter.layout
        self.caps = fitter.capacities()
        self._leaf_caps: list[int] | None = None
        self._spine_caps: list[int] | None = None

    @property
    def leaf_caps(self) -> list[int]:
        if self._leaf_caps is None:
            caps = [0] * len(self.layout.leaf_nodes)
            for i, c in self.caps.items():
                caps[self.layout.slots[i].leaf] += c
            self._leaf_caps = caps
        return self._leaf_caps

    @property
    def spine_caps(self) -> list[int]:
        if self._spine_caps is None:
            caps = [0] * len(self.layout.spine_leaves)
            for leaf, c in enumerate(self.leaf_caps):
                caps[self.layout.leaf_spine[leaf]] += c
            self._spine_caps = caps
        return self._spine_caps

    def plans(self, level: Domain, limit: int | None = None) -> list[Plan]:
        """Every domain of `level` that can hold the gang, best first (at most `limit`)."""
        need = self.req.units
        if level == "node":
            nodes = [i for i, c in self.caps.items() if c >= need]
            nodes.sort(key=lambda i: self.fitter.node_key(i, need))
            return [Plan(((i, need),), "node") for i in nodes[:limit]]
        if level == "leaf":
            plans = [self._leaf_plan(leaf, need) for leaf, c in enumerate(self.leaf_caps) if c >= need]
        elif level == "spine":
            plans = [self._spine_plan(s, need) for s, c in enumerate(self.spine_caps) if c >= need]
        else:
            plans = [self._cluster_plan(need)] if sum(self.spine_caps) >= need else []
        found = [p for p in plans if p is not None and self._within_leaf_limit(p)]
        found.sort(key=self._plan_key)
        return found[:limit]

    def best(self, levels: Sequence[Domain]) -> Plan | None:
        for level in levels:
            got = self.plans(level, limit=1)
            if got:
                return got[0]
        return None

    # --- fills ------------------------------------------------------------------------------------------------

    def _leaf_plan(self, leaf: int, need: int) -> Plan | None:
        pieces = self._fill_nodes(self.layout.leaf_nodes[leaf], need)
        return Plan(tuple(pieces), "node" if len(pieces) == 1 else "leaf") if pieces else None

    def _spine_plan(self, spine: int, need: int) -> Plan | None:
        pieces = self._fill_leaves(self.layout.spine_leaves[spine], need)
        return Plan(tuple(pieces), self._domain_of(pieces)) if pieces else None

    def _cluster_plan(self, need: int) -> Plan | None:
        spines = list(range(len(self.layout.spine_leaves)))
        chosen = _fill(spines, need, self.spine_caps.__getitem__, self._group_order_key(self.spine_caps))
        if chosen is None:
            return None
        pieces: list[Piece] = []
        for spine, units in chosen:
            got = self._fill_leaves(self.layout.spine_leaves[spine], units)
            if not got:
                return None
            pieces.extend(got)
        return Plan(tuple(pieces), self._domain_of(pieces))

    def _fill_leaves(self, leaves: Sequence[int], need: int) -> list[Piece] | None:
        chosen = _fill(leaves, need, self.leaf_caps.__getitem__, self._group_order_key(self.leaf_caps))
        if chosen is None:
            return None
        pieces: list[Piece] = []
        for leaf, units in chosen:
            got = self._fill_nodes(self.layout.leaf_nodes[leaf], units)
            if not got:
                return None
            pieces.extend(got)
        return pieces

    def _fill_nodes(self, nodes: Sequence[int], need: int) -> list[Piece] | None:
        caps = self.caps
        present = [i for i in nodes if i in caps]
        fitter = self.fitter
        return _fill(present, need, caps.__getitem__, lambda i, units: fitter.node_key(i, units))

    def _group_order_key(self, caps: list[int]) -> Callable[[int, int], tuple[float, ...]]:
        seed = self.fitter.seed
        return lambda g, units: (float(caps[g]), float(tie_break(g, seed)))

    # --- scoring of plans -------------------------------------------------------------------------------------

    def _domain_of(self, pieces: Sequence[Piece]) -> Domain:
        slots = self.layout.slots
        if len(pieces) == 1:
            return "node"
        if len({slots[i].leaf for i, _ in pieces}) == 1:
            return "leaf"
        if len({slots[i].spine for i, _ in pieces}) == 1:
            return "spine"
        return "cluster"

    def leaves_of(self, plan: Plan) -> int:
        return len({self.layout.slots[i].leaf for i in plan.nodes})

    def _within_leaf_limit(self, plan: Plan) -> bool:
        limit = self.req.max_leaves
        return limit is None or not self.req.required or self.leaves_of(plan) <= limit

    def _plan_key(self, plan: Plan) -> tuple[float, ...]:
        """Fewest leaves and nodes, then the domain with the least free left over, then a stable tie-break."""
        slots = self.layout.slots
        leaf_free = self.fitter.leaf_free
        leaves = {slots[i].leaf for i in plan.nodes}
        first = slots[plan.pieces[0][0]]
        return (
            float(len(leaves)),
            float(len(plan.pieces)),
            float(sum(leaf_free[x] for x in leaves)),
            float(tie_break(first.leaf, self.fitter.seed)),
        )


def _fill(
    groups: Sequence[int],
    need: int,
    cap: Callable[[int], int],
    fit_key: Callable[[int, int], tuple[float, ...]],
) -> list[Piece] | None:
    """Largest groups first, then the best-fitting group for the remainder: few groups, little left broken."""
    if sum(cap(g) for g in groups) < need:
        return None
    order = sorted((g for g in groups if cap(g) > 0), key=lambda g: (-cap(g), fit_key(g, cap(g))))
    chosen: list[Piece] = []
    rest = need
    for at, g in enumerate(order):
        if cap(g) >= rest:
            fitting = [h for h in order[at:] if cap(h) >= rest]
            best = min(fitting, key=lambda h: fit_key(h, rest))
            chosen.append((best, rest))
            return chosen
        chosen.append((g, cap(g)))
        rest -= cap(g)
    return None
