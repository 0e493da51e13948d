"""The static side of a cluster: nodes in index order with their board shape, leaf, spine and fabric rates."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from oneplus_contracts import NodeTopology
from oneplus_contracts.features import FeatureConstraint, node_features

from .shape import NodeShape, shape_of
from .tree import Level, build_levels


class AllocationConflict(ValueError):
    """An allocation would over-allocate a GPU, mix a share with a whole-GPU hold, or name an unknown GPU."""


class FabricLike(Protocol):
    @property
    def nic_gbps_per_gpu(self) -> float: ...

    @property
    def oversubscription(self) -> float: ...


class ClusterLike(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def fabric(self) -> FabricLike: ...

    @property
    def nodes(self) -> Sequence[NodeTopology]: ...


@dataclass(frozen=True, eq=False)
class NodeSlot:
    """The static facts of one node."""

    index: int
    name: str
    shape: NodeShape
    leaf: int
    spine: int
    gpu_model: str
    cpus: float
    memory_mb: int
    nvlink_domain: str | None
    topology: NodeTopology
    features: frozenset[str] = frozenset()  # its own features and its GPU model's, lower case

    def matches_model(self, models: Sequence[str] | None) -> bool:
        if not models:
            return True
        names = [self.gpu_model.lower(), *(g.name.lower() for g in self.topology.gpus)]
        return any(m.lower() in n for m in models for n in names)

    def matches_features(self, constraint: FeatureConstraint | None) -> bool:
        return constraint is None or constraint.allows(self.features)


@dataclass(frozen=True, eq=False)
class Layout:
    """Nodes indexed 0..N-1 with their leaf and spine indexes, and the fabric's rates."""

    name: str
    slots: tuple[NodeSlot, ...]
    leaf_names: tuple[str, ...]
    spine_names: tuple[str, ...]
    leaf_nodes: tuple[tuple[int, ...], ...]
    spine_leaves: tuple[tuple[int, ...], ...]
    leaf_spine: tuple[int, ...]
    nic_gbps_per_gpu: float
    oversubscription: float
    by_name: dict[str, int]
    # The site's levels between the node and the cluster, bottom-up (`nvlink`, `leaf`, `spine`, or the site's own).
    levels: tuple[Level, ...] = ()
    # Per-request facts that depend only on the layout (which nodes could ever host a unit), memoised.
    cache: dict[object, object] = field(default_factory=dict, repr=False)

    @classmethod
    def build(
        cls, name: str, nodes: Sequence[NodeTopology], nic_gbps_per_gpu: float, oversubscription: float
    ) -> Layout:
        if not nodes:
            raise ValueError(f"cluster {name!r} has no nodes")
        levels = build_levels(nodes)
        # Leaf and spine are levels of the tree like any other; the fabric rates and best-fit rules read them by name.
        leaf_level = next(lv for lv in levels if lv.name == "leaf")
        spine_level = next(lv for lv in levels if lv.name == "spine")
        leaf_spine = [spine_level.of_node[m[0]] for m in leaf_level.members]
        spine_leaves: list[list[int]] = [[] for _ in spine_level.members]
        for leaf, spine in enumerate(leaf_spine):
            spine_leaves[spine].append(leaf)
        slots: list[NodeSlot] = []
        by_name: dict[str, int] = {}
        for i, topo in enumerate(nodes):
            if topo.node in by_name:
                raise ValueError(f"cluster {name!r}: node {topo.node!r} appears twice")
            by_name[topo.node] = i
            slots.append(
                NodeSlot(
                    index=i,
                    name=topo.node,
                    shape=shape_of(topo),
                    leaf=leaf_level.of_node[i],
                    spine=spine_level.of_node[i],
                    gpu_model=topo.gpu_model,
                    cpus=float(topo.cpus),
                    memory_mb=topo.memory_mb,
                    nvlink_domain=topo.nvlink_domain,
                    topology=topo,
                    features=node_features(topo.gpu_model, [*topo.features, *(["mps"] if topo.mps else [])]),
                )
            )
        return cls(
            name=name,
            slots=tuple(slots),
            leaf_names=leaf_level.names,
            spine_names=spine_level.names,
            leaf_nodes=leaf_level.members,
            spine_leaves=tuple(map(tuple, spine_leaves)),
            leaf_spine=tuple(leaf_spine),
            nic_gbps_per_gpu=float(nic_gbps_per_gpu),
            oversubscription=max(1.0, float(oversubscription)),
            by_name=by_name,
            levels=levels,
        )

    @property
    def level_names(self) -> tuple[str, ...]:
        """Every level a job may name, tightest first: `node`, the site's levels, `cluster`."""
        return ("node", *(lv.name for lv in self.levels), "cluster")

    def level(self, name: str) -> Level | None:
        return next((lv for lv in self.levels if lv.name == name), None)

    def domain_of_nodes(self, nodes: Sequence[int]) -> str:
        """The tightest level with one domain holding every node of `nodes`."""
        if len(set(nodes)) <= 1:
            return "node"
        for lv in self.levels:
            first = lv.of_node[nodes[0]]
            if all(lv.of_node[i] == first for i in nodes):
                return lv.name
        return "cluster"

    def path(self, i: int) -> tuple[int, ...]:
        """Node `i`'s domains from the top level down, then the node: sorting by it keeps domains together."""
        return (*(lv.of_node[i] for lv in reversed(self.levels)), i)

    def index(self, node: str) -> int:
        try:
            return self.by_name[node]
        except KeyError:
            raise AllocationConflict(f"node {node!r} is not in cluster {self.name!r}") from None


_LAYOUTS: dict[int, tuple[ClusterLike, Layout]] = {}


def layout_of_cluster(cluster: ClusterLike) -> Layout:
    """One layout per cluster object: snapshots of the same cluster share its shapes and indexes."""
    got = _LAYOUTS.get(id(cluster))
    if got is not None and got[0] is cluster:
        return got[1]
    fabric = cluster.fabric
    layout = Layout.build(cluster.name, list(cluster.nodes), fabric.nic_gbps_per_gpu, fabric.oversubscription)
    if len(_LAYOUTS) > 64:
        _LAYOUTS.clear()
    _LAYOUTS[id(cluster)] = (cluster, layout)
    return layout
