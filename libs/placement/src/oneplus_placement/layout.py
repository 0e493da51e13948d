"""The static side of a cluster: nodes in index order with their board shape, leaf, spine and fabric rates."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from oneplus_contracts import NodeTopology
from oneplus_contracts.features import FeatureConstraint, node_features

from .shape import NodeShape, shape_of


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
    # Per-request facts that depend only on the layout (which nodes could ever host a unit), memoised.
    cache: dict[object, object] = field(default_factory=dict, repr=False)

    @classmethod
    def build(
        cls, name: str, nodes: Sequence[NodeTopology], nic_gbps_per_gpu: float, oversubscription: float
    ) -> Layout:
        if not nodes:
            raise ValueError(f"cluster {name!r} has no nodes")
        leaf_ix: dict[str, int] = {}
        spine_ix: dict[str, int] = {}
        leaf_spine: list[int] = []
        leaf_nodes: list[list[int]] = []
        spine_leaves: list[list[int]] = []
        slots: list[NodeSlot] = []
        by_name: dict[str, int] = {}
        for i, topo in enumerate(nodes):
            if topo.node in by_name:
                raise ValueError(f"cluster {name!r}: node {topo.node!r} appears twice")
            by_name[topo.node] = i
            spine = topo.spine or "spine-0"
            leaf = topo.leaf or f"leaf-{topo.node}"
            if spine not in spine_ix:
                spine_ix[spine] = len(spine_ix)
                spine_leaves.append([])
            if leaf not in leaf_ix:
                leaf_ix[leaf] = len(leaf_ix)
                leaf_nodes.append([])
                leaf_spine.append(spine_ix[spine])
                spine_leaves[spine_ix[spine]].append(leaf_ix[leaf])
            leaf_nodes[leaf_ix[leaf]].append(i)
            slots.append(
                NodeSlot(
                    index=i,
                    name=topo.node,
                    shape=shape_of(topo),
                    leaf=leaf_ix[leaf],
                    spine=leaf_spine[leaf_ix[leaf]],
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
            leaf_names=tuple(leaf_ix),
            spine_names=tuple(spine_ix),
            leaf_nodes=tuple(map(tuple, leaf_nodes)),
            spine_leaves=tuple(map(tuple, spine_leaves)),
            leaf_spine=tuple(leaf_spine),
            nic_gbps_per_gpu=float(nic_gbps_per_gpu),
            oversubscription=max(1.0, float(oversubscription)),
            by_name=by_name,
        )

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
