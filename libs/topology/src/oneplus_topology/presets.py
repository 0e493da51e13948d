"""Named node layouts that ship inside the package: the six real `nvidia-smi topo -m` captures and three layouts
built for kinds the captures do not cover (DGX-1 hybrid cube mesh, 4-GPU NV6 board, PCIe switch trees)."""

from __future__ import annotations

from functools import cache
from importlib import resources

from oneplus_contracts import NodeTopology

from .smi import parse_topo_matrix

REAL_PRESETS: tuple[str, ...] = (
    "h100_sxm_8gpu_nvswitch_nv18",
    "dgx_a100_8gpu_nv12_12nic",
    "a800_8gpu_nvswitch_nv8_4nic",
    "gb200_nvl72_compute_tray_4gpu",
    "l40s_8gpu_pcie_node_sys",
    "rtx4090_8gpu_pcie_all_sys",
)
CONSTRUCTED_PRESETS: tuple[str, ...] = ("dgx1_v100", "h100_4gpu_nv6", "pcie_pix_pxb_8gpu")
PRESETS: tuple[str, ...] = REAL_PRESETS + CONSTRUCTED_PRESETS


def preset_text(name: str) -> str:
    """The `nvidia-smi topo -m` text of a preset."""
    if name not in PRESETS:
        raise KeyError(f"unknown topology preset {name!r}; presets: {', '.join(PRESETS)}")
    return (resources.files("oneplus_topology") / "presets" / f"{name}.txt").read_text(encoding="utf-8")


@cache
def _parsed(name: str) -> NodeTopology:
    return parse_topo_matrix(preset_text(name), node=name).model_copy(update={"source": "preset"})


def shared_preset(name: str) -> NodeTopology:
    """The one parsed copy of a preset; callers must not change it (copy it with `model_copy(update=...)`)."""
    return _parsed(name)


def load_preset(name: str, node: str = "node0") -> NodeTopology:
    """A fresh, independent copy of a preset named `node`."""
    return _parsed(name).model_copy(update={"node": node}, deep=True)
