"""GB/s per link type, each number taken from a row of `data/bandwidth/measured_bandwidth_reference.csv`.

Rows are cited by their line number in that file (line 1 is the header). `CITATIONS` lists every row used, and a test
checks each cited line still says what the code assumes. All rates are unidirectional GB/s (bytes, not bits).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .gpu_models import model_spec


@dataclass(frozen=True)
class Citation:
    line: int
    hardware: str
    value_gbps: str
    use: str


CSV_PATH = "data/bandwidth/measured_bandwidth_reference.csv"
CITATIONS: dict[str, Citation] = {
    "nvlink2": Citation(2, "NVLink2 (V100)", "150", "150 GB/s over 6 links = 25 GB/s per link"),
    "nvlink3": Citation(3, "NVLink3 (A100)", "300", "300 GB/s over 12 links = 25 GB/s per link (A800: 8 links)"),
    "nvlink4": Citation(4, "NVLink4 (H100/H200/H800=8 links)", "450", "450 GB/s over 18 links = 25 GB/s per link"),
    "nvlink5": Citation(5, "NVLink5 (B200/GB200)", "900", "900 GB/s over 18 links = 50 GB/s per link"),
    "pcie4": Citation(6, "PCIe Gen4 x16", "31", "GPU pair under one PCIe switch (PIX/PXB), Gen4"),
    "pcie5": Citation(7, "PCIe Gen5 x16", "63", "GPU pair under one PCIe switch (PIX/PXB), Gen5"),
    "ib_hdr": Citation(8, "IB HDR 200Gb/s", "25", "200 Gb/s NIC = 25 GB/s"),
    "ib_ndr": Citation(9, "IB NDR 400Gb/s", "50", "400 Gb/s NIC = 50 GB/s; rings reach 46-48 GB/s"),
    "pcie_host": Citation(
        24,
        "8x RTX 5090 PCIe (no NVLink)",
        "28 (8 GPU) / 35 (4 GPU)",
        "PCIe Gen5 pairs through the CPU: 35 of 63 GB/s inside a socket, 28 of 63 across sockets",
    ),
}

# Per-link GB/s by NVLink generation: lines 2-5 (aggregate per GPU divided by links per GPU).
NVLINK_PER_LINK_GBPS: dict[int, float] = {2: 150 / 6, 3: 300 / 12, 4: 450 / 18, 5: 900 / 18}
# Unknown GPU model: 25 GB/s per link, the rate NVLink2, 3 and 4 share (lines 2-4); NVLink5 would be twice that.
DEFAULT_NVLINK_PER_LINK_GBPS = 25.0
# PCIe x16 GB/s by generation: line 6 (Gen4), line 7 (Gen5); Gen3 is half of Gen4 (each generation doubles the rate).
PCIE_X16_GBPS: dict[int, float] = {3: 31 / 2, 4: 31.0, 5: 63.0}
# Unknown GPU model: PCIe Gen4 (line 6), the generation of every PCIe GPU in the reference files but the RTX 5090.
DEFAULT_PCIE_GEN = 4
# Share of the x16 rate a pair gets by PCIe tier: full under a switch (lines 6/7); through the CPU line 24 measured
# 35/63 inside a socket (PHB, NODE) and 28/63 across sockets (SYS).
PCIE_TIER_FACTOR: dict[str, float] = {"PIX": 1.0, "PXB": 1.0, "PHB": 35 / 63, "NODE": 35 / 63, "SYS": 28 / 63}
# Line 9: NVIDIA expects 46-48 GB/s of a 50 GB/s NIC in an nccl-tests ring.
NIC_RING_EFFICIENCY = 47 / 50
NIC_HDR_200_GBPS = 200 / 8  # line 8
NIC_NDR_400_GBPS = 400 / 8  # line 9

_NV_RE = re.compile(r"^NV(\d+)$")


def nvlink_count(kind: str) -> int:
    """Bonded NVLinks in a link type as nvidia-smi prints it: `NV12` -> 12, a PCIe tier -> 0."""
    m = _NV_RE.match(kind)
    return int(m.group(1)) if m else 0


def nvlink_per_link_gbps(gpu_model: str) -> float:
    spec = model_spec(gpu_model)
    if spec is None or spec.nvlink_gen is None:
        return DEFAULT_NVLINK_PER_LINK_GBPS
    return NVLINK_PER_LINK_GBPS[spec.nvlink_gen]


def pcie_x16_gbps(gpu_model: str) -> float:
    spec = model_spec(gpu_model)
    return PCIE_X16_GBPS[spec.pcie_gen if spec else DEFAULT_PCIE_GEN]


def link_gbps(kind: str, gpu_model: str) -> float:
    """Unidirectional GB/s one ring hop over a link of this type carries, e.g. `link_gbps("NV18", "H100") == 450`."""
    links = nvlink_count(kind)
    if links:
        return links * nvlink_per_link_gbps(gpu_model)
    if kind in PCIE_TIER_FACTOR:
        return pcie_x16_gbps(gpu_model) * PCIE_TIER_FACTOR[kind]
    raise ValueError(f"unknown link type {kind!r}: expected NV<n> or one of {', '.join(PCIE_TIER_FACTOR)}")


def assumptions(gpu_model: str) -> list[str]:
    """The defaults `link_gbps` falls back on for this model, in words (empty when the model is known)."""
    spec = model_spec(gpu_model)
    if spec is not None:
        return []
    return [
        f"GPU model {gpu_model!r} is not known: NVLink counted at {DEFAULT_NVLINK_PER_LINK_GBPS:g} GB/s per link "
        f"(NVLink2-4) and PCIe as Gen{DEFAULT_PCIE_GEN} x16 ({PCIE_X16_GBPS[DEFAULT_PCIE_GEN]:g} GB/s)"
    ]


def nic_gbytes(gbits: float) -> float:
    """A NIC rate in Gb/s (as fabrics are quoted) to GB/s: 400 -> 50 (lines 8, 9)."""
    if gbits <= 0:
        raise ValueError(f"NIC rate must be positive, got {gbits} Gb/s")
    return gbits / 8


def nic_ring_gbps(nic_gbits_per_gpu: float, oversubscription: float = 1.0) -> float:
    """GB/s a ring hop between nodes carries per GPU: NIC rate at ring efficiency (line 9) over the uplink ratio."""
    if oversubscription < 1:
        raise ValueError(f"oversubscription must be >= 1, got {oversubscription}")
    return nic_gbytes(nic_gbits_per_gpu) * NIC_RING_EFFICIENCY / oversubscription
