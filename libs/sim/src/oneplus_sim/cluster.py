"""The simulator's view of a cluster: nodes of a few kinds (GPU×GPU bandwidth matrix), leaves, NICs.

Built from the cluster YAML (through `oneplus_topology`), a Tiresias cluster spec CSV or the Alibaba
openb node list. The latter two say nothing about GPU links: their nodes are one PCIe domain.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from .rates import NIC_HDR_GBPS, PCIE_GEN4_GBPS


class ClusterError(ValueError):
    """A cluster file that cannot be read, with the file and what is wrong."""


@dataclass(frozen=True)
class NodeKind:
    """Everything nodes of one hardware kind share."""

    name: str
    gpu_model: str
    n_gpus: int
    pair_gbps: tuple[tuple[float, ...], ...]
    cpus: float = 128.0
    memory_mb: int = 1024 * 1024
    nvlink: tuple[tuple[bool, ...], ...] | None = None

    def __post_init__(self) -> None:
        if len(self.pair_gbps) != self.n_gpus or any(len(r) != self.n_gpus for r in self.pair_gbps):
            raise ClusterError(f"node kind {self.name}: bandwidth matrix must be {self.n_gpus}x{self.n_gpus}")

    @cached_property
    def nvlink_domains(self) -> tuple[frozenset[int], ...]:
        """GPUs joined by NVLink (connected components); a GPU without NVLink is its own domain."""
        links = self.nvlink or tuple(tuple(False for _ in range(self.n_gpus)) for _ in range(self.n_gpus))
        seen: set[int] = set()
        out: list[frozenset[int]] = []
        for g in range(self.n_gpus):
            if g in seen:
                continue
            comp, stack = {g}, [g]
            while stack:
                a = stack.pop()
                for b in range(self.n_gpus):
                    if links[a][b] and b not in comp:
                        comp.add(b)
                        stack.append(b)
            seen |= comp
            out.append(frozenset(comp))
        return tuple(out)

    @cached_property
    def largest_nvlink_domain(self) -> int:
        return max((len(d) for d in self.nvlink_domains), default=1)


def uniform_kind(name: str, gpu_model: str, n_gpus: int, gbps: float, *, nvlink: bool = False, **kw: float) -> NodeKind:
    """A node whose GPU pairs all see the same bandwidth (NVSwitch, or one PCIe domain)."""
    m = tuple(tuple(0.0 if a == b else gbps for b in range(n_gpus)) for a in range(n_gpus))
    links = tuple(tuple(nvlink and a != b for b in range(n_gpus)) for a in range(n_gpus)) if nvlink else None
    return NodeKind(name, gpu_model, n_gpus, m, nvlink=links, **kw)  # type: ignore[arg-type]


@dataclass(frozen=True)
class SimNode:
    name: str
    kind: NodeKind
    leaf: int
    spine: int = 0
    nic_gbps_per_gpu: float = NIC_HDR_GBPS


@dataclass
class SimCluster:
    nodes: tuple[SimNode, ...]
    oversubscription: float = 1.0
    source: str = "synthetic"
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.nodes:
            raise ClusterError("the cluster has no nodes")
        if self.oversubscription < 1:
            raise ClusterError(f"oversubscription must be >= 1, got {self.oversubscription}")

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

    @cached_property
    def leaf_gpus(self) -> dict[int, int]:
        return {leaf: sum(self.nodes[i].kind.n_gpus for i in idx) for leaf, idx in self.leaves.items()}

    @cached_property
    def kinds(self) -> tuple[NodeKind, ...]:
        seen: dict[str, NodeKind] = {}
        for n in self.nodes:
            seen.setdefault(n.kind.name, n.kind)
        return tuple(seen.values())

    def describe(self) -> dict[str, object]:
        return {
            "source": self.source,
            "nodes": len(self.nodes),
            "gpus": self.total_gpus,
            "leaves": len(self.leaves),
            "oversubscription": self.oversubscription,
            "kinds": sorted({f"{k.name} ({k.n_gpus}x {k.gpu_model})" for k in self.kinds}),
            "notes": list(self.notes),
        }


def uniform_cluster(
    n_nodes: int,
    kind: NodeKind,
    nodes_per_leaf: int,
    *,
    oversubscription: float = 1.0,
    nic_gbps_per_gpu: float = NIC_HDR_GBPS,
    leaves_per_spine: int = 0,
    source: str = "synthetic",
) -> SimCluster:
    if n_nodes < 1 or nodes_per_leaf < 1:
        raise ClusterError("need at least one node and one node per leaf")
    nodes = tuple(
        SimNode(
            f"node-{i:04d}",
            kind,
            leaf=i // nodes_per_leaf,
            spine=(i // nodes_per_leaf) // leaves_per_spine if leaves_per_spine else 0,
            nic_gbps_per_gpu=nic_gbps_per_gpu,
        )
        for i in range(n_nodes)
    )
    return SimCluster(nodes, oversubscription, source)


def load_cluster(path: Path | str) -> SimCluster:
    """A cluster YAML (via oneplus_topology), a Tiresias cluster spec CSV, or the openb node list CSV."""
    p = Path(path)
    if not p.is_file():
        raise ClusterError(f"{p}: no such cluster file")
    if p.suffix.lower() in (".yaml", ".yml"):
        from .topology_bridge import cluster_from_yaml

        return cluster_from_yaml(p)
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
    """Tiresias `nXgY.csv`: switches (= leaves) x nodes per switch x GPUs per node."""
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
    kind = uniform_kind(f"tiresias-{gpus}gpu", "unknown", gpus, PCIE_GEN4_GBPS, cpus=cpus, memory_mb=mem_gb * 1024)
    c = uniform_cluster(switches * per_switch, kind, per_switch, oversubscription=oversubscription, source=str(p))
    c.notes.append(
        f"Tiresias spec: GPU links unknown, each node is one PCIe Gen4 domain ({PCIE_GEN4_GBPS} GB/s); "
        f"NIC {NIC_HDR_GBPS} GB/s per GPU; {oversubscription}:1 above the switch (assumed)"
    )
    return c


def load_openb_nodes(p: Path, nodes_per_leaf: int = 32) -> SimCluster:
    """Alibaba openb node list: CPU, memory, GPU model and count per node; GPU topology unknown."""
    with p.open(newline="") as fh:
        rows = [(i + 2, r) for i, r in enumerate(csv.DictReader(fh))]
    kinds: dict[tuple[str, int, int, int], NodeKind] = {}
    nodes: list[SimNode] = []
    for line, row in rows:
        gpus = _int(p, line, row, "gpu")
        cpu_milli, mem = _int(p, line, row, "cpu_milli"), _int(p, line, row, "memory_mib")
        model = (row.get("model") or "").strip() or "none"
        key = (model, gpus, cpu_milli, mem)
        if key not in kinds:
            kinds[key] = uniform_kind(
                f"{model}x{gpus}-c{cpu_milli // 1000}-m{mem // 1024}",
                model,
                gpus,
                PCIE_GEN4_GBPS,
                cpus=cpu_milli / 1000,
                memory_mb=mem,
            )
        nodes.append(SimNode((row.get("sn") or f"node-{line}").strip(), kinds[key], leaf=len(nodes) // nodes_per_leaf))
    if not nodes:
        raise ClusterError(f"{p}: the node list is empty")
    c = SimCluster(tuple(nodes), 1.0, str(p))
    c.notes.append(
        f"openb node list: GPU topology unknown, each node is one PCIe Gen4 domain; {nodes_per_leaf} nodes per leaf "
        f"in file order, no oversubscription (assumed)"
    )
    return c


def node_names(cluster: SimCluster, idx: Sequence[int]) -> list[str]:
    return [cluster.nodes[i].name for i in idx]
