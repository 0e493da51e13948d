"""Wire form of what a node says about itself: its topology report and its heartbeats.

The analysis of this data (NVLink groups, ring bandwidth, fabric tree) lives in `oneplus_topology`.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from .jobspec import LEVEL_NAME, Strict

# The PCIe tiers of `nvidia-smi topo -m`, nearest first.
PCIE_TIERS = ("PIX", "PXB", "PHB", "NODE", "SYS")
TopologySource = Literal["nvml", "nvidia-smi", "preset", "synthetic"]


class MigInstance(Strict):
    """One MIG device (GPU instance with its compute instance) as `nvidia-smi -L` and NVML list it."""

    profile: str = Field(description="e.g. 3g.40gb (compute slices g, memory)")
    uuid: str = Field(description="MIG-<uuid>: what a container is handed")
    device: int = Field(ge=0, description="The `Device N` number under its GPU")


class GpuInfo(Strict):
    index: int = Field(ge=0)
    uuid: str | None = None
    name: str = "unknown"
    memory_mb: int | None = None
    pci_bus_id: str | None = None
    numa_node: int | None = None
    cpu_affinity: str | None = Field(default=None, description="CPU list as printed, e.g. '0-47,96-143'")
    pcie_switch: str | None = Field(default=None, description="Id of the PCIe switch above the GPU, if known")
    nvlinks_total: int = 0
    nvlinks_active: int = 0
    mig_enabled: bool = False
    mig_instances: list[MigInstance] = Field(
        default_factory=list, description="The MIG devices this GPU is split into (empty: used whole)"
    )
    clique_id: int | None = None
    cluster_uuid: str | None = None
    healthy: bool = True
    health_reason: str | None = None


class GpuLink(Strict):
    """The connection between two GPUs as nvidia-smi prints it: `NV#` or a PCIe tier."""

    a: int
    b: int
    kind: str = Field(description="e.g. NV12, NV2, PIX, PXB, PHB, NODE, SYS")
    nvlinks: int = 0
    gbps: float = Field(description="Unidirectional GB/s a ring hop over this link can carry")


class NicInfo(Strict):
    name: str
    numa_node: int | None = None
    near_gpus: list[int] = Field(default_factory=list, description="GPUs at PIX/PXB distance: this NIC's rail")
    gpu_tiers: dict[int, str] = Field(default_factory=dict, description="PCIe tier to each GPU")


class MpsDaemon(Strict):
    """The node's MPS control daemon: GPU shares run under it with their limits, reached through these directories."""

    pipe_directory: str = Field(default="/tmp/nvidia-mps", description="CUDA_MPS_PIPE_DIRECTORY of the daemon")
    log_directory: str = Field(default="/var/log/nvidia-mps", description="CUDA_MPS_LOG_DIRECTORY of the daemon")


class NodeTopology(Strict):
    node: str
    gpu_model: str = "unknown"
    gpus: list[GpuInfo]
    links: list[GpuLink] = Field(default_factory=list, description="One entry per GPU pair a<b")
    nics: list[NicInfo] = Field(default_factory=list)
    cpus: int = 64
    memory_mb: int = 512 * 1024
    leaf: str | None = None
    spine: str | None = None
    nvlink_domain: str | None = Field(default=None, description="Multi-node NVLink domain (NVL72 clique)")
    levels: dict[str, str] = Field(
        default_factory=dict,
        description="The node's domain at each level of the site above it, bottom-up (e.g. nvlink, rack, leaf, "
        "spine, zone); empty: nvlink (when nvlink_domain is set), leaf, spine",
    )
    nic_gbps_per_gpu: float = 50.0
    labels: dict[str, str] = Field(default_factory=dict)
    features: list[str] = Field(
        default_factory=list, description="Slurm-style node features (cluster YAML, executor --features)"
    )
    source: TopologySource = "nvidia-smi"
    mps: MpsDaemon | None = Field(
        default=None, description="Set when the node runs MPS (executor --mps-pipe-dir): GPU shares are isolated"
    )
    address: str | None = Field(
        default=None, description="Where the other nodes reach this one (IP); jobs' containers resolve its name to it"
    )

    @field_validator("levels")
    @classmethod
    def _level_names(cls, v: dict[str, str]) -> dict[str, str]:
        for name, domain in v.items():
            if name in ("node", "cluster") or not re.match(LEVEL_NAME, name):
                raise ValueError(
                    f"level {name!r}: a level is a lower-case name other than node and cluster (e.g. rack, zone)"
                )
            if not domain:
                raise ValueError(f"level {name!r}: the node's domain at this level is empty")
        return v

    @model_validator(mode="after")
    def _one_clique(self) -> NodeTopology:
        """A node's GPUs that report NVLink fabric info are in one multi-node NVLink domain: GPUs that disagree mean a
        miscabled or misconfigured tray, and placement must not guess which domain the node is in."""
        seen: dict[tuple[str, int], list[int]] = {}
        for g in self.gpus:
            if g.cluster_uuid is not None and g.clique_id is not None:
                seen.setdefault((g.cluster_uuid, g.clique_id), []).append(g.index)
        if len(seen) > 1:
            parts = "; ".join(f"GPUs {gpus} in {uuid}.{clique}" for (uuid, clique), gpus in seen.items())
            raise ValueError(f"node {self.node!r}: its GPUs disagree on their NVLink clique ({parts})")
        return self


class GpuHealth(Strict):
    index: int
    healthy: bool = True
    reason: str | None = None
    nvlinks_active: int | None = None


class RankReport(Strict):
    """One job's ranks as the node itself sees them: which attempt (token) holds which of its GPUs."""

    job_id: str
    token: int
    gpus: list[int] = Field(default_factory=list)


class NodeHeartbeat(Strict):
    node: str
    ts: float
    gpus: list[GpuHealth] = Field(default_factory=list)
    engine_ok: bool = True
    engine_reason: str | None = None
    running: list[str] = Field(default_factory=list, description="Job ids with ranks running here")
    ranks: list[RankReport] = Field(
        default_factory=list, description="The ranks alive here with their token and GPUs (the node's own account)"
    )


class NodeLease(Strict):
    """A node saying "alive, and my last report still holds", in place of a heartbeat that repeats it: the full
    report (`NodeHeartbeat`) goes out when something in it changes and at least every ONEPLUS_REPORT_EVERY_S, a lease
    every heartbeat in between (Kubernetes' node Lease beside its NodeStatus). The registry takes either as liveness;
    the solver reads only the reports."""

    node: str
    ts: float
    report_ts: float = Field(description="The `ts` of the node's last full report, which this lease repeats")


class NodeReportRequest(Strict):
    """Nodes asked to send their full report with their next heartbeat: all of them when a solver starts (it keeps
    no report across a restart), one when the registry hears a lease from a node it declared lost (its ranks must
    be known again before it is offered)."""

    nodes: list[str] | None = Field(None, description="The nodes asked; none named: every node")


NodeStatus = Literal["ready", "lost", "draining", "cordoned", "unhealthy"]


class NodeRecord(Strict):
    """What the topology registry keeps per node in the `topology` KV bucket."""

    topology: NodeTopology
    status: NodeStatus = "ready"
    last_heartbeat: float = 0.0
    cordoned: bool = False
    draining: bool = False
    reason: str | None = None
    unhealthy_gpus: list[int] = Field(default_factory=list)
    engine_ok: bool = True

    @property
    def schedulable(self) -> bool:
        return self.status == "ready" and not self.cordoned and not self.draining and self.engine_ok
