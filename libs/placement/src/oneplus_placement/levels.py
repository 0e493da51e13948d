"""The domain search: one node, then one leaf, one spine, then the whole cluster, tightest first.

At each level every domain that can hold the gang yields one plan; plans are sorted best fit first (fewest nodes,
then the fullest domain), so small gangs land in fragments and whole nodes and leaves stay free for large gangs.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from oneplus_contracts import Domain

from .capacity import CapacityIndex
from .fitters import Fitter, eligible_kinds, tie_break
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

    def __init__(self, fitter: Fitter, req: GangRequest, index: CapacityIndex | None = None) -> None:
        self.fitter = fitter
        self.req = req
        self.layout = fitter.layout
        # A batch passes an index it keeps current itself; it is read, never changed, here.
        self.index = CapacityIndex(fitter) if index is None else index
        self.caps = self.index.caps
        self._spine_caps: list[int] | None = None
        self._kinds: list[DomainSearch] | None = None

    def kind_searches(self) -> list[DomainSearch]:
        """One search per GPU model when the gang must keep to one model and nodes of several could host it; else
        [] (a cluster of one model pays nothing). Each reads this search's capacities on its model's nodes."""
        if self._kinds is None:
            self._kinds = []
            kinds = eligible_kinds(self.layout, self.req) if self.req.must_choose_kind else ()
            if len(kinds) > 1:
                slots = self.layout.slots
                for kind in kinds:
                    sub = self.index.subset(lambda i, k=kind: slots[i].gpu_model == k)  # type: ignore[misc]
                    self._kinds.append(DomainSearch(self.fitter.of_kind(kind), replace(self.req, kind=kind), sub))
        return self._kinds

    @property
    def leaf_caps(self) -> list[int]:
        return self.index.leaf_caps

    @property
    def spine_caps(self) -> list[int]:
        if self._spine_caps is None:
            caps = [0] * len(self.layout.spine_leaves)
            for leaf, c in enumerate(self.leaf_caps):
                caps[self.layout.leaf_spine[leaf]] += c
            self._spine_caps = caps
        return self._spine_caps

    def plans(self, level: Domain, limit: int | None = None) -> list[Plan]:
        """Every domain of `level` that can hold the gang, best first (at most `limit`); a gang that must keep to one
        GPU model gets the best plans of each model's nodes (one node is always one model)."""
        kinds = self.kind_searches() if level != "node" else []
        if not kinds:
            return self.mixed_plans(level, limit)
        ranked = [(k._kind_key(p), p) for k in kinds for p in k.mixed_plans(level, limit)]
        ranked.sort(key=lambda t: t[0])
        return [p for _, p in ranked[:limit]]

    def _kind_key(self, plan: Plan) -> tuple[float, ...]:
        """Plans of different models compared: fewest leaves and nodes, then the board kinds (the weakest node of the
        ring bounds it: `Fitter.board_key`), then the fill of the domain."""
        key = self._plan_key(plan)
        board = max(self.fitter.board_key(i, units) for i, units in plan.pieces)
        return (*key[:2], *board, *key[2:])

    def mixed_plans(self, level: Domain, limit: int | None = None) -> list[Plan]:
        """Every domain of `level` that can hold the gang, whatever GPU models its nodes have, best first."""
        need = self.req.units
        if level == "node":
            return [Plan(((i, need),), "node") for i in self._best_nodes(need, limit)]
        if level == "leaf":
            plans = self._leaf_plans(need, limit)
        elif level == "spine":
            plans = [self._spine_plan(s, need) for s, c in enumerate(self.spine_caps) if c >= need]
        else:
            plans = [self._cluster_plan(need)] if sum(self.spine_caps) >= need else []
        found = [p for p in plans if p is not None and self._within_leaf_limit(p)]
        found.sort(key=self._plan_key)
        return found[:limit]

    def _best_nodes(self, need: int, limit: int | None) -> list[int]:
        """Nodes that hold the whole gang, best fit first; fit is computed once per class of equal nodes."""
        fitter = self.fitter
        by_fit = sorted(
            (
                (fitter.fit_part(next(iter(nodes)), need), nodes)
                for key, nodes in self.index.classes.items()
                if key[-1] >= need  # type: ignore[operator]
            ),
            key=lambda t: t[0],
        )
        leaf_order, seed = fitter.leaf_order, fitter.seed

        def rest(i: int) -> tuple[int, int]:
            return (leaf_order(i), tie_break(i, seed))

        out: list[int] = []
        at = 0
        while at < len(by_fit) and (limit is None or len(out) < limit):
            fit, members = by_fit[at][0], list(by_fit[at][1])
            at += 1
            while at < len(by_fit) and by_fit[at][0] == fit:
                members += by_fit[at][1]
                at += 1
            if limit is None:
                out += sorted(members, key=rest)
            else:
                out += heapq.nsmallest(limit - len(out), members, key=rest)
        return out

    def _leaf_plans(self, need: int, limit: int | None) -> list[Plan | None]:
        """Rank leaves by nodes needed, the board kinds they would use, and fill level, from capacities alone; fill
        only the best `limit`."""
        caps, layout, fitter = self.caps, self.layout, self.fitter
        leaf_free, seed = fitter.leaf_free, fitter.seed
        ranked: list[tuple[tuple[float, ...], int]] = []
        for leaf, total in enumerate(self.leaf_caps):
            if total < need:
                continue
            nodes = sorted((i for i in layout.leaf_nodes[leaf] if i in caps), key=lambda i: -caps[i])
            got = used = 0
            board: tuple[float, ...] = ()
            for i in nodes:
                units = min(caps[i], need - got)
                board = max(board, fitter.board_key(i, units))  # the weakest board of the ring bounds it
                got += units
                used += 1
                if got >= need:
                    break
            ranked.append(((float(used), *board, float(leaf_free[leaf]), float(tie_break(leaf, seed))), leaf))
        best = heapq.nsmallest(limit, ranked) if limit is not None else sorted(ranked)
        return [self._leaf_plan(leaf, need) for _, leaf in best]

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
    order = sorted((g for g in groups if cap(g) > 0), key=lambda g: (-cap(g), g))
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
