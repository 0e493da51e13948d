"""The domain search: one node, then one domain of each site level (e.g. a multi-node NVLink domain, a leaf, a
spine), then the whole cluster, tightest first.

At each level every domain that can hold the gang yields one plan; plans are sorted best fit first (fewest domains
below, fewest nodes, then the fullest domain), so small gangs land in fragments and whole nodes and domains stay free
for large gangs. A tensor-parallel group that spans ranks is a segment: it never leaves its domain of the segment
level, so capacities at and above that level count whole segments only.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from .capacity import CapacityIndex
from .fitters import Fitter, eligible_kinds, tie_break
from .request import GangRequest

Piece = tuple[int, int]  # (node index, units placed there)


@dataclass(frozen=True)
class Plan:
    """Which nodes host how many units; `domain` is the tightest domain that holds them all."""

    pieces: tuple[Piece, ...]
    domain: str

    @property
    def nodes(self) -> list[int]:
        return [i for i, _ in self.pieces]


class DomainSearch:
    """Capacities of every node for one request, and plans per level built from them."""

    def __init__(self, fitter: Fitter, req: GangRequest | None = None, index: CapacityIndex | None = None) -> None:
        self.fitter = fitter
        # The fitter holds the request as this cluster places it (`fitters.adapt`); `req` is kept for old callers.
        self.req = fitter.req
        self.layout = fitter.layout
        # A batch passes an index it keeps current itself; it is read, never changed, here.
        self.index = CapacityIndex(fitter) if index is None else index
        self.caps = self.index.caps
        names = [lv.name for lv in self.layout.levels]
        level = self.req.segment_level
        self._segment_k = names.index(level) if self.req.segment > 1 and level in names else None
        self._level_caps: dict[int, list[int]] = {}
        self._raw: dict[int, list[int]] = {}
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
        k = self._site_index("spine")
        return self.level_caps(k) if k is not None else [sum(self.leaf_caps)]

    def levels(self) -> tuple[str, ...]:
        """The levels this request may be placed at on this cluster, tightest first."""
        return self.req.levels(self.layout.level_names)

    def _site_index(self, level: str) -> int | None:
        for k, lv in enumerate(self.layout.levels):
            if lv.name == level:
                return k
        return None

    def level_caps(self, k: int) -> list[int]:
        """Units each domain of site level `k` can host; at and above the segment level, in whole segments (a
        tensor-parallel group never leaves its domain)."""
        got = self._level_caps.get(k)
        if got is None:
            raw = self._raw_caps(k)
            seg, at = self.req.segment, self._segment_k
            if at is None or k < at:
                got = raw
            elif k == at:
                got = [c // seg * seg for c in raw]
            else:
                below = self.level_caps(k - 1)
                got = [sum(below[c] for c in ch) for ch in self.layout.levels[k].children]
            self._level_caps[k] = got
        return got

    def _raw_caps(self, k: int) -> list[int]:
        """Units per domain of site level `k`, whatever segments need: kept by the index for the lowest level and the
        leaf, summed from the children above."""
        got = self._raw.get(k)
        if got is None:
            level = self.layout.levels[k]
            if k == 0:
                got = self.index.low_caps
            elif level.name == "leaf":
                got = self.index.leaf_caps
            else:
                below = self._raw_caps(k - 1)
                got = [sum(below[c] for c in ch) for ch in level.children]
            self._raw[k] = got
        return got

    def plans(self, level: str, limit: int | None = None) -> list[Plan]:
        """Every domain of `level` that can hold the gang, best first (at most `limit`); a gang that must keep to one
        GPU model gets the best plans of each model's nodes (one node is always one model)."""
        kinds = self.kind_searches() if level != "node" else []
        if not kinds:
            return self.mixed_plans(level, limit)
        k = len(self.layout.levels) if level == "cluster" else self._site_index(level)
        if k is None:
            return []
        ranked = [(s._kind_key(p, k), p) for s in kinds for p in s.mixed_plans(level, limit)]
        ranked.sort(key=lambda t: t[0])
        return [p for _, p in ranked[:limit]]

    def _kind_key(self, plan: Plan, k: int) -> tuple[float, ...]:
        """Plans of different models at site level `k` compared: fewest domains below and nodes (`_plan_key`), then
        the board kinds (the weakest node of the ring bounds it: `Fitter.board_key`), then the fill of the domain."""
        key = self._plan_key(plan, k)
        board = max(self.fitter.board_key(i, units) for i, units in plan.pieces)
        return (*key[:-2], *board, *key[-2:])

    def mixed_plans(self, level: str, limit: int | None = None) -> list[Plan]:
        """Every domain of `level` that can hold the gang, whatever GPU models its nodes have, best first."""
        need = self.req.units
        if level == "node":
            return [Plan(((i, need),), "node") for i in self._best_nodes(need, limit)]
        levels = self.layout.levels
        if level == "cluster":
            k = len(levels)
            top = len(levels) - 1
            caps = self.level_caps(top)
            chosen = self._fill_groups(top, range(len(caps)), need) if sum(caps) >= need else None
            plans = [self._plan(chosen)]
        else:
            at = self._site_index(level)
            if at is None:
                return []
            k = at
            caps = self.level_caps(k)
            if k == 0:
                plans = [self._plan(self._fill_group(0, g, need)) for g in self._ranked_lowest(need, limit)]
            else:
                plans = [self._plan(self._fill_group(k, g, need)) for g, c in enumerate(caps) if c >= need]
        found = [p for p in plans if p is not None and self._within_leaf_limit(p)]
        found.sort(key=lambda p: self._plan_key(p, k))
        return found[:limit]

    def _plan(self, pieces: list[Piece] | None) -> Plan | None:
        if not pieces:
            return None
        return Plan(tuple(pieces), self.layout.domain_of_nodes([i for i, _ in pieces]))

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

    def _ranked_lowest(self, need: int, limit: int | None) -> list[int]:
        """Rank the domains of the lowest site level (leaves, or multi-node NVLink domains) by nodes needed, the board
        kinds they would use, and fill level (fullest first: whole domains stay whole for the gangs that need them),
        from capacities alone; only the best `limit` are filled."""
        caps, fitter = self.caps, self.fitter
        lowest = self.layout.levels[0]
        group_free, seed = fitter.snap.low_free, fitter.seed
        ranked: list[tuple[tuple[float, ...], int]] = []
        for g, total in enumerate(self.level_caps(0)):
            if total < need:
                continue
            nodes = sorted((i for i in lowest.members[g] if i in caps), key=lambda i: -caps[i])
            got = used = 0
            board: tuple[float, ...] = ()
            for i in nodes:
                units = min(caps[i], need - got)
                board = max(board, fitter.board_key(i, units))  # the weakest board of the ring bounds it
                got += units
                used += 1
                if got >= need:
                    break
            ranked.append(((float(used), *board, float(group_free[g]), float(tie_break(g, seed))), g))
        best = heapq.nsmallest(limit, ranked) if limit is not None else sorted(ranked)
        return [g for _, g in best]

    def best(self, levels: Sequence[str]) -> Plan | None:
        for level in levels:
            got = self.plans(level, limit=1)
            if got:
                return got[0]
        return None

    # --- fills ------------------------------------------------------------------------------------------------

    def _fill_group(self, k: int, g: int, need: int) -> list[Piece] | None:
        """`need` units inside domain `g` of site level `k`: node by node when its children are single nodes,
        else its largest child domains first and the best-fitting one for the rest."""
        level = self.layout.levels[k]
        if level.flat[g]:
            return self._fill_nodes(level.members[g], need)
        return self._fill_groups(k - 1, level.children[g], need)

    def _fill_groups(self, k: int, groups: Sequence[int], need: int) -> list[Piece] | None:
        caps = self.level_caps(k)
        chosen = _fill(groups, need, caps.__getitem__, self._group_order_key(caps))
        if chosen is None:
            return None
        pieces: list[Piece] = []
        for g, units in chosen:
            got = self._fill_group(k, g, units)
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

    def leaves_of(self, plan: Plan) -> int:
        return len({self.layout.slots[i].leaf for i in plan.nodes})

    def _within_leaf_limit(self, plan: Plan) -> bool:
        limit = self.req.max_leaves
        return limit is None or not self.req.required or self.leaves_of(plan) <= limit

    def _plan_key(self, plan: Plan, k: int) -> tuple[float, ...]:
        """Fewest domains at each level below the plan's (widest first) and fewest nodes, then the domains with the
        least free left over, then a stable tie-break."""
        levels = self.layout.levels
        nodes = plan.nodes
        counts = [float(len({levels[j].of_node[i] for i in nodes})) for j in range(k - 1, -1, -1)]
        low = {levels[0].of_node[i] for i in nodes}
        free = self.fitter.snap.low_free
        first = levels[0].of_node[plan.pieces[0][0]]
        return (
            *counts,
            float(len(plan.pieces)),
            float(sum(free[x] for x in low)),
            float(tie_break(first, self.fitter.seed)),
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
