"""How one node hosts units of a gang: whole GPUs (by ring quality) or GPU shares (packed onto shared GPUs).

A fitter answers three questions per node — how many units fit now, how good a home the node is for `u` units
(a sort key: best fit first), and which GPUs those units get — so the domain search above it is the same for both.
"""

from __future__ import annotations

import copy
import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cached_property

from .bandwidth import board_shortfall, fabric_gbps
from .fgd import FragMeter, WorkloadShape, after, gradient_score, untouched
from .layout import Layout, NodeSlot
from .request import GangRequest
from .shape import NodeShape, bits
from .snapshot import FULL_SHARE, Holdings

NodeKey = tuple[float, ...]


@dataclass(frozen=True)
class RankPick:
    """One rank's GPUs on one node (positions as a mask) and its share of each, 0 for whole GPUs."""

    node: int
    mask: int
    milli: int


def tie_break(i: int, seed: int) -> int:
    """Seed 0 keeps node order; another seed gives another fixed order among equally good nodes."""
    if seed == 0:
        return i
    return ((i + 1) * 0x9E3779B1 ^ (seed * 0x85EBCA6B)) & 0xFFFFFFFF


def adapt(layout: Layout, req: GangRequest) -> GangRequest:
    """`req` as this cluster places it: a tensor-parallel group that spans ranks becomes a segment of ranks inside
    one domain of its group level when that level has domains of several nodes (`GangRequest.on_layout`)."""
    if req.ranks_per_unit == 1:
        return req
    level = layout.level(req.group_domain or "nvlink")
    key = ("multi_node", level.name if level is not None else None)
    multi = layout.cache.get(key)
    if multi is None:
        multi = layout.cache[key] = level is not None and any(len(m) > 1 for m in level.members)
    return req.on_layout(layout.level_names, bool(multi))


def solo(layout: Layout, req: GangRequest, i: int) -> bool:
    """Whether node `i` is alone in its domain of the request's segment level: it hosts whole groups of `tp` GPUs."""
    if req.segment <= 1 or req.segment_level is None:
        return False
    level = layout.level(req.segment_level)
    return level is None or level.solo(i)


def static_eligible(layout: Layout, req: GangRequest) -> tuple[bool, ...]:
    """Nodes that could host one unit on an empty cluster: model, size, NVLink domains, CPU, memory; with segments,
    in a domain whose nodes could hold one whole tensor-parallel group."""
    key = (
        "eligible",
        req.models,
        req.kind,
        req.features,
        req.hosts,
        req.unit_gpus,
        req.group,
        req.shared,
        req.gpu_memory_mb,
        req.unit_cpus,
        req.unit_memory_mb,
        req.segment,
        req.segment_level,
        req.tp,
    )
    got = layout.cache.get(key)
    if got is None:
        got = tuple(_could_host(layout, s, req) for s in layout.slots)
        if req.segment > 1:
            got = _whole_segments(layout, req, got)
        layout.cache[key] = got
    return got  # type: ignore[return-value]


def eligible_kinds(layout: Layout, req: GangRequest) -> tuple[str, ...]:
    """The GPU models (exact names) of the nodes that could host one unit of the request, sorted."""
    key = ("kinds", req.models, req.kind, req.features, req.hosts, req.unit_gpus, req.group, req.shared,
           req.gpu_memory_mb, req.unit_cpus, req.unit_memory_mb, req.segment, req.segment_level, req.tp)  # fmt: skip
    got = layout.cache.get(key)
    if got is None:
        eligible = static_eligible(layout, req)
        got = tuple(sorted({s.gpu_model for s in layout.slots if eligible[s.index]}))
        layout.cache[key] = got
    return got  # type: ignore[return-value]


def _could_host(layout: Layout, slot: NodeSlot, req: GangRequest) -> bool:
    if req.hosts is not None and not req.hosts.allows(slot.name):
        return False
    if not slot.matches_model(req.models) or not slot.matches_features(req.features):
        return False
    if req.kind is not None and slot.gpu_model != req.kind:
        return False
    if slot.cpus + 1e-9 < req.unit_cpus or slot.memory_mb < req.unit_memory_mb:
        return False
    if req.shared:
        return slot.shape.n > 0 and _memory_could_hold(slot, req.gpu_memory_mb)
    if solo(layout, req, slot.index):
        per_group = req.segment
        return (
            slot.shape.capacity(slot.shape.full, req.tp, req.tp) > 0
            and slot.cpus + 1e-9 >= req.unit_cpus * per_group
            and slot.memory_mb >= req.unit_memory_mb * per_group
        )
    return slot.shape.capacity(slot.shape.full, req.unit_gpus, req.group) > 0


def _memory_could_hold(slot: NodeSlot, need: int | None) -> bool:
    """Some GPU of the node has the memory a share asks (or does not say how much it has)."""
    if not need:
        return True
    return any(g.memory_mb is None or g.memory_mb >= need for g in slot.topology.gpus)


def static_units(layout: Layout, req: GangRequest, slot: NodeSlot) -> int:
    """Units an empty node hosts (before CPU and memory)."""
    if solo(layout, req, slot.index):
        return slot.shape.capacity(slot.shape.full, req.tp, req.tp) * req.segment
    return slot.shape.capacity(slot.shape.full, req.unit_gpus, req.group)


def _whole_segments(layout: Layout, req: GangRequest, eligible: tuple[bool, ...]) -> tuple[bool, ...]:
    """Only nodes whose domain of the segment level, empty, holds one whole tensor-parallel group."""
    level = layout.level(req.segment_level or "")
    if level is None:
        return eligible
    out = list(eligible)
    for members in level.members:
        units = 0
        for i in members:
            if eligible[i]:
                slot = layout.slots[i]
                res = min(int(slot.cpus // req.unit_cpus), slot.memory_mb // req.unit_memory_mb)
                units += min(static_units(layout, req, slot), res)
        if units < req.segment:
            for i in members:
                out[i] = False
    return tuple(out)


class Fitter(ABC):
    """Common bookkeeping: eligibility, CPU/memory caps, leaf fill levels for best fit."""

    def __init__(self, snap: Holdings, req: GangRequest, seed: int = 0) -> None:
        self.snap = snap
        self.req = req
        self.seed = seed
        self.layout = snap.layout
        self.eligible = static_eligible(snap.layout, req)
        self.segmented = req.segment > 1  # a tensor-parallel group may span the nodes of one domain
        # Free GPUs per domain of the lowest site level, and each node's domain there (the leaf on most clusters).
        self._low_free = snap.low_free
        self._low_of = snap.layout.levels[0].of_node

    @property
    def leaf_free(self) -> list[int]:
        return self.snap.leaf_free

    def of_kind(self, kind: str) -> Fitter:
        """This fitter with the request kept to nodes of one GPU model: only which nodes are eligible changes."""
        other = copy.copy(self)
        other.req = replace(self.req, kind=kind)
        other.eligible = static_eligible(self.layout, other.req)
        return other

    def spread_cap(self, units: int) -> int:
        """A gang spread over distinct nodes (Slurm --nodes) takes one unit per node."""
        return min(units, 1) if self.req.spread else units

    def resource_cap(self, i: int) -> int:
        """Units the node's free CPU and memory allow."""
        snap, req, slot = self.snap, self.req, self.layout.slots[i]
        cpu = int((slot.cpus - snap.cpu_used[i] + 1e-9) // req.unit_cpus)
        mem = (slot.memory_mb - snap.mem_used[i]) // req.unit_memory_mb
        return cpu if cpu < mem else mem

    @abstractmethod
    def candidates(self) -> list[int]:
        """Indexes of the nodes that could host at least one unit of the request."""

    @abstractmethod
    def capacity(self, i: int) -> int:
        """Units of the request node `i` can still host."""

    @abstractmethod
    def class_key(self, i: int) -> tuple[object, ...]:
        """Nodes with equal keys (and capacity) fit a request equally well, up to their leaf and the tie-break."""

    @abstractmethod
    def fit_part(self, i: int, units: int) -> tuple[float, ...]:
        """How tightly `units` fill node `i`: smaller is a better (best-fit) choice."""

    def board_key(self, i: int, units: int) -> tuple[float, ...]:
        """Which board kind suits `units` of this gang on node `i`, smaller first; () where kinds do not matter."""
        return ()

    packs_leaves = True  # among equally fit nodes, the fullest leaf first

    def leaf_order(self, i: int) -> int:
        """Where node `i` comes among equally fit nodes before the tie-break: the free GPUs of its domain at the lowest
        site level (its leaf, or its multi-node NVLink domain where the site has them), fullest first, so small gangs
        go where fragments are and whole domains stay whole."""
        return self._low_free[self._low_of[i]] if self.packs_leaves else 0

    def node_key(self, i: int, units: int) -> NodeKey:
        """Best fit first: the per-class fit, then the fullest leaf, then a seeded tie-break."""
        return (*self.fit_part(i, units), float(self.leaf_order(i)), float(tie_break(i, self.seed)))

    @abstractmethod
    def pick(self, i: int, units: int, rails: frozenset[int] | None) -> list[RankPick]:
        """The GPUs of each of the `units` ranks placed on node `i`, rails aligned when asked."""


class WholeGpuFitter(Fitter):
    """Units of whole GPUs; a unit's GPUs are the best-ring subset that leaves the node's rest most useful."""

    def candidates(self) -> list[int]:
        unit, fc, el = self.req.unit_gpus, self.snap.free_count, self.eligible
        return [i for i in range(len(fc)) if fc[i] >= unit and el[i]]

    def capacity(self, i: int) -> int:
        snap, req = self.snap, self.req
        if req.exclusive and not snap.idle(i):
            return 0
        shape = self.layout.slots[i].shape
        if self.segmented and self._solo(i):
            # Alone in its domain: whole tensor-parallel groups on this node's NVLink, as without segments.
            groups = shape.capacity(snap.free[i], req.tp, req.tp)
            return min(groups, self.resource_cap(i) // req.segment) * req.segment if groups else 0
        c = shape.capacity(snap.free[i], req.unit_gpus, req.group)
        return self.spread_cap(min(c, self.resource_cap(i))) if c else 0

    def _solo(self, i: int) -> bool:
        return self.segmented and solo(self.layout, self.req, i)

    def union(self, i: int, units: int, rails: frozenset[int] | None = None) -> int:
        shape = self.layout.slots[i].shape
        group = self.req.tp if self._solo(i) else self.req.group
        tops = shape.top(self.snap.free[i], units * self.req.unit_gpus, group)
        if rails is not None:
            for m in tops:
                if shape.rail_set(m) == rails:
                    return m
        return tops[0]

    def class_key(self, i: int) -> tuple[object, ...]:
        if self.segmented:
            return (id(self.layout.slots[i].shape), self.snap.free[i], self._solo(i))
        return (id(self.layout.slots[i].shape), self.snap.free[i])

    def board_key(self, i: int, units: int) -> tuple[float, ...]:
        """A board kind as fast as the cluster's best for this gang first; among those, the kind least worth keeping
        for the gangs that need a fast board (a one-GPU job, or a gang whose ring the network bounds, leaves the
        NVLink boards to the gangs that ring inside one node)."""
        layout, req = self.layout, self.req
        shape, size = layout.slots[i].shape, units * req.unit_gpus
        total = req.ranks * req.gpus_per_rank
        # A gang that spans nodes rings over the network: a board faster than it buys nothing.
        cap = fabric_gbps(layout, crosses_leaf=False) if size < total else math.inf
        short = board_shortfall(layout, shape, size, req.group, cap) if total >= 2 else 0.0
        return (short, -board_shortfall(layout, shape, shape.n) if req.keep_strong_boards else 0.0)

    def fit_part(self, i: int, units: int) -> tuple[float, ...]:
        """The board kind (`board_key`), then the ideal ring for this board, then the fewest free GPUs left on the
        node (best fit)."""
        shape, size = self.layout.slots[i].shape, units * self.req.unit_gpus
        group = self.req.tp if self._solo(i) else self.req.group
        return (*self.board_key(i, units), *shape.fit(self.snap.free[i], size, group))

    def pick(self, i: int, units: int, rails: frozenset[int] | None) -> list[RankPick]:
        shape = self.layout.slots[i].shape
        req = self.req
        union = self.union(i, units, rails)
        out: list[RankPick] = []
        rest = union
        if self._solo(i):
            # Whole tensor-parallel groups, each split into its ranks.
            while rest:
                group_mask = shape.top(rest, req.tp, req.tp)[0]
                rest &= ~group_mask
                for rank_mask in split_unit(shape, group_mask, req.gpus_per_rank, req.segment, req.tp):
                    out.append(RankPick(i, rank_mask, 0))
            return out
        while rest:
            unit_mask = shape.top(rest, req.unit_gpus, req.group)[0]
            rest &= ~unit_mask
            for rank_mask in split_unit(shape, unit_mask, req.gpus_per_rank, req.ranks_per_unit, req.group):
                out.append(RankPick(i, rank_mask, 0))
        return out


def split_unit(shape: NodeShape, unit_mask: int, k: int, ranks: int, group: int) -> list[int]:
    """A TP group spanning ranks splits into its ranks, each the best ring of what is left."""
    if ranks == 1:
        return [unit_mask]
    out: list[int] = []
    rest = unit_mask
    for _ in range(ranks):
        m = shape.top(rest, k)[0]
        out.append(m)
        rest &= ~m
    return out


def ordered_gpus(shape: NodeShape, mask: int) -> list[int]:
    """GPU indexes with each NVLink domain's GPUs together, so consecutive TP groups share a domain."""
    order = {p: n for n, d in enumerate(shape.domains) for p in bits(d)}
    return [shape.indexes[p] for p in sorted(bits(mask), key=lambda p: (order.get(p, 0), p))]


class ShareFitter(Fitter):
    """Ranks of a fraction of one GPU: fill GPUs already shared (fullest first), then open as few new ones as can."""

    def candidates(self) -> list[int]:
        el, sched = self.eligible, self.snap.schedulable
        return [i for i in range(len(el)) if el[i] and sched[i]]

    def memory_room(self, i: int, p: int) -> int | None:
        """Shares of this request GPU p of node i still has memory for; None when unlimited (no memory asked, or the
        topology gives none for the GPU)."""
        need = self.req.gpu_memory_mb
        if not need:
            return None
        left = self.snap.gpu_memory_left(i, p)
        return None if left is None else max(0, left // need)

    def _fresh_room(self, i: int, p: int) -> int:
        room = FULL_SHARE // self.req.milli
        mem = self.memory_room(i, p)
        return room if mem is None else min(room, mem)

    def _per_fresh(self, i: int) -> int:
        """Shares one newly opened GPU of node i takes: by compute share, and by its memory when the share asks some."""
        per = FULL_SHARE // self.req.milli
        if self.req.gpu_memory_mb:
            per = min((self._fresh_room(i, p) for p in bits(self.snap.free[i])), default=per)
        return per

    def _rooms(self, i: int) -> tuple[list[tuple[int, int]], int]:
        """(position, ranks it can take) of shared GPUs fullest first; and the count of whole free GPUs."""
        snap, milli = self.snap, self.req.milli
        shares = snap.shares[i]
        shared: list[tuple[int, int, int]] = []
        if shares is not None:
            for p in bits(snap.share_mask[i] & ~snap.blocked[i]):
                room = (FULL_SHARE - shares[p]) // milli
                mem = self.memory_room(i, p)
                room = room if mem is None else min(room, mem)
                if room > 0:
                    shared.append((-shares[p], p, room))
        shared.sort()
        return [(p, room) for _, p, room in shared], snap.free_count[i]

    def capacity(self, i: int) -> int:
        if self.req.exclusive and not self.snap.idle(i):
            return 0
        shared, fresh = self._rooms(i)
        gpu_cap = (sum(r for _, r in shared) + fresh * self._per_fresh(i)) // self.req.ranks_per_unit
        return self.spread_cap(min(gpu_cap, self.resource_cap(i))) if gpu_cap else 0

    def class_key(self, i: int) -> tuple[object, ...]:
        snap = self.snap
        memory = snap.gpu_mem_used[i] if self.req.gpu_memory_mb else None
        return (id(self.layout.slots[i].shape), snap.free[i], snap.shares[i], snap.blocked[i], memory)

    def fit_part(self, i: int, units: int) -> tuple[float, ...]:
        """Fewest whole GPUs newly opened for shares, then the node with the fewest free whole GPUs."""
        shared, _ = self._rooms(i)
        in_shared = sum(r for _, r in shared)
        ranks = units * self.req.ranks_per_unit
        fresh = math.ceil(max(0, ranks - in_shared) / max(self._per_fresh(i), 1))
        return (float(fresh), float(self.snap.free_count[i]))

    def pick(self, i: int, units: int, rails: frozenset[int] | None) -> list[RankPick]:
        shape = self.layout.slots[i].shape
        shared, _ = self._rooms(i)
        slots: list[tuple[int, int]] = list(shared)
        free = self.snap.free[i]
        out: list[RankPick] = []
        while len(out) < units * self.req.ranks_per_unit:
            if not slots:
                p_mask = shape.top(free, 1)[0]
                free &= ~p_mask
                p = p_mask.bit_length() - 1
                if room := self._fresh_room(i, p):
                    slots.append((p, room))
                continue
            p, room = slots[0]
            out.append(RankPick(i, 1 << p, self.req.milli))
            slots[0] = (p, room - 1)
            if room - 1 == 0:
                slots.pop(0)
        return out


def rank_gpus(layout: Layout, picks: Sequence[RankPick]) -> list[list[int]]:
    return [ordered_gpus(layout.slots[p.node].shape, p.mask) for p in picks]


def gpu_left(snap: Holdings, i: int) -> list[int]:
    """Milli-GPUs left per GPU position of node `i`: a free GPU 1000, a shared one what its shares leave, else 0."""
    shape = snap.layout.slots[i].shape
    free, shared, blocked, shares = snap.free[i], snap.share_mask[i], snap.blocked[i], snap.shares[i]
    out = []
    for p in range(shape.n):
        bit = 1 << p
        if blocked & bit:
            out.append(0)
        elif free & bit:
            out.append(FULL_SHARE)
        elif shared & bit and shares is not None:
            out.append(FULL_SHARE - shares[p])
        else:
            out.append(0)
    return out


def fgd_inputs(snap: Holdings, i: int, memory: bool = False) -> tuple[object, ...]:
    """What the FGD meter reads of node `i` beyond its GPUs: its GPU model, the CPUs left and, for a meter that reads
    memory, the memory left. Two nodes of one board shape may differ in each, so FGD's class of equal nodes must name
    them."""
    slot = snap.layout.slots[i]
    cpus = slot.cpus - snap.cpu_used[i]
    return (slot.gpu_model, cpus, snap.mem_free(i)) if memory else (slot.gpu_model, cpus)


class FgdState:
    """Node `i` as the FGD meter sees it, and how much placing units of the request there grows its fragmentation."""

    def __init__(self, fitter: Fitter, meter: FragMeter, i: int) -> None:
        slot = fitter.layout.slots[i]
        self.meter = meter
        self.model = slot.gpu_model
        self.cpu_left = round((slot.cpus - fitter.snap.cpu_used[i]) * 1000)  # milli-CPUs: 91.2 is 91200, not 91199
        self.mem_left = fitter.snap.mem_free(i)
        self.unit_cpus = fitter.req.unit_cpus
        self.unit_memory_mb = fitter.req.unit_memory_mb
        self.left = gpu_left(fitter.snap, i)

    @property
    def untouched(self) -> float:
        """1.0 when every GPU of the node is whole and free (FGD keeps such nodes for last), else 0.0."""
        return 1.0 if untouched(self.left) else 0.0

    @cached_property
    def before(self) -> float:
        """The node's fragmentation as it is: the same for every placement tried on it."""
        return self.meter.frag(self.model, self.cpu_left, tuple(sorted(self.left, reverse=True)), self.mem_left)

    def growth(self, left_after: Sequence[int], units: int) -> float:
        """How much `units` units of the request, leaving the GPUs at `left_after`, grow the node's fragmentation."""
        cpu_after = self.cpu_left - round(units * self.unit_cpus * 1000)
        mem_after = self.mem_left - units * self.unit_memory_mb
        return self.meter.frag(self.model, cpu_after, tuple(sorted(left_after, reverse=True)), mem_after) - self.before

    def score(self, left_after: Sequence[int], units: int) -> float:
        """The FGD score of placing `units` units, leaving the GPUs at `left_after` (whole points, higher is better),
        as a sort key."""
        return -float(gradient_score(-self.growth(left_after, units)))


class FgdFitter(Fitter):
    """What the FGD fitters share: the workload mix's meter, and leaf fill only for a mix with multi-rank gangs."""

    def __init__(self, snap: Holdings, req: GangRequest, seed: int, meter: FragMeter) -> None:
        super().__init__(snap, req, seed)
        self.meter = meter
        # Leaf fill keeps leaves whole for gangs of several ranks; with none in the mix it only overrides FGD's
        # order (openb: 0.7 points fewer GPUs placed; docs/placement.md).
        self.packs_leaves = meter.multi_rank

    def meter_inputs(self, i: int) -> tuple[object, ...]:
        """What this fitter's meter reads of node `i` beyond its GPUs (`fgd_inputs`)."""
        return fgd_inputs(self.snap, i, memory=self.meter.memory is not None)


class FgdWholeGpuFitter(FgdFitter, WholeGpuFitter):
    """FGD for whole GPUs: among the board kinds at par for the gang, the node with the best FGD score (its expected
    fragmentation for the workload mix grows least, in whole points; Weng et al., ATC '23); among equal scores a node
    already in use before an untouched one, so untouched nodes stay whole for the gangs that need them; then the best
    ring, then the fixed node order (no best fit: on openb a tightest-fit tie-break placed fewer GPUs)."""

    def class_key(self, i: int) -> tuple[object, ...]:
        snap = self.snap
        return (*super().class_key(i), snap.shares[i], snap.blocked[i], *self.meter_inputs(i))

    def fit_part(self, i: int, units: int) -> tuple[float, ...]:
        state = FgdState(self, self.meter, i)
        n = units * self.req.unit_gpus
        left_after = after(tuple(sorted(state.left, reverse=True)), WorkloadShape(0, FULL_SHARE, n))[0]
        ideal, _ = self.layout.slots[i].shape.fit(self.snap.free[i], n, self.req.group)
        return (*self.board_key(i, units), state.score(left_after, units), state.untouched, ideal)


class FgdShareFitter(FgdFitter, ShareFitter):
    """FGD for GPU shares: the node with the best FGD score, an untouched node last among equals, then the fixed node
    order; on the node, each share on the GPU with the best score (the lowest position among equals)."""

    def class_key(self, i: int) -> tuple[object, ...]:
        return (*super().class_key(i), *self.meter_inputs(i))

    def gpu_order(self, left: int, p: int) -> tuple[int, ...]:
        """Among GPUs of equal score: the lowest position (`left`, the milli-GPUs free on it, is for variants that
        order by fill; bench/fgd_variants.py)."""
        return (p,)

    def _positions(self, i: int, units: int) -> tuple[list[int], float, FgdState]:
        """The GPU position of each of `units` shares, each where the score (from the node as it was) is best then;
        the score of the whole placement as a sort key; and the node's state before it."""
        state = FgdState(self, self.meter, i)
        left, milli = list(state.left), self.req.milli
        mem = [self.memory_room(i, p) for p in range(len(left))]
        chosen: list[int] = []
        for _ in range(units * self.req.ranks_per_unit):
            best: tuple[tuple[float, ...], int] | None = None
            for p, x in enumerate(left):
                if x < milli or mem[p] == 0:
                    continue
                trial = list(left)
                trial[p] -= milli
                key = (state.score(trial, len(chosen) + 1), *self.gpu_order(x, p))
                if best is None or key < best[0]:
                    best = (key, p)
            if best is None:
                break
            chosen.append(best[1])
            left[best[1]] -= milli
            room = mem[best[1]]
            if room is not None:
                mem[best[1]] = room - 1
        return chosen, state.score(left, len(chosen)), state

    def fit_part(self, i: int, units: int) -> tuple[float, ...]:
        _, score, state = self._positions(i, units)
        return (score, state.untouched)

    def pick(self, i: int, units: int, rails: frozenset[int] | None) -> list[RankPick]:
        positions, _, _ = self._positions(i, units)
        return [RankPick(i, 1 << p, self.req.milli) for p in positions]


def fitter_for(snap: Holdings, req: GangRequest, seed: int = 0, fgd: FragMeter | None = None) -> Fitter:
    """Best fit, or FGD for the workload mix `fgd` measures fragmentation by (of `req` as this cluster places it)."""
    req = adapt(snap.layout, req)
    if fgd is not None:
        return FgdShareFitter(snap, req, seed, fgd) if req.shared else FgdWholeGpuFitter(snap, req, seed, fgd)
    return ShareFitter(snap, req, seed) if req.shared else WholeGpuFitter(snap, req, seed)
