"""The queueing view of placement's cluster state: free GPUs per domain, trial placements, holds.

Every call into `oneplus_placement` goes through here, so the policy modules speak of domains and victims only.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from oneplus_contracts import Allocation, Domain, JobSpec, RankPlacement
from oneplus_placement.capacity import CapacityIndexes
from oneplus_placement.diagnosis import Explanation, static_reason
from oneplus_placement.fgd import FragMeter, WorkloadShape, memory_asks, typical_shapes
from oneplus_placement.fitters import adapt, static_eligible
from oneplus_placement.greedy import PlacementResult, place_gang
from oneplus_placement.request import GangRequest, InvalidRequest
from oneplus_placement.snapshot import FULL_SHARE, ClusterSnapshot, ClusterState, Layout

from .config import QueueConfig
from .model import CycleStats

DomainKey = tuple[Domain, int]  # ("node", node index) / ("leaf", leaf index) / ("spine", …) / ("cluster", 0)


def workload_meter(specs: Iterable[JobSpec]) -> FragMeter:
    """FGD's workload mix from the jobs a cycle sees (pending and running): one rank's shape per job, the shapes
    that cover 95% of them (the paper's typical pods), the memory each shape's jobs ask a rank, and whether any job
    is a gang of several ranks. GPU models are not part of a shape here."""
    asks: list[tuple[WorkloadShape, int]] = []
    multi_rank = False
    for spec in specs:
        res = spec.resources
        whole = res.whole_gpus
        milli = res.gpu_milli or (FULL_SHARE if whole else 0)
        asks.append((WorkloadShape(int(res.cpus * 1000), milli, whole or (1 if milli else 0)), res.memory_mb))
        multi_rank = multi_rank or spec.ranks > 1
    typical = typical_shapes(shape for shape, _ in asks)
    return FragMeter(typical, multi_rank=multi_rank, memory=memory_asks(typical, asks))


def working_copy(state: ClusterState | ClusterSnapshot) -> ClusterState:
    """A private mutable copy: a cycle never changes the caller's state."""
    if isinstance(state, ClusterSnapshot):
        return state.thaw()
    return state.snapshot().thaw()


@dataclass
class Capacity:
    """A mutable working state plus the counters a cycle reports."""

    state: ClusterState
    stats: CycleStats
    version: int = 0  # bumped on every change, so a failed trial can be remembered until something moves
    keep_strong_boards: bool = True  # the queue config's boards.keep_strong_boards
    fgd: FragMeter | None = None  # the workload mix FGD measures fragmentation by
    fgd_queues: frozenset[str] = frozenset()  # queues whose `placement` is `fgd`
    mixing_queues: frozenset[str] = frozenset()  # queues whose gangs may span GPU models (`mix_gpu_models`)
    timeslice_queues: frozenset[str] = frozenset()  # queues whose GPU shares may run unisolated (`sharing: time-slice`)
    # Per-node capacities kept current across this state's trials: every change to `state` goes through here. The
    # live solver hands in the same indexes every cycle, recounted where the nodes changed since (`CapacityIndexes`).
    indexes: CapacityIndexes = field(default_factory=CapacityIndexes, repr=False)

    @property
    def layout(self) -> Layout:
        return self.state.layout

    def place(self, spec: JobSpec, job_id: str, seed: int) -> PlacementResult:
        self.stats.placement_calls += 1
        fgd = self.fgd if spec.queue in self.fgd_queues else None
        # Reads only: no snapshot copy needed.
        return place_gang(
            self.state,
            spec,
            job_id=job_id,
            seed=seed,
            keep_strong_boards=self.keep_strong_boards,
            fgd=fgd,
            indexes=self.indexes,
            mix_gpu_models=spec.queue in self.mixing_queues,
            shares_need_mps=spec.queue not in self.timeslice_queues,
        )

    @classmethod
    def for_config(
        cls,
        state: ClusterState,
        stats: CycleStats,
        config: QueueConfig,
        jobs: Iterable[JobSpec],
        indexes: CapacityIndexes | None = None,
    ) -> Capacity:
        """A working state placed as `config` says: board rules, and FGD for its `fgd` queues, measured on the mix
        of `jobs` (the ones the cycle sees)."""
        fgd_queues = frozenset(q.name for q in config.queues if q.placement == "fgd")
        return cls(
            state,
            stats,
            keep_strong_boards=config.boards.keep_strong_boards,
            fgd=workload_meter(jobs) if fgd_queues else None,
            fgd_queues=fgd_queues,
            mixing_queues=config.mixing_queues,
            timeslice_queues=config.timeslice_queues,
            indexes=indexes if indexes is not None else CapacityIndexes(),
        )

    def derived(self, state: ClusterState) -> Capacity:
        """Another working state placed by the same policies (backfill's and the victim search's trial states)."""
        return Capacity(state, self.stats, keep_strong_boards=self.keep_strong_boards, fgd=self.fgd,
                        fgd_queues=self.fgd_queues, mixing_queues=self.mixing_queues,
                        timeslice_queues=self.timeslice_queues)  # fmt: skip

    def static_reason(self, spec: JobSpec) -> Explanation | None:
        """Why no node of the cluster could ever host the job (its model, size or features), or None."""
        try:
            req = GangRequest.of(spec)
        except InvalidRequest:
            return None
        return static_reason(self.state, req)

    def apply(self, alloc: Allocation) -> None:
        self.state.apply(alloc)
        self._touched(alloc)
        self.version += 1

    def release(self, alloc: Allocation) -> None:
        self.state.release(alloc)
        self._touched(alloc)
        self.version += 1

    def _touched(self, alloc: Allocation) -> None:
        self.indexes.touched((self.layout.index(n) for n in alloc.nodes), self.state)

    @contextmanager
    def released(self, allocs: Sequence[Allocation]) -> Iterator[None]:
        """Trial: the allocations are given back inside the block and taken again after it."""
        done: list[Allocation] = []
        try:
            for a in allocs:
                self.state.release(a)
                self._touched(a)
                done.append(a)
            yield
        finally:
            for a in reversed(done):
                self.state.apply(a)
                self._touched(a)

    # -- counting -------------------------------------------------------------------------------------------------

    def free_gpus(self) -> int:
        return self.state.total_free_gpus()

    def free_gpus_for(self, spec: JobSpec) -> int:
        """Free whole GPUs on the nodes the job may use (GPU models, --constraint, --nodelist/--exclude), not every
        kind's."""
        if not spec.resources.gpu_models and not spec.constraint and not spec.nodelist and not spec.exclude_nodes:
            return self.free_gpus()
        try:
            req = GangRequest.of(spec)
        except InvalidRequest:
            return self.free_gpus()
        # As the cluster places it: a TP group over NVL72 trays is eligible tray by tray (`fitters.adapt`).
        eligible = static_eligible(self.layout, adapt(self.layout, req))
        free = self.state.free_count
        return sum(free[i] for i in range(len(free)) if eligible[i])

    def node_index(self, node: str) -> int:
        return self.layout.index(node)

    def domain_nodes(self, key: DomainKey) -> Sequence[int]:
        level, ix = key
        lay = self.layout
        if level == "node":
            return (ix,)
        if level == "leaf":
            return lay.leaf_nodes[ix]
        if level == "spine":
            return [n for leaf in lay.spine_leaves[ix] for n in lay.leaf_nodes[leaf]]
        site = lay.level(level)
        if site is not None:  # a level of the site's own (nvlink, rack, zone, ...)
            return site.members[ix]
        return range(len(lay.slots))

    def domain_of_node(self, level: Domain, node_ix: int) -> DomainKey:
        slot = self.layout.slots[node_ix]
        if level == "node":
            return ("node", node_ix)
        if level == "leaf":
            return ("leaf", slot.leaf)
        if level == "spine":
            return ("spine", slot.spine)
        site = self.layout.level(level)
        if site is not None:
            return (level, site.of_node[node_ix])
        return ("cluster", 0)

    def free_in(self, key: DomainKey) -> int:
        fc = self.state.free_count
        return sum(fc[i] for i in self.domain_nodes(key))

    def domain_name(self, key: DomainKey) -> str:
        level, ix = key
        lay = self.layout
        if level == "node":
            return lay.slots[ix].name
        if level == "leaf":
            return lay.leaf_names[ix]
        if level == "spine":
            return lay.spine_names[ix]
        site = lay.level(level)
        if site is not None:
            return site.names[ix]
        return "cluster"

    def alloc_domain(self, alloc: Allocation) -> tuple[Domain, str]:
        """The tightest domain holding every rank of `alloc`, and its name."""
        ixs = {self.node_index(n) for n in alloc.nodes}
        for level in self.layout.level_names[:-1]:  # node, the site's levels bottom-up (nvlink, leaf, spine, ...)
            keys = {self.domain_of_node(level, i) for i in ixs}
            if len(keys) == 1:
                key = keys.pop()
                return key[0], self.domain_name(key)
        return "cluster", "cluster"

    # -- holds ----------------------------------------------------------------------------------------------------

    def free_part(self, alloc: Allocation, job_id: str) -> Allocation | None:
        """The whole GPUs of `alloc` that are free right now, as an allocation that holds only GPUs.

        Holding them keeps a reservation's (or a nomination's) GPUs from being handed to anyone else this cycle.
        """
        ranks: list[RankPlacement] = []
        for r in alloc.ranks:
            if r.gpu_milli:
                continue  # a share is not worth holding a whole GPU for
            i = self.node_index(r.node)
            shape = self.layout.slots[i].shape
            gpus = shape.gpu_indexes(self.state.free[i] & shape.mask_of(r.gpus))
            if gpus:
                ranks.append(RankPlacement(rank=len(ranks), node=r.node, gpus=gpus, cpus=0.0, memory_mb=0))
        if not ranks:
            return None
        return Allocation(ranks=ranks, domain=alloc.domain, solver=f"hold:{job_id}")


def whole_gpus(spec: JobSpec) -> int:
    """Whole GPUs a gang needs; 0 for GPU shares and MIG instances (counting whole GPUs cannot rule those out)."""
    if spec.components is not None:
        return sum(whole_gpus(part) for part in spec.component_specs())
    return 0 if spec.resources.mig is not None else spec.ranks * spec.resources.whole_gpus


def gpus_by_node(capacity: Capacity, alloc: Allocation) -> dict[int, int]:
    out: dict[int, int] = {}
    for r in alloc.ranks:
        i = capacity.node_index(r.node)
        out[i] = out.get(i, 0) + len(r.gpus)
    return out
