"""Units of one request shape each node can host now, summed per leaf and grouped into classes of equal nodes.

Building the index is the O(nodes) part of a decision; `update` keeps it current for the few nodes an allocation
changed, so a batch or a simulator pays O(nodes) once per request shape, not once per decision.
"""

from __future__ import annotations

from collections.abc import Iterable

from .fitters import Fitter

ClassKey = tuple[object, ...]


class CapacityIndex:
    def __init__(self, fitter: Fitter) -> None:
        self.caps: dict[int, int] = {}
        self.leaf_caps: list[int] = [0] * len(fitter.layout.leaf_nodes)
        # Nodes of one class share board, free GPUs and capacity, so they fit any request of this shape alike.
        self.classes: dict[ClassKey, set[int]] = {}
        self._key_of: dict[int, ClassKey] = {}
        self._leaf_of = [s.leaf for s in fitter.layout.slots]
        for i in fitter.candidates():
            c = fitter.capacity(i)
            if c > 0:
                self._add(i, c, (*fitter.class_key(i), c))

    def _add(self, i: int, c: int, key: ClassKey) -> None:
        self.caps[i] = c
        self.leaf_caps[self._leaf_of[i]] += c
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
        key = self._key_of.pop(i)
        members = self.classes[key]
        members.discard(i)
        if not members:
            del self.classes[key]

    def update(self, fitter: Fitter, nodes: Iterable[int]) -> None:
        """Recompute `nodes` after their holdings changed (`fitter` must read the changed holdings)."""
        for i in nodes:
            self._remove(i)
            c = fitter.capacity(i) if fitter.eligible[i] else 0
            if c > 0:
                self._add(i, c, (*fitter.class_key(i), c))
