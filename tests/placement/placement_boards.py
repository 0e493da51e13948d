"""Boards and small clusters for placement tests, from the topology library's presets and parser."""

from __future__ import annotations

from oneplus_contracts import NodeTopology
from oneplus_topology import load_preset, parse_topo_matrix
from oneplus_topology.cluster import Cluster, Fabric, synthetic_cluster

HGX_H100 = "h100_sxm_8gpu_nvswitch_nv18"
DGX1 = "dgx1_v100"
L40S = "l40s_8gpu_pcie_node_sys"
PCIE_SWITCHES = "pcie_pix_pxb_8gpu"
H100_QUAD = "h100_4gpu_nv6"


def islands_topo(gpus: int, island: int, link: str, model: str, node: str) -> NodeTopology:
    """`gpus` GPUs in NVLink islands of `island` (`link` inside each, e.g. NV6), SYS between the islands."""
    names = [f"GPU{i}" for i in range(gpus)]
    rows = ["\t" + "\t".join(names)]
    for a in range(gpus):
        cells = ["X" if a == b else (link if a // island == b // island else "SYS") for b in range(gpus)]
        rows.append(f"GPU{a}\t" + "\t".join(cells))
    return parse_topo_matrix(f"# gpu_model: {model}\n" + "\n".join(rows) + "\n", node=node)


def two_islands_topo(node: str = "islands") -> NodeTopology:
    """Two 4-GPU NVLink islands (NV6 inside each), SYS between them: no NVLink domain of 8."""
    return islands_topo(8, 4, "NV6", "NVIDIA H100 80GB HBM3", node)


def cluster_of(
    boards: list[NodeTopology], nodes_per_leaf: int = 4, leaves_per_spine: int = 2, name: str = "test", **fabric: float
) -> Cluster:
    """Nodes `n000`.. from the given boards, `nodes_per_leaf` to a leaf."""
    nodes = []
    for i, b in enumerate(boards):
        leaf = i // nodes_per_leaf
        nodes.append(
            b.model_copy(
                update={"node": f"n{i:03d}", "leaf": f"leaf{leaf}", "spine": f"spine{leaf // leaves_per_spine}"}
            )
        )
    return Cluster(
        name=name,
        fabric=Fabric(nodes_per_leaf=nodes_per_leaf, leaves_per_spine=leaves_per_spine, **fabric),
        nodes=nodes,
    )  # type: ignore[arg-type]


def preset_cluster(preset: str, n_nodes: int, nodes_per_leaf: int = 4, leaves_per_spine: int = 2) -> Cluster:
    return synthetic_cluster(
        n_nodes, preset=preset, nodes_per_leaf=nodes_per_leaf, leaves_per_spine=leaves_per_spine, name="test"
    )


def board(preset: str) -> NodeTopology:
    return load_preset(preset)
