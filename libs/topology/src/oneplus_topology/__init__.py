"""Cluster topology model and parsers (nvidia-smi topo -m, NVML, cluster YAML).

The wire form (`NodeTopology`, `GpuInfo`, `GpuLink`, `NicInfo`) lives in `oneplus_contracts`; this package fills it
from real sources and answers questions about it (NVLink groups, ring bandwidth, rails, leaf/spine).
"""

from .analysis import (
    GpuSet,
    NodeModel,
    apply_health,
    best_gpu_sets,
    degrade,
    node_model,
    numa_groups,
    nvlink_domains,
    nvlink_groups,
    pair_gbps,
    pcie_switch_groups,
    rails,
    ring_gbps,
)
from .bandwidth import link_gbps, nic_gbytes, nic_ring_gbps
from .errors import ClusterConfigError, NvmlUnavailable, TopologyParseError
from .presets import PRESETS, load_preset
from .smi import parse_topo_matrix, render_topo_matrix

__all__ = [
    "PRESETS",
    "ClusterConfigError",
    "GpuSet",
    "NodeModel",
    "NvmlUnavailable",
    "TopologyParseError",
    "apply_health",
    "best_gpu_sets",
    "degrade",
    "link_gbps",
    "load_preset",
    "nic_gbytes",
    "nic_ring_gbps",
    "node_model",
    "numa_groups",
    "nvlink_domains",
    "nvlink_groups",
    "pair_gbps",
    "parse_topo_matrix",
    "pcie_switch_groups",
    "rails",
    "render_topo_matrix",
    "ring_gbps",
]
