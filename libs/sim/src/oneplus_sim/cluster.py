"""The simulator's view of a cluster: an `oneplus_topology.Cluster` plus flat per-node arrays for fast cycles.

Three inputs become the same `Cluster`: the cluster YAML (`oneplus_topology.cluster.load_cluster`), a Tiresias
cluster spec CSV and the Alibaba openb node list. The last two say nothing about GPU links: each of their nodes is
one PCIe domain (every GPU pair at the PXB tier, `oneplus_topology.bandwidth.link_gbps`), documented in the report.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from oneplus_contracts import GpuInfo, GpuLink, NodeTopology
from oneplus_placement.snapshot import Layout, _layout_of
from oneplus_topology import ClusterConfigError, node_model
from oneplus_topology.bandwidth import link_gbps
from oneplus_topology.cluster import Cluster, Fabric, synthetic_cluster
from oneplus_topology.cluster import load_cluster as load_cluster_yaml

# IB HDR 200 Gb/s per GPU (data/bandwidth/measured_bandwidth_reference.csv line 8) for specs that name no NIC.
DEFAULT_NIC_GBITS = 200.0


class ClusterError(ValueError):
    """A cluster file that cannot be read, with the file and what is wrong."""


@dataclass(frozen=True)
class NodeKind:
    """What nodes of one hardware layout share: GPU×GPU GB/s, NVLink adjacency and domains, CPU and memory."""

    name: str
    gpu_model: str
    n_gpus: int
    pair_gbps: tuple[tuple[float, ...], ...]
    nvlink: tuple[tuple[bool, ...], ...]
    nvlink_domains: tuple[frozenset[int], ...]
    cpus: float
    memory_mb: int

    @cached_property
    def largest_nvlink_domain(self) -> int:
        return max((len(d) for d in self.nvlink_domains), default=1)


@dataclass(frozen=True)
class SimNode:
    name: str
    kind: NodeKind
    leaf: int


@dataclass
class SimCluster:
    topology: Cluster
    source: str = "synthetic"
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.topology.nodes:
            raise ClusterError(f"{self.source}: the cluster has no nodes")
        kinds: dict[tuple[object, ...], NodeKind] = {}
        leaf_ix: dict[str, int] = {}
        nodes = []
        for topo in self.topology.nodes:
            key = _kind_key(topo)
            kind = kinds.get(key)
            if kind is None:
                kind = kinds[key] = _kind_of(topo, f"{topo.gpu_model}x{len(topo.gpus)}-{len(kinds)}")
            leaf = topo.leaf or f"leaf-{topo.node}"
            nodes.append(SimNode(topo.node, kind, leaf_ix.setdefault(leaf, len(leaf_ix))))
        self.nodes: tuple[SimNode, ...] = tuple(nodes)
        self.kinds: tuple[NodeKind, ...] = tuple(kinds.values())

    @property
    def layout(self) -> Layout:
        """Placement's layout of this cluster (node i here is slot i there)."""
        return _layout_of(self.topology)

    @property
    def oversubscription(self) -> float:
        return self.topology.fabric.oversubscription

    @cached_property
    def total_gpus(self) -> int:
        return sum(n.kind.n_gpus for n in self.nodes)

    @cached_property
    def max_node_gpus(self) -> int:
        return max(n.kind.n_gpus for n in self.nodes)

    @cached_property
    def leaves(self) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for i, n in enumerate(self.nodes):
            out.setdefault(n.leaf, []).append(i)
        return out

    def describe(self) -> dict[str, object]:
        f = self.topology.fabric
        return {
            "source": self.source,
            "name": self.topology.name,
            "nodes": len(self.nodes),
            "gpus": self.total_gpus,
            "leaves": len(self.leaves),
            "nic_gbits_per_gpu": f.nic_gbps_per_gpu,
            "oversubscription": f.oversubscription,
            "kinds": sorted({f"{k.n_gpus}x {k.gpu_model} ({k.cpus:g} CPUs)" for k in self.kinds}),
            "notes": list(self.notes),
        }


def _kind_key(topo: NodeTopology) -> tuple[object, ...]:
    return (
        topo.gpu_model,
        topo.cpus,
        topo.memory_mb,
        tuple(g.index for g in topo.gpus),
        tuple((lk.a, lk.b, lk.kind, lk.gbps) for lk in topo.links),
    )


def _kind_of(topo: NodeTopology, name: str) -> NodeKind:
    model = node_model(topo)
    n = len(topo.gpus)
    pos = {g.index: p for p, g in enumerate(topo.gpus)}
    if sorted(pos) != list(range(n)):
        raise ClusterError(f"node {topo.node}: GPU indexes must be 0..{n - 1}, got {sorted(pos)}")
    # Rows and columns by GPU index (the model is by position in topo.gpus).
    order = [pos[i] for i in range(n)]
    gbps = tuple(tuple(model.gbps[order[a]][order[b]] for b in range(n)) for a in range(n))
    nvl = tuple(tuple(model.nvlinks[order[a]][order[b]] > 0 for b in range(n)) for a in range(n))
    domains = [frozenset(model.indices[p] for p in d) for d in model.domains]
    covered = set().union(*domains) if domains else set()
    domains += [frozenset({g}) for g in range(n) if g not in covered]
    return NodeKind(name, topo.gpu_model, n, gbps, nvl, tuple(domains), float(topo.cpus), topo.memory_mb)


def uniform_cluster(
    n_nodes: int,
    preset: str = "h100_sxm_8gpu_nvswitch_nv18",
    nodes_per_leaf: int = 8,
    *,
    oversubscription: float = 1.0,
    nic_gbits_per_gpu: float = 400.0,
    leaves_per_spine: int = 4,
) -> SimCluster:
    """`n_nodes` copies of a topology preset under a regular leaf/spine tree."""
    c = synthetic_cluster(
        n_nodes,
        preset,
        nodes_per_leaf=nodes_per_leaf,
        leaves_per_spine=leaves_per_spine,
        nic_gbps_per_gpu=nic_gbits_per_gpu,
        oversubscription=oversubscription,
        name=f"{n_nodes}x-{preset}",
    )
    return SimCluster(c, source=f"synthetic:{preset}")


def load_cluster(path: Path | str) -> SimCluster:
    """A cluster YAML, a Tiresias cluster spec CSV, or the openb node list CSV."""
    p = Path(path)
    if not p.is_file():
        raise ClusterError(f"{p}: no such cluster file")
    if p.suffix.lower() in (".yaml", ".yml"):
        try:
            return SimCluster(load_cluster_yaml(p), source=str(p))
        except ClusterConfigError as e:
            raise ClusterError(str(e)) from e
    with p.open(newline="") as fh:
        header = fh.readline().strip().lstrip("\ufeff")
    cols = {c.strip() for c in header.split(",")}
    if {"num_switch", "num_node_p_switch", "num_gpu_p_node"} <= cols:
        return load_tiresias_spec(p)
    if {"sn", "cpu_milli", "memory_mib", "gpu", "model"} <= cols:
        return load_openb_nodes(p)
    raise ClusterError(
        f"{p}: unknown cluster format (header {header!r}); expected a YAML cluster spec, a Tiresias spec "
        "(num_switch,num_node_p_switch,num_gpu_p_node,...) or the openb node list (sn,cpu_milli,memory_mib,gpu,model)"
    )


def pcie_node(name: str, n_gpus: int, gpu_model: str, cpus: int, memory_mb: int, leaf: str, spine: str) -> NodeTopology:
    """A node whose GPUs all sit under one PCIe switch (PXB between every pair), for inputs without GPU links."""
    model = gpu_model or "unknown"
    gbps = link_gbps("PXB", model)
    gpus = [GpuInfo(index=i, name=model) for i in range(n_gpus)]
    links = [GpuLink(a=a, b=b, kind="PXB", gbps=gbps) for a in range(n_gpus) for b in range(a + 1, n_gpus)]
    return NodeTopology(
        node=name,
        gpu_model=model,
        gpus=gpus,
        links=links,
        cpus=cpus,
        memory_mb=memory_mb,
        leaf=leaf,
        spine=spine,
        nic_gbps_per_gpu=DEFAULT_NIC_GBITS / 8,
        source="synthetic",
    )


def _int(p: Path, line: int, row: dict[str, str], key: str) -> int:
    raw = (row.get(key) or "").strip()
    try:
        v = float(raw)
    except ValueError:
        raise ClusterError(f"{p}:{line}: column {key!r} must be a number, got {raw!r}") from None
    if v != int(v) or v < 0:
        raise ClusterError(f"{p}:{line}: column {key!r} must be a whole number >= 0, got {raw!r}")
    return int(v)


def load_tiresias_spec(p: Path, oversubscription: float = 2.0) -> SimCluster:
    """Tiresias `nXgY.csv`: switches (= leaves) x nodes per switch x GPUs per node, CPUs and memory (GB) per node."""
    with p.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    if len(rows) != 1:
        raise ClusterError(f"{p}: a Tiresias cluster spec has exactly one data row, found {len(rows)}")
    row = rows[0]
    switches, per_switch, gpus = (_int(p, 2, row, k) for k in ("num_switch", "num_node_p_switch", "num_gpu_p_node"))
    if min(switches, per_switch, gpus) < 1:
        raise ClusterError(f"{p}:2: switches, nodes per switch and GPUs per node must all be >= 1")
    cpus = _int(p, 2, row, "num_cpu_p_node") if row.get("num_cpu_p_node") else 128
    mem_gb = _int(p, 2, row, "mem_p_node") if row.get("mem_p_node") else 256
    nodes = [
        pcie_node(f"s{s}-n{k:03d}", gpus, "unknown", cpus, mem_gb * 1024, f"leaf{s}", "spine0")
        for s in range(switches)
        for k in range(per_switch)
    ]
    fabric = Fabric(
        nodes_per_leaf=per_switch,
        leaves_per_spine=switches,
        nic_gbps_per_gpu=DEFAULT_NIC_GBITS,
        oversubscription=oversubscription,
    )
    c = SimCluster(Cluster(name=p.stem, fabric=fabric, nodes=nodes), source=str(p))
    c.notes.append(
        f"Tiresias spec: GPU links unknown, each node is one PCIe domain (PXB pairs); {DEFAULT_NIC_GBITS:g} Gb/s NIC "
        f"per GPU and {oversubscription:g}:1 above the switch (assumed)"
    )
    return c


OpenbEntry = tuple[str, int, str, int, int]  # name, GPUs, GPU model, CPU milli-cores, memory MiB


def openb_cluster(name: str, entries: Sequence[OpenbEntry], nodes_per_leaf: int = 32) -> Cluster:
    """openb nodes as a `Cluster`: each one PCIe domain, `nodes_per_leaf` per leaf in list order, one spine."""
    nodes = [
        pcie_node(node, gpus, model, max(1, cpu_milli // 1000), memory, f"leaf{k // nodes_per_leaf}", "spine0")
        for k, (node, gpus, model, cpu_milli, memory) in enumerate(entries)
    ]
    fabric = Fabric(nodes_per_leaf=nodes_per_leaf, leaves_per_spine=10_000, nic_gbps_per_gpu=DEFAULT_NIC_GBITS)
    return Cluster(name=name, fabric=fabric, nodes=nodes)


def load_openb_nodes(p: Path, nodes_per_leaf: int = 32) -> SimCluster:
    """Alibaba openb node list: CPU, memory, GPU model and count per node; GPU topology unknown."""
    with p.open(newline="") as fh:
        rows = [(i + 2, r) for i, r in enumerate(csv.DictReader(fh))]
    entries = [
        (
            (row.get("sn") or f"node-{line}").strip(),
            _int(p, line, row, "gpu"),
            (row.get("model") or "").strip(),
            _int(p, line, row, "cpu_milli"),
            _int(p, line, row, "memory_mib"),
        )
        for line, row in rows
    ]
    if not entries:
        raise ClusterError(f"{p}: the node list is empty")
    c = SimCluster(openb_cluster(p.stem, entries, nodes_per_leaf), source=str(p))
    c.notes.append(
        f"openb node list: GPU topology unknown, each node is one PCIe domain (PXB pairs); {nodes_per_leaf} nodes "
        f"per leaf in file order; {DEFAULT_NIC_GBITS:g} Gb/s NIC per GPU; no oversubscription (assumed)"
    )
    return c
