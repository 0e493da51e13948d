"""A cluster: nodes (each a `NodeTopology`) placed under leaf switches and spines, from a YAML file or synthetic.

Nodes of one group share the parsed topology object (copied with `model_copy(update=...)`), so building thousands
of nodes is cheap; treat a node's `gpus` and `links` as read-only and change a node through copies
(`analysis.degrade`, `analysis.apply_health`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import yaml
from oneplus_contracts import LEVEL_NAME, NodeTopology
from oneplus_contracts.features import model_feature
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .bandwidth import nic_gbytes, nic_ring_gbps
from .errors import ClusterConfigError, TopologyParseError
from .fabric import HOSTNAME_LABEL, leaf_from_lldp, nvlink_domain_of, place_from_labels
from .presets import PRESETS, shared_preset
from .smi import parse_topo_matrix

_NAME = r"^[a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Fabric(_Strict):
    """The network above the nodes. `nic_gbps_per_gpu` is in Gb/s as fabrics are quoted: 400 means 50 GB/s."""

    nodes_per_leaf: Annotated[int, Field(gt=0)] = 8
    leaves_per_spine: Annotated[int, Field(gt=0)] = 4
    nic_gbps_per_gpu: Annotated[float, Field(gt=0, description="Gb/s of NIC per GPU")] = 400.0
    oversubscription: Annotated[float, Field(ge=1.0, description="Leaf downlink : uplink ratio")] = 1.0
    label_levels: list[str] | None = Field(
        default=None,
        description="Kueue Topology levels, top to bottom, in node labels: the lowest names the leaf, the next the "
        "spine, any above them are levels of their own (named by the label's last word: .../topology-zone is zone)",
    )
    levels: list[Annotated[str, Field(pattern=LEVEL_NAME)]] | None = Field(
        default=None,
        description="The site's levels above the node, bottom-up (e.g. nvlink, rack, leaf, spine, zone)",
    )
    level_labels: dict[str, str] = Field(
        default_factory=dict,
        description="The node label that names each level's domain, e.g. {zone: topology.kubernetes.io/zone}",
    )

    @model_validator(mode="after")
    def _levels_known(self) -> Fabric:
        if self.levels is not None:
            bad = [n for n in self.levels if n in ("node", "cluster")]
            if bad:
                raise ValueError(f"levels: {bad[0]!r} is implicit (node below, cluster above); name the levels between")
            if len(set(self.levels)) != len(self.levels):
                raise ValueError(f"levels: {self.levels} names a level twice")
        named = set(self.levels or ())
        unknown = sorted(set(self.level_labels) - named)
        if unknown:
            raise ValueError(f"level_labels: {unknown[0]!r} is not one of levels {sorted(named)}")
        return self

    @property
    def nic_gbytes_per_gpu(self) -> float:
        return nic_gbytes(self.nic_gbps_per_gpu)

    def ring_gbps(self, crosses_spine: bool) -> float:
        """GB/s per GPU of a ring hop between two nodes; leaving the leaf pays the oversubscription."""
        return nic_ring_gbps(self.nic_gbps_per_gpu, self.oversubscription if crosses_spine else 1.0)


class NodeGroup(_Strict):
    prefix: Annotated[str, Field(pattern=_NAME)]
    count: Annotated[int, Field(gt=0, le=100_000)]
    topology: str = Field(description="A preset name or a topo -m file, relative to the YAML file")
    start: Annotated[int, Field(ge=0)] = 0
    cpus: Annotated[int, Field(gt=0)] | None = None
    memory_mb: Annotated[int, Field(gt=0)] | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    features: list[str] = Field(default_factory=list, description="Node features for --constraint (Slurm's)")
    nodes_per_nvlink_domain: Annotated[int, Field(gt=0)] | None = Field(
        default=None, description="Nodes per multi-node NVLink domain, e.g. 18 GB200 trays per NVL72"
    )
    nodes_per_level: dict[str, Annotated[int, Field(gt=0)]] = Field(
        default_factory=dict, description="Nodes per domain of a site level, e.g. {rack: 18}: <prefix>-<level><k>"
    )
    levels: dict[str, str] = Field(default_factory=dict, description="The group's domain at a site level")


class NodeOverride(_Strict):
    labels: dict[str, str] = Field(default_factory=dict)
    features: list[str] = Field(default_factory=list, description="Added to its group's features")
    lldp: str | dict[str, Any] | None = Field(default=None, description="lldpctl -f json output, inline or a file")
    leaf: str | None = None
    spine: str | None = None
    nvlink_domain: str | None = None
    levels: dict[str, str] = Field(default_factory=dict, description="The node's domain at a site level")


class ClusterFile(_Strict):
    name: Annotated[str, Field(min_length=1)]
    fabric: Fabric = Field(default_factory=Fabric)
    node_groups: Annotated[list[NodeGroup], Field(min_length=1)]
    nodes: dict[str, NodeOverride] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _levels_named(self) -> ClusterFile:
        named = set(self.fabric.levels or ())
        where = [(f"node_groups.{k}", set(g.levels) | set(g.nodes_per_level)) for k, g in enumerate(self.node_groups)]
        where += [(f"nodes.{n}", set(o.levels)) for n, o in self.nodes.items()]
        for key, levels in where:
            unknown = sorted(levels - named - {"nvlink", "leaf", "spine"})
            if unknown:
                raise ValueError(f"{key}: level {unknown[0]!r} is not one of fabric.levels {sorted(named)}")
        return self


@dataclass
class Cluster:
    name: str
    fabric: Fabric
    nodes: list[NodeTopology]
    _by_name: dict[str, NodeTopology] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._by_name = {}
        for n in self.nodes:
            if n.node in self._by_name:
                raise ValueError(f"node {n.node!r} appears twice in cluster {self.name!r}")
            self._by_name[n.node] = n

    def node(self, name: str) -> NodeTopology:
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"no node {name!r} in cluster {self.name!r}") from None

    def leaf_of(self, node: str) -> str | None:
        return self.node(node).leaf

    def spine_of(self, node: str) -> str | None:
        return self.node(node).spine

    def nodes_by_leaf(self) -> dict[str, list[NodeTopology]]:
        """Nodes per leaf switch, in node order; nodes without a leaf are left out."""
        out: dict[str, list[NodeTopology]] = {}
        for n in self.nodes:
            if n.leaf is not None:
                out.setdefault(n.leaf, []).append(n)
        return out

    def nodes_by_spine(self) -> dict[str, list[NodeTopology]]:
        out: dict[str, list[NodeTopology]] = {}
        for n in self.nodes:
            if n.spine is not None:
                out.setdefault(n.spine, []).append(n)
        return out

    def nodes_by_nvlink_domain(self) -> dict[str, list[NodeTopology]]:
        out: dict[str, list[NodeTopology]] = {}
        for n in self.nodes:
            if n.nvlink_domain is not None:
                out.setdefault(n.nvlink_domain, []).append(n)
        return out

    @property
    def total_gpus(self) -> int:
        return sum(len(n.gpus) for n in self.nodes)


def _config_error(path: Path, err: ValidationError) -> ClusterConfigError:
    problems = "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or '(top level)'}: {e['msg']}" for e in err.errors(include_url=False)
    )
    return ClusterConfigError(f"{path}: {problems}")


def _group_topology(path: Path, index: int, group: NodeGroup) -> NodeTopology:
    key = f"node_groups.{index}.topology"
    if group.topology in PRESETS:
        return shared_preset(group.topology)
    file = (path.parent / group.topology).resolve()
    if not file.is_file():
        raise ClusterConfigError(
            f"{path}: {key}: {group.topology!r} is neither a preset ({', '.join(PRESETS)}) nor a file ({file})"
        )
    try:
        return parse_topo_matrix(file.read_text(encoding="utf-8"), node=group.prefix)
    except TopologyParseError as e:
        raise ClusterConfigError(f"{path}: {key}: {file}: {e}") from e


def _lldp_leaf(path: Path, name: str, lldp: str | dict[str, Any]) -> str | None:
    key = f"nodes.{name}.lldp"
    try:
        if isinstance(lldp, str):
            file = (path.parent / lldp).resolve()
            if not file.is_file():
                raise ClusterConfigError(f"{path}: {key}: no file {file}")
            return leaf_from_lldp(file.read_text(encoding="utf-8"))
        return leaf_from_lldp(lldp)
    except ValueError as e:
        if isinstance(e, ClusterConfigError):
            raise
        raise ClusterConfigError(f"{path}: {key}: {e}") from e


def load_cluster(path: str | Path) -> Cluster:
    """Read a cluster YAML (see docs/topology.md); errors name the file and the key."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ClusterConfigError(f"{path}: cannot read: {e.strerror}") from e
    except yaml.YAMLError as e:
        raise ClusterConfigError(f"{path}: not valid YAML: {e}") from e
    if not isinstance(raw, dict):
        raise ClusterConfigError(f"{path}: expected a mapping with name, fabric and node_groups")
    try:
        spec = ClusterFile.model_validate(raw)
    except ValidationError as e:
        raise _config_error(path, e) from None
    nodes: list[NodeTopology] = []
    leaf_index = 0
    for gi, group in enumerate(spec.node_groups):
        base = _group_topology(path, gi, group)
        width = max(2, len(str(group.start + group.count - 1)))
        per_leaf = _leaf_of(spec.fabric.nodes_per_leaf, group.nodes_per_nvlink_domain)
        for k in range(group.count):
            name = f"{group.prefix}-{group.start + k:0{width}d}"
            leaf = leaf_index + per_leaf(k)
            update: dict[str, Any] = {
                "node": name,
                "leaf": f"leaf{leaf}",
                "spine": f"spine{leaf // spec.fabric.leaves_per_spine}",
                "nic_gbps_per_gpu": spec.fabric.nic_gbytes_per_gpu,
                "labels": dict(group.labels),
                "features": _features(base, group.features),
                "nvlink_domain": nvlink_domain_of(base),
            }
            if group.nodes_per_nvlink_domain:
                update["nvlink_domain"] = f"{group.prefix}-nvl{k // group.nodes_per_nvlink_domain}"
            site = {lv: f"{group.prefix}-{lv}{k // n}" for lv, n in group.nodes_per_level.items()} | group.levels
            if site:
                update["levels"] = site
            update |= {k2: v for k2, v in (("cpus", group.cpus), ("memory_mb", group.memory_mb)) if v is not None}
            nodes.append(base.model_copy(update=update))
        leaf_index += per_leaf(group.count - 1) + 1
    _apply_overrides(path, spec, nodes)
    _name_levels(spec, nodes)
    return Cluster(name=spec.name, fabric=spec.fabric, nodes=nodes)


def short_level_name(label: str) -> str:
    """A level's name from its node label: the last word, without `topology-` (`cloud.provider.com/topology-block`
    is `block`, `topology.kubernetes.io/zone` is `zone`)."""
    word = label.rsplit("/", 1)[-1].lower()
    word = word.removeprefix("topology-").removeprefix("topology.")
    return re.sub(r"[^a-z0-9_-]", "-", word).strip("-") or "level"


def _name_levels(spec: ClusterFile, nodes: list[NodeTopology]) -> None:
    """Each node's domain at every site level, bottom-up, when the site names levels beyond nvlink/leaf/spine:
    `fabric.levels` (values from the node's levels, its group's, the level's label, or nvlink/leaf/spine), or Kueue
    `label_levels` above the leaf and spine."""
    fabric = spec.fabric
    order = list(fabric.levels or ())
    labels = dict(fabric.level_labels)
    if not order and fabric.label_levels:
        above = [k for k in fabric.label_levels if k != HOSTNAME_LABEL][:-2]  # top to bottom, above spine
        extra: list[str] = []
        for key in reversed(above):
            name = short_level_name(key)
            if (
                name in ("node", "cluster", "nvlink", "leaf", "spine")
                or name in extra
                or not re.match(LEVEL_NAME, name)
            ):
                name = f"level{len(extra) + 3}"
            extra.append(name)
            labels[name] = key
        if extra:
            order = ["nvlink", "leaf", "spine", *extra]
    if not order:
        return
    for i, n in enumerate(nodes):
        own = {"nvlink": n.nvlink_domain, "leaf": n.leaf, "spine": n.spine}
        over = spec.nodes.get(n.node)
        values: dict[str, str] = {}
        for level in order:
            value = (over.levels.get(level) if over else None) or n.levels.get(level)
            if value is None and level in labels:
                value = n.labels.get(labels[level])
            value = value or own.get(level)
            if value:
                values[level] = value
        nodes[i] = n.model_copy(update={"levels": values})


def _leaf_of(nodes_per_leaf: int, nodes_per_domain: int | None) -> Callable[[int], int]:
    """The leaf (counted from the group's first) of the group's k-th node. Leaves hold whole multi-node NVLink
    domains: the trays of one NVL72 rack share their leaves, and a domain is read inside its leaf (placement's level
    tree nests), so with fewer nodes per leaf than per domain each domain gets a leaf of its own."""
    if not nodes_per_domain:
        return lambda k: k // nodes_per_leaf
    domains_per_leaf = max(1, nodes_per_leaf // nodes_per_domain)
    return lambda k: (k // nodes_per_domain) // domains_per_leaf


def _apply_overrides(path: Path, spec: ClusterFile, nodes: list[NodeTopology]) -> None:
    """Labels, then LLDP, then explicit values replace the computed leaf/spine/NVLink domain of a node."""
    unknown = sorted(set(spec.nodes) - {n.node for n in nodes})
    if unknown:
        raise ClusterConfigError(f"{path}: nodes.{unknown[0]}: no such node (node_groups name nodes <prefix>-<nn>)")
    for i, n in enumerate(nodes):
        over = spec.nodes.get(n.node)
        labels = {**n.labels, **(over.labels if over else {})}
        if not labels and over is None:
            continue
        if over is not None and over.features:
            n = n.model_copy(update={"features": _features(n, over.features)})
        # A label that names a level of its own (fabric.level_labels) does not also name the leaf or spine.
        own_levels = set(spec.fabric.level_labels.values())
        place = place_from_labels({k: v for k, v in labels.items() if k not in own_levels}, spec.fabric.label_levels)
        update: dict[str, Any] = {"labels": labels}
        update |= {k: v for k, v in vars(place).items() if v is not None}
        if over is not None:
            if over.lldp is not None:
                lldp_leaf = _lldp_leaf(path, n.node, over.lldp)
                if lldp_leaf:
                    update["leaf"] = lldp_leaf
            update |= {k: v for k, v in over.model_dump(include={"leaf", "spine", "nvlink_domain"}).items() if v}
        nodes[i] = n.model_copy(update=update)


def _features(topo: NodeTopology, extra: list[str]) -> list[str]:
    """The node's features plus `extra` and its GPU model's (`h100`), lower case, each once, in order."""
    out: list[str] = []
    model = model_feature(topo.gpu_model)
    for f in [*topo.features, *extra, *([model] if model else [])]:
        f = f.strip().lower()
        if f and f not in out:
            out.append(f)
    return out


def synthetic_cluster(
    n_nodes: int,
    preset: str = "h100_sxm_8gpu_nvswitch_nv18",
    nodes_per_leaf: int = 8,
    leaves_per_spine: int = 4,
    nic_gbps_per_gpu: float = 400.0,
    oversubscription: float = 1.0,
    name: str = "synthetic",
    prefix: str = "node",
    nodes_per_nvlink_domain: int | None = None,
) -> Cluster:
    """`n_nodes` copies of a preset under a regular leaf/spine tree, for benchmarks and simulation."""
    if n_nodes < 1:
        raise ValueError(f"n_nodes must be at least 1, got {n_nodes}")
    fabric = Fabric(
        nodes_per_leaf=nodes_per_leaf,
        leaves_per_spine=leaves_per_spine,
        nic_gbps_per_gpu=nic_gbps_per_gpu,
        oversubscription=oversubscription,
    )
    base = shared_preset(preset).model_copy(
        update={"source": "synthetic", "nic_gbps_per_gpu": fabric.nic_gbytes_per_gpu}
    )
    base = base.model_copy(update={"features": _features(base, [])})  # its GPU model's feature (`h100`)
    width = max(2, len(str(n_nodes - 1)))
    nodes = []
    per_leaf = _leaf_of(nodes_per_leaf, nodes_per_nvlink_domain)
    for i in range(n_nodes):
        leaf = per_leaf(i)
        update: dict[str, Any] = {
            "node": f"{prefix}-{i:0{width}d}",
            "leaf": f"leaf{leaf}",
            "spine": f"spine{leaf // leaves_per_spine}",
        }
        if nodes_per_nvlink_domain:
            update["nvlink_domain"] = f"{prefix}-nvl{i // nodes_per_nvlink_domain}"
        nodes.append(base.model_copy(update=update))
    return Cluster(name=name, fabric=fabric, nodes=nodes)
