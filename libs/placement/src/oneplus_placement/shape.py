"""A node's GPU layout reduced to what placement compares, computed once per distinct layout.

Every node of the same board shares one `NodeShape`; its caches answer "which k GPUs out of these free ones" in
O(1) after the first call, so a decision over thousands of nodes does no per-node subset search.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from math import comb

from oneplus_contracts import NodeTopology
from oneplus_topology.analysis import NodeModel, node_model, rails

# Nearest first; NVLink of any width is tier 0, an unknown link kind is farther than SYS.
_TIER = {"PIX": 1, "PXB": 2, "PHB": 3, "NODE": 4, "SYS": 5}
_UNKNOWN_TIER = 6
# Above this many subsets a pick grows the set one GPU at a time instead of enumerating.
_ENUMERATION_LIMIT = 4000

# Rank sizes whose future fit a pick protects, largest first.
_REMAINDER_SIZES = (16, 8, 4, 2)

Quality = tuple[float, float, float, float]
_SINGLE: Quality = (0.0, 0.0, 0.0, 0.0)


def link_tier(kind: str) -> int:
    k = kind.upper()
    if k.startswith("NV"):
        return 0
    return _TIER.get(k, _UNKNOWN_TIER)


def bits(mask: int) -> Iterator[int]:
    """Positions of the set bits of `mask`, lowest first."""
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


def popcount(mask: int) -> int:
    return mask.bit_count()


@dataclass(eq=False)
class NodeShape:
    """Pairwise bandwidth, PCIe distance, NVLink domains and NIC rails of one board, with pick caches.

    Built on the topology library's `NodeModel` (matrices, NVLink domains, ring bandwidth); this adds the
    bitmask caches placement needs: best subsets per free set, how many units fit, what a pick leaves behind.
    """

    model: NodeModel
    n: int
    indexes: tuple[int, ...]
    gbps: tuple[tuple[float, ...], ...]
    tier: tuple[tuple[int, ...], ...]
    domains: tuple[int, ...]
    rails: tuple[int, ...]
    _ring: dict[int, float] = field(default_factory=dict, repr=False)
    _quality: dict[int, Quality] = field(default_factory=dict, repr=False)
    _top: dict[tuple[int, int, int], tuple[int, ...]] = field(default_factory=dict, repr=False)
    _value: dict[int, tuple[float, ...]] = field(default_factory=dict, repr=False)
    _capacity: dict[tuple[int, int, int], int] = field(default_factory=dict, repr=False)
    _fit: dict[tuple[int, int, int], tuple[float, float]] = field(default_factory=dict, repr=False)

    @property
    def full(self) -> int:
        return (1 << self.n) - 1

    @property
    def largest_domain(self) -> int:
        return max((popcount(d) for d in self.domains), default=0)

    def domain_of(self, pos: int) -> int:
        for d in self.domains:
            if d >> pos & 1:
                return d
        return 1 << pos

    def gpu_indexes(self, mask: int) -> list[int]:
        return [self.indexes[p] for p in bits(mask)]

    def mask_of(self, gpu_indexes: list[int]) -> int:
        pos = {g: p for p, g in enumerate(self.indexes)}
        mask = 0
        for g in gpu_indexes:
            if g not in pos:
                raise ValueError(f"GPU {g} does not exist on this node (GPUs {list(self.indexes)})")
            mask |= 1 << pos[g]
        return mask

    def rail_set(self, mask: int) -> frozenset[int]:
        return frozenset(self.rails[p] for p in bits(mask))

    # --- bandwidth of a GPU set -------------------------------------------------------------------------------

    def ring_gbps(self, mask: int) -> float:
        """Bottleneck of the best ring through the GPUs of `mask` (0 for fewer than two GPUs)."""
        got = self._ring.get(mask)
        if got is None:
            got = self.model.ring_gbps(self.gpu_indexes(mask)) if popcount(mask) > 1 else 0.0
            self._ring[mask] = got
        return got

    def quality(self, mask: int) -> Quality:
        """Ring bottleneck, then weakest pair (a fully NVLinked quad beats a ring), nearest PCIe tier, mean pair."""
        got = self._quality.get(mask)
        if got is not None:
            return got
        pos = list(bits(mask))
        if len(pos) < 2:
            got = _SINGLE
        else:
            pairs = list(itertools.combinations(pos, 2))
            worst_pair = min(self.gbps[a][b] for a, b in pairs)
            worst_tier = max(self.tier[a][b] for a, b in pairs)
            mean = sum(self.gbps[a][b] for a, b in pairs) / len(pairs)
            got = (round(self.ring_gbps(mask), 6), round(worst_pair, 6), float(-worst_tier), round(mean, 6))
        self._quality[mask] = got
        return got

    def grouped(self, mask: int, group: int) -> bool:
        """Whether `mask` splits into groups of `group` GPUs that each sit inside one NVLink domain."""
        if group <= 1:
            return True
        return all(popcount(mask & d) % group == 0 for d in self.domains)

    # --- picks ------------------------------------------------------------------------------------------------

    def top(self, free: int, size: int, group: int = 1) -> tuple[int, ...]:
        """The best `size`-GPU subsets of `free` (ties of the best quality), best remainder first."""
        key = (free, size, group)
        got = self._top.get(key)
        if got is None:
            got = self._compute_top(free, size, group)
            self._top[key] = got
        return got

    def fit(self, free: int, size: int, group: int = 1) -> tuple[float, float]:
        """(0 if the best pick of `size` GPUs from `free` is as good as on an empty board else 1, GPUs left)."""
        key = (free, size, group)
        got = self._fit.get(key)
        if got is None:
            tops = self.top(free, size, group)
            best = self.top(self.full, size, group)
            ideal = bool(tops) and bool(best) and self.quality(tops[0]) >= self.quality(best[0])
            got = (0.0 if ideal else 1.0, float(popcount(free) - size))
            self._fit[key] = got
        return got

    def capacity(self, free: int, unit: int, group: int = 1) -> int:
        """How many units of `unit` GPUs (grouped by `group`) fit in `free` together."""
        key = (free, unit, group)
        got = self._capacity.get(key)
        if got is None:
            got = popcount(free) // unit
            while got > 0 and not self.top(free, got * unit, group):
                got -= 1
            self._capacity[key] = got
        return got

    def _compute_top(self, free: int, size: int, group: int) -> tuple[int, ...]:
        avail = list(bits(free))
        if size <= 0 or size > len(avail):
            return ()
        if comb(len(avail), size) > _ENUMERATION_LIMIT:
            grown = self._grow(avail, size, group)
            return (grown,) if grown else ()
        best_q: Quality | None = None
        ties: list[int] = []
        for combo in itertools.combinations(avail, size):
            mask = 0
            for p in combo:
                mask |= 1 << p
            if not self.grouped(mask, group):
                continue
            q = self.quality(mask)
            if best_q is None or q > best_q:
                best_q, ties = q, [mask]
            elif q == best_q:
                ties.append(mask)
        ties.sort(key=lambda m: (tuple(-v for v in self.remainder_value(free & ~m)), m))
        return tuple(ties)

    def remainder_value(self, rest: int) -> tuple[float, ...]:
        """How useful the GPUs left free are: the quality of the best 8, then 4, then 2 GPUs among them.

        Power-of-two ranks are what jobs ask for, so a pick that keeps a whole NVLink quad or switch pair free
        beats one that leaves the same number of GPUs scattered.
        """
        got = self._value.get(rest)
        if got is not None:
            return got
        size = popcount(rest)
        values: list[float] = []
        if size >= 2 and comb(size, size // 2) > _ENUMERATION_LIMIT // 4:
            values = [self.ring_gbps(rest)]
        else:
            for s in _REMAINDER_SIZES:
                if s <= size:
                    tops = self.top(rest, s)
                    values.extend(self.quality(tops[0]) if tops else _SINGLE)
        got = tuple(values)
        self._value[rest] = got
        return got

    def _grow(self, avail: list[int], size: int, group: int) -> int:
        """Large boards: start from the strongest pair, add the GPU best linked to the set, keep domains whole."""
        if group > 1:
            chosen = 0
            for d in sorted(self.domains, key=lambda d: (-popcount(d & _mask(avail)), d)):
                take = [p for p in bits(d) if p in avail]
                take = take[: (len(take) // group) * group]
                for p in take[: size - popcount(chosen)]:
                    chosen |= 1 << p
                if popcount(chosen) == size:
                    return chosen if self.grouped(chosen, group) else 0
            return 0
        a, b = max(itertools.combinations(avail, 2), key=lambda ab: (self.gbps[ab[0]][ab[1]], -ab[0], -ab[1]))
        chosen_pos = [a, b]
        while len(chosen_pos) < size:
            rest = [p for p in avail if p not in chosen_pos]
            nxt = max(rest, key=lambda p: (min(self.gbps[p][c] for c in chosen_pos), -p))
            chosen_pos.append(nxt)
        return _mask(chosen_pos[:size])


def _mask(positions: list[int]) -> int:
    m = 0
    for p in positions:
        m |= 1 << p
    return m


_SHAPES: dict[tuple[int, tuple[int, ...]], NodeShape] = {}


def shape_of(topo: NodeTopology) -> NodeShape:
    """The shared shape of a node's board, built on first sight of that layout (and link health)."""
    model = node_model(topo)
    rails = _rails(topo, model)
    key = (id(model), rails)
    shape = _SHAPES.get(key)
    if shape is not None and shape.model is model:
        return shape
    n = len(model.indices)
    pos = model.pos
    in_domain = {pos[g] for d in model.domains for g in d}
    domains = tuple(_mask([pos[g] for g in d]) for d in model.domains) + tuple(
        1 << p for p in range(n) if p not in in_domain
    )
    shape = NodeShape(
        model=model,
        n=n,
        indexes=tuple(model.indices),
        gbps=tuple(tuple(row) for row in model.gbps),
        tier=tuple(tuple(link_tier(k) for k in row) for row in model.kind),
        domains=domains,
        rails=rails,
    )
    if len(_SHAPES) >= 4096:
        _SHAPES.clear()
    _SHAPES[key] = shape
    return shape


def _rails(topo: NodeTopology, model: NodeModel) -> tuple[int, ...]:
    """Rail of each GPU: its nearest NIC (by position in the NIC list); without a near NIC, a rail of its own."""
    near = rails(topo)
    nic_ix = {nic.name: r for r, nic in enumerate(topo.nics)}
    out = []
    for p, g in enumerate(model.indices):
        names = near.get(g) or []
        out.append(nic_ix[names[0]] if names and names[0] in nic_ix else 1000 + p)
    return tuple(out)
