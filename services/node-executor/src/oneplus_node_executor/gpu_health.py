"""Per-GPU health for the heartbeat: re-read from NVML on a GPU node, so a GPU that goes bad stops getting work.

The topology report at start-up carries each GPU's health as NVML saw it then (ECC, row remapping, XIDs, NVLinks).
On a node discovered through NVML the executor reads it again every `every_s`; elsewhere (topology files, presets)
the report's health is all there is.
"""

from __future__ import annotations

from collections.abc import Callable

from oneplus_contracts import GpuHealth, GpuInfo, NodeTopology

GpuProbe = Callable[[], NodeTopology]


def heartbeat_gpus(topology: NodeTopology) -> list[GpuHealth]:
    return [
        GpuHealth(index=g.index, healthy=g.healthy, reason=g.health_reason, nvlinks_active=g.nvlinks_active)
        for g in topology.gpus
    ]


def fold_probe(topology: NodeTopology, probed: NodeTopology) -> NodeTopology:
    """The topology with each GPU's health and active NVLinks as probed; a GPU the probe lost is unhealthy."""
    seen = {g.index: g for g in probed.gpus}
    gpus: list[GpuInfo] = []
    for g in topology.gpus:
        now = seen.get(g.index)
        if now is None:
            gpus.append(g.model_copy(update={"healthy": False, "health_reason": "NVML no longer lists this GPU"}))
        else:
            update = {"healthy": now.healthy, "health_reason": now.health_reason, "nvlinks_active": now.nvlinks_active}
            gpus.append(g.model_copy(update=update))
    return topology.model_copy(update={"gpus": gpus})


def probe_failed(topology: NodeTopology, error: Exception) -> NodeTopology:
    """NVML itself cannot be read (driver gone, GPU fallen off the bus): no GPU here can be trusted with work."""
    reason = f"GPU health cannot be read: {error}"
    return topology.model_copy(
        update={"gpus": [g.model_copy(update={"healthy": False, "health_reason": reason}) for g in topology.gpus]}
    )


def health_changes(before: NodeTopology, after: NodeTopology) -> list[str]:
    """What changed, one line per GPU, for the log."""
    old = {g.index: g for g in before.gpus}
    out: list[str] = []
    for g in after.gpus:
        was = old.get(g.index)
        if was is None:
            continue
        if was.healthy != g.healthy:
            out.append(f"GPU {g.index} {'healthy again' if g.healthy else 'unhealthy: ' + str(g.health_reason)}")
        elif was.nvlinks_active != g.nvlinks_active:
            out.append(f"GPU {g.index} NVLinks active {was.nvlinks_active} → {g.nvlinks_active}")
    return out


def nvml_probe(node: str) -> GpuProbe:
    """Discovery through NVML on this host (blocking: the executor runs it in a thread)."""

    def probe() -> NodeTopology:
        from oneplus_topology.nvml import discover_node

        return discover_node(node)

    return probe
