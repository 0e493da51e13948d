"""Paths and names shared by the topology tests (the repository's copies of the reference files)."""

from __future__ import annotations

from pathlib import Path

from oneplus_contracts import NodeTopology
from oneplus_topology.smi import parse_topo_matrix

REPO = Path(__file__).resolve().parents[2]
TOPOLOGIES = REPO / "data" / "topologies"
REAL_FILES = (
    "h100_sxm_8gpu_nvswitch_nv18",
    "dgx_a100_8gpu_nv12_12nic",
    "a800_8gpu_nvswitch_nv8_4nic",
    "gb200_nvl72_compute_tray_4gpu",
    "l40s_8gpu_pcie_node_sys",
    "rtx4090_8gpu_pcie_all_sys",
)
CONSTRUCTED_FILES = ("dgx1_v100", "h100_4gpu_nv6", "pcie_pix_pxb_8gpu")


def parse_file(name: str) -> NodeTopology:
    return parse_topo_matrix((TOPOLOGIES / f"{name}.txt").read_text(encoding="utf-8"), node=name)


def kind(topo: NodeTopology, a: int, b: int) -> str:
    a, b = min(a, b), max(a, b)
    return next(lk.kind for lk in topo.links if (lk.a, lk.b) == (a, b))
