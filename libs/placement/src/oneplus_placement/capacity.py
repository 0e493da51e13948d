"""Units of one request shape each node can host now, summed per leaf and grouped into classes of equal nodes.

Building the index is the O(nodes) part of a decision; `update` keeps it current for the few nodes an allocation
changed, so a batch or a simulator pays O(nodes) once per request shape, not once per decision.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from .fitters import Fitter
from .request import GangRequest
from .snapshot import Holdings

ClassKey = tuple[object, ...]


class CapacityIndex:
    def __init__(self, fitter: Fitter) -> None:
        self.caps: dict[int, int] = {}
        self.leaf_caps: list[int] = [0] * len(fitter.layout.leaf_nodes)
        lowest = fitter.layout.levels[0]
        # Units per domain of the lowest site level (the leaf list itself when that level is leaf); the levels above
        # sum their children when a search asks (`DomainSearch.level_caps`).
        self.low_caps: list[int] = self.leaf_caps if lowest.name == "leaf" else [0] * len(lowest.members)
        self._low_of = lowest.of_node if lowest.name != "leaf" else None
        # Nodes of one class share board, free GPUs and capacity, so they fit any request of this shape alike.
        self.classes: dict[ClassKey, set[int]] = {}
        self._key_of: dict[int, ClassKey] = {}
        self._leaf_of = [s.leaf for s in fitter.layout.slots]
        self._place(fitter, fitter.candidates())

    def subset(self, keep: Callable[[int], bool]) -> CapacityIndex:
        """The same capacities on the nodes `keep` accepts (a request kept to one GPU model): no node recomputed."""
        sub = CapacityIndex.__new__(CapacityIndex)
        sub.caps, sub.leaf_caps, sub.classes, sub._key_of = {}, [0] * len(self.leaf_caps), {}, {}
        # The lowest site level's units too (the leaf list itself when that level is leaf), as `__init__` keeps them.
        sub._low_of = self._low_of
        sub.low_caps = sub.leaf_caps if self._low_of is None else [0] * len(self.low_caps)
        sub._leaf_of = self._leaf_of
        for i, c in self.caps.items():
            if keep(i):
                sub._add(i, c, self._key_of[i])
        return sub

    def _place(self, fitter: Fitter, nodes: Iterable[int]) -> None:
        # Capacity depends on the node's class, CPU and memory left (and idleness for exclusive gangs): nodes
        # in the same state share one computation.
        snap, slots = fitter.snap, fitter.layout.slots
        cpu_used, mem_used, exclusive = snap.cpu_used, snap.mem_used, fitter.req.exclusive
        memo: dict[tuple[object, ...], tuple[int, ClassKey]] = {}
        for i in nodes:
            key = fitter.class_key(i)
            slot = slots[i]
            state = (key, slot.cpus - cpu_used[i], slot.memory_mb - mem_used[i], exclusive and snap.idle(i))
            got = memo.get(state)
            if got is None:
                c = fitter.capacity(i)
                got = memo[state] = (c, (*key, c))
            if got[0] > 0:
                self._add(i, got[0], got[1])

    def _add(self, i: int, c: int, key: ClassKey) -> None:
        self.caps[i] = c
        self.leaf_caps[self._leaf_of[i]] += c
        if self._low_of is not None:
            self.low_caps[self._low_of[i]] += c
        self._key_of[i] = key
        members = self.classes.get(key)
        if members is None:
            self.classes[key] = {i}
        else:
            members.add(i)

    def _remove(self, i: int) -> None:
        c = self.caps.pop(i, 0)
        if not c:
            return
        self.leaf_caps[self._leaf_of[i]] -= c
        if self._low_of is not None:
            self.low_caps[self._low_of[i]] -= c
        key = self._key_of.pop(i)
        members = self.classes[key]
        members.discard(i)
        if not members:
            del self.classes[key]

    def update(self, fitter: Fitter, nodes: Iterable[int]) -> None:
        """Recompute `nodes` after their holdings changed (`fitter` must read the changed holdings)."""
        nodes = list(nodes)
        for i in nodes:
            self._remove(i)
        self._place(fitter, [i for i in nodes if fitter.eligible[i]])


class CapacityIndexes:
    """One index per request shape over one changing state, kept current by `touched` (the caller says which nodes
    it changed): a cycle that tries many gangs of few shapes pays O(nodes) once per shape, not once per gang.

    Kept from one cycle to the next (the live solver does), an index asked for on a new state of the same layout is
    recounted on the nodes whose change stamps differ from the state it was last kept for: a cycle at 4,096 nodes
    that places one job pays for the nodes that changed since the last, not for every node."""

    def __init__(self) -> None:
        self._by_shape: dict[tuple[object, ...], tuple[Fitter, CapacityIndex]] = {}

    def index(self, fitter: Fitter, req: GangRequest) -> CapacityIndex:
        # Capacities depend on the request's capacity fields and the fitter's kind only (never on its seed); the
        # fitter's request is the one this cluster places (`fitters.adapt`).
        key = (type(fitter), fitter.req.capacity_key)
        got = self._by_shape.get(key)
        if got is None or got[0].layout is not fitter.layout:
            got = self._by_shape[key] = (fitter, CapacityIndex(fitter))
        elif got[0].snap is not fitter.snap:
            was, now = got[0].snap.stamps, fitter.snap.stamps
            got[1].update(fitter, [i for i, stamp in enumerate(now) if stamp != was[i]])
            got = self._by_shape[key] = (fitter, got[1])
        return got[1]

    def touched(self, nodes: Iterable[int], state: Holdings | None = None) -> None:
        """Recompute `nodes` in every index after their holdings changed (in `state`, where given: an index last kept
        for another state, an earlier cycle's, is left as it is; the first ask on `state` recounts what changed)."""
        nodes = list(nodes)
        for fitter, index in self._by_shape.values():
            if state is None or fitter.snap is state:
                index.update(fitter, nodes)
