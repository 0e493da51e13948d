"""What placement decides on: the cluster's static layout plus what is held on every node right now.

`ClusterState` is the mutable form (the simulator applies and releases thousands of allocations on it);
`ClusterSnapshot` is the frozen view a decision reads. Both share one `Layout`, built once per cluster.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence

from oneplus_contracts import Allocation, NodeRecord

from .layout import AllocationConflict, ClusterLike, Layout, NodeSlot, layout_of_cluster
from .mig import mig_changes
from .shape import bits, popcount

# Names other packages import from here since before the layout moved to its own module.
_layout_of = layout_of_cluster
__all__ = [
    "FULL_SHARE",
    "AllocationConflict",
    "ClusterLike",
    "ClusterSnapshot",
    "ClusterState",
    "Holdings",
    "Layout",
    "NodeSlot",
    "seeded_fill",
]

FULL_SHARE = 1000  # a GPU's share capacity, in thousandths
# Stamps for node changes, unique over every Holdings of the process: two copies show the same stamp on a node only if
# they hold it as it was after that one change (`Holdings.stamps`).
_STAMPS = itertools.count(1)


class Holdings:
    """Per-node arrays of what is held; shared by the mutable state and the frozen snapshot."""

    layout: Layout
    whole: list[int]
    shares: list[tuple[int, ...] | None]
    share_mask: list[int]
    blocked: list[int]
    schedulable: list[bool]
    cpu_used: list[float]
    mem_used: list[int]
    free: list[int]
    free_count: list[int]
    leaf_free: list[int]
    low_free: list[int]  # free GPUs per domain of the lowest site level (the same list as leaf_free when that is leaf)
    mig_held: list[frozenset[str]]  # UUIDs of the MIG instances held on each node
    gpu_mem_used: list[tuple[int, ...] | None]  # MiB of GPU memory pinned by shares, per GPU position (None: none)
    # Per node, the stamp of its last change: what changed between two copies of one lineage (a cycle's working copy
    # and the next cycle's) is where their stamps differ, so capacities counted on one are recounted there only.
    stamps: list[int]

    def _init_empty(self, layout: Layout) -> None:
        n = len(layout.slots)
        self.layout = layout
        self.whole = [0] * n
        self.shares = [None] * n
        self.share_mask = [0] * n
        self.blocked = [_unhealthy_mask(s) for s in layout.slots]
        self.schedulable = [True] * n
        self.cpu_used = [0.0] * n
        self.mem_used = [0] * n
        self.free = [0] * n
        self.free_count = [0] * n
        self.leaf_free = [0] * len(layout.leaf_nodes)
        self._init_low_free()
        self.mig_held = [frozenset()] * n
        self.gpu_mem_used = [None] * n
        self.stamps = [0] * n
        for i in range(n):
            self._refresh(i)

    def _copy_from(self, other: Holdings) -> None:
        self.layout = other.layout
        self.whole = list(other.whole)
        self.shares = list(other.shares)
        self.share_mask = list(other.share_mask)
        self.blocked = list(other.blocked)
        self.schedulable = list(other.schedulable)
        self.cpu_used = list(other.cpu_used)
        self.mem_used = list(other.mem_used)
        self.free = list(other.free)
        self.free_count = list(other.free_count)
        self.leaf_free = list(other.leaf_free)
        if other.low_free is other.leaf_free:
            self.low_free = self.leaf_free
        else:
            self.low_free = list(other.low_free)
        self.mig_held = list(other.mig_held)
        self.gpu_mem_used = list(other.gpu_mem_used)
        self.stamps = list(other.stamps)

    def _refresh(self, i: int) -> None:
        slot = self.layout.slots[i]
        held = self.whole[i] | self.share_mask[i] | self.blocked[i]
        f = slot.shape.full & ~held if self.schedulable[i] else 0
        self.free[i] = f
        count = popcount(f)
        self.leaf_free[slot.leaf] += count - self.free_count[i]
        if self.low_free is not self.leaf_free:
            self.low_free[self._low_of[i]] += count - self.free_count[i]
        self.free_count[i] = count
        self.stamps[i] = next(_STAMPS)  # every change to a node ends here

    def _init_low_free(self) -> None:
        lowest = self.layout.levels[0] if self.layout.levels else None
        if lowest is None or lowest.name == "leaf":
            self.low_free = self.leaf_free
        else:
            self.low_free = [0] * len(lowest.members)

    @property
    def _low_of(self) -> tuple[int, ...]:
        return self.layout.levels[0].of_node

    def mutable_copy(self) -> ClusterState:
        """A `ClusterState` holding the same as this one, to try changes on."""
        state = ClusterState.__new__(ClusterState)
        state._copy_from(self)
        return state

    # --- read-only views ---------------------------------------------------------------------------------------

    @property
    def slots(self) -> tuple[NodeSlot, ...]:
        return self.layout.slots

    def cpu_free(self, i: int) -> float:
        return self.layout.slots[i].cpus - self.cpu_used[i]

    def mem_free(self, i: int) -> int:
        return self.layout.slots[i].memory_mb - self.mem_used[i]

    def gpu_memory_left(self, i: int, pos: int) -> int | None:
        """MiB of GPU memory left for shares on node i's GPU at `pos`; None when the topology gives no GPU memory."""
        total = gpu_memory_total(self.layout.slots[i], pos)
        if total is None:
            return None
        used = self.gpu_mem_used[i]
        return total - (used[pos] if used is not None else 0)

    def share_used(self, i: int, pos: int) -> int:
        s = self.shares[i]
        return 0 if s is None else s[pos]

    def idle(self, i: int) -> bool:
        """Nothing at all held on the node and every healthy GPU free."""
        return (
            self.schedulable[i]
            and self.whole[i] == 0
            and self.share_mask[i] == 0
            and self.cpu_used[i] <= 0
            and self.mem_used[i] <= 0
        )

    def total_free_gpus(self) -> int:
        return sum(self.free_count)

    def total_gpus(self) -> int:
        return sum(s.shape.n for s in self.layout.slots)

    def usable_gpus(self) -> int:
        """GPUs that could hold work: on schedulable nodes and healthy."""
        return sum(
            popcount(s.shape.full & ~self.blocked[s.index]) for s in self.layout.slots if self.schedulable[s.index]
        )


class ClusterState(Holdings):
    """Mutable holdings: apply and release allocations, cordon nodes, mark GPUs unhealthy."""

    def __init__(self, layout: Layout) -> None:
        self._init_empty(layout)

    @classmethod
    def from_cluster(cls, cluster: ClusterLike) -> ClusterState:
        return cls(layout_of_cluster(cluster))

    def snapshot(self) -> ClusterSnapshot:
        snap = ClusterSnapshot.__new__(ClusterSnapshot)
        snap._copy_from(self)
        return snap

    def set_schedulable(self, node: str, schedulable: bool) -> None:
        i = self.layout.index(node)
        self.schedulable[i] = schedulable
        self._refresh(i)

    def set_unhealthy(self, node: str, gpus: Iterable[int]) -> None:
        i = self.layout.index(node)
        self.blocked[i] = self.layout.slots[i].shape.mask_of(list(gpus)) | _mig_mask(self.layout.slots[i])
        self._refresh(i)

    def block(self, node: str, gpus: Iterable[int]) -> None:
        """Offer none of `gpus` (on top of the unhealthy ones): ranks the node still reports run there."""
        i = self.layout.by_name.get(node)
        if i is None:
            return
        shape = self.layout.slots[i].shape
        self.blocked[i] |= shape.mask_of([g for g in gpus if g in shape.indexes])
        self._refresh(i)

    def apply(self, alloc: Allocation) -> None:
        """Take every GPU share, CPU and byte of memory of `alloc`, or raise and take nothing."""
        plan = self._plan(alloc, sign=1)
        gpu_memory = self._gpu_memory_plan(alloc, sign=1)
        for i, uuids in mig_changes(self, alloc, sign=1).items():
            self.mig_held[i] = self.mig_held[i] | uuids
        for i, gmem in gpu_memory.items():
            self.gpu_mem_used[i] = gmem if any(gmem) else None
        for i, (whole, shares, cpus, mem) in plan.items():
            self.whole[i] |= whole
            self._set_shares(i, shares)
            self.cpu_used[i] += cpus
            self.mem_used[i] += mem
            self._refresh(i)

    def fits(self, alloc: Allocation) -> bool:
        """Whether `apply(alloc)` would succeed now (nothing is taken)."""
        try:
            self._plan(alloc, sign=1)
            self._gpu_memory_plan(alloc, sign=1)
            mig_changes(self, alloc, sign=1)
        except AllocationConflict:
            return False
        return True

    def release(self, alloc: Allocation) -> None:
        """Give back what `alloc` holds; raise if it does not hold it."""
        plan = self._plan(alloc, sign=-1)
        gpu_memory = self._gpu_memory_plan(alloc, sign=-1)
        for i, uuids in mig_changes(self, alloc, sign=-1).items():
            self.mig_held[i] = self.mig_held[i] - uuids
        for i, gmem in gpu_memory.items():
            self.gpu_mem_used[i] = gmem if any(gmem) else None
        for i, (whole, shares, cpus, mem) in plan.items():
            self.whole[i] &= ~whole
            self._set_shares(i, shares)
            self.cpu_used[i] = max(0.0, self.cpu_used[i] - cpus)
            self.mem_used[i] = max(0, self.mem_used[i] - mem)
            self._refresh(i)

    def _gpu_memory_plan(self, alloc: Allocation, sign: int) -> dict[int, tuple[int, ...]]:
        """Per node, the GPU memory shares pin once `alloc` is taken (1) or given back (-1); raises when a GPU whose
        memory the topology gives would hold more than it has. Checked before anything changes."""
        out: dict[int, list[int]] = {}
        for r in alloc.ranks:
            if not (r.gpu_milli and r.gpu_memory_mb):
                continue
            i = self.layout.index(r.node)
            shape = self.layout.slots[i].shape
            cur = out.setdefault(i, list(self.gpu_mem_used[i] or (0,) * shape.n))
            for p in bits(shape.mask_of(r.gpus)):
                cur[p] += sign * r.gpu_memory_mb
        for i, cur in out.items():
            slot = self.layout.slots[i]
            for p, used in enumerate(cur):
                total = gpu_memory_total(slot, p)
                if sign > 0 and total is not None and used > total:
                    raise AllocationConflict(
                        f"GPU {slot.shape.indexes[p]} on {slot.name}: shares would pin {used} MiB of its {total} MiB"
                    )
                if sign < 0 and used < 0:
                    raise AllocationConflict(f"{slot.name}: releasing GPU memory that no share pins")
        return {i: tuple(cur) for i, cur in out.items()}

    def _set_shares(self, i: int, shares: tuple[int, ...] | None) -> None:
        if shares is None:
            return
        if any(shares):
            self.shares[i] = shares
            self.share_mask[i] = sum(1 << p for p, v in enumerate(shares) if v)
        else:
            self.shares[i] = None
            self.share_mask[i] = 0

    def _plan(self, alloc: Allocation, sign: int) -> dict[int, tuple[int, tuple[int, ...] | None, float, int]]:
        """Check the whole allocation first so that a failure changes nothing."""
        whole: dict[int, int] = {}
        shares: dict[int, list[int]] = {}
        cpus: dict[int, float] = {}
        mem: dict[int, int] = {}
        for r in alloc.ranks:
            i = self.layout.index(r.node)
            slot = self.layout.slots[i]
            mask = slot.shape.mask_of(r.gpus)
            if popcount(mask) != len(r.gpus):
                raise AllocationConflict(f"rank {r.rank} names a GPU twice on {r.node}: {r.gpus}")
            cpus[i] = cpus.get(i, 0.0) + r.cpus
            mem[i] = mem.get(i, 0) + r.memory_mb
            if r.gpu_milli:
                cur = shares.setdefault(i, list(self.shares[i] or (0,) * slot.shape.n))
                for p in bits(mask):
                    cur[p] += sign * r.gpu_milli
                continue
            if whole.get(i, 0) & mask:
                raise AllocationConflict(f"rank {r.rank} takes GPUs {r.gpus} on {r.node} that another rank takes")
            whole[i] = whole.get(i, 0) | mask
        plan: dict[int, tuple[int, tuple[int, ...] | None, float, int]] = {}
        for i in set(whole) | set(shares) | set(cpus):
            self._check_node(i, whole.get(i, 0), shares.get(i), cpus.get(i, 0.0), mem.get(i, 0), sign)
            share_t = tuple(shares[i]) if i in shares else None
            plan[i] = (whole.get(i, 0), share_t, cpus.get(i, 0.0), mem.get(i, 0))
        return plan

    def _check_node(self, i: int, whole: int, shares: list[int] | None, cpus: float, mem: int, sign: int) -> None:
        slot = self.layout.slots[i]
        name = slot.name
        if sign > 0:
            taken = whole & (self.whole[i] | self.share_mask[i])
            if taken:
                raise AllocationConflict(f"GPUs {slot.shape.gpu_indexes(taken)} on {name} are already held")
            if shares is not None:
                over = [slot.shape.indexes[p] for p, v in enumerate(shares) if v > FULL_SHARE]
                if over:
                    raise AllocationConflict(f"GPU shares on {name} GPUs {over} would exceed one whole GPU")
                mixed = self.whole[i] & sum(1 << p for p, v in enumerate(shares) if v)
                if mixed:
                    raise AllocationConflict(
                        f"GPUs {slot.shape.gpu_indexes(mixed)} on {name} are held whole; a share cannot join them"
                    )
            if self.cpu_used[i] + cpus > slot.cpus + 1e-9:
                raise AllocationConflict(f"{name}: {cpus:g} CPUs asked, {slot.cpus - self.cpu_used[i]:g} free")
            if self.mem_used[i] + mem > slot.memory_mb:
                raise AllocationConflict(f"{name}: {mem} MB asked, {slot.memory_mb - self.mem_used[i]} MB free")
        else:
            missing = whole & ~self.whole[i]
            if missing:
                raise AllocationConflict(f"GPUs {slot.shape.gpu_indexes(missing)} on {name} are not held")
            if shares is not None and any(v < 0 for v in shares):
                raise AllocationConflict(f"{name}: releasing a GPU share that is not held")


class ClusterSnapshot(Holdings):
    """A frozen view of the holdings; decisions read it and never change it."""

    def __init__(self, layout: Layout) -> None:
        self._init_empty(layout)

    @classmethod
    def from_cluster(cls, cluster: ClusterLike) -> ClusterSnapshot:
        """Every GPU free, every node schedulable (unhealthy GPUs of the topology excepted)."""
        return cls(layout_of_cluster(cluster))

    @classmethod
    def from_records(
        cls, name: str, records: Sequence[NodeRecord], nic_gbps_per_gpu: float = 400.0, oversubscription: float = 1.0
    ) -> ClusterSnapshot:
        """From the topology registry's records: cordoned, draining, lost nodes and unhealthy GPUs are not free."""
        state = ClusterState(Layout.build(name, [r.topology for r in records], nic_gbps_per_gpu, oversubscription))
        for r in records:
            state.set_schedulable(r.topology.node, r.schedulable)
            if r.unhealthy_gpus:
                state.set_unhealthy(r.topology.node, r.unhealthy_gpus)
        return state.snapshot()

    def thaw(self) -> ClusterState:
        return self.mutable_copy()

    def with_allocation(self, alloc: Allocation) -> ClusterSnapshot:
        state = self.thaw()
        state.apply(alloc)
        return state.snapshot()

    def without_allocation(self, alloc: Allocation) -> ClusterSnapshot:
        state = self.thaw()
        state.release(alloc)
        return state.snapshot()


def gpu_memory_total(slot: NodeSlot, pos: int) -> int | None:
    """MiB of memory of the node's GPU at shape position `pos`, as discovered (None when the topology does not say)."""
    index = slot.shape.indexes[pos]
    return next((g.memory_mb for g in slot.topology.gpus if g.index == index), None)


def _unhealthy_mask(slot: NodeSlot) -> int:
    bad = [g.index for g in slot.topology.gpus if not g.healthy]
    return (slot.shape.mask_of(bad) if bad else 0) | _mig_mask(slot)


def _mig_mask(slot: NodeSlot) -> int:
    """GPUs split into MIG instances: never offered whole or as shares (their instances are, `mig.py`)."""
    split = [g.index for g in slot.topology.gpus if g.mig_instances]
    return slot.shape.mask_of(split) if split else 0


def seeded_fill(snapshot: ClusterSnapshot, seed: int, pct: float) -> ClusterSnapshot:
    """See `oneplus_placement.fill.seeded_fill` (kept here, where callers first found it)."""
    from .fill import seeded_fill as fill

    return fill(snapshot, seed, pct)
