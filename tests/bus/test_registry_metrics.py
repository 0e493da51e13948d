"""The topology-registry's scrape-time metrics: heartbeat age, node status and GPU health, from its working set."""

from __future__ import annotations

from oneplus_contracts import NodeHeartbeat, NodeRecord
from oneplus_topology.presets import load_preset
from oneplus_topology_registry.app import Registry, RegistryMetrics
from prometheus_client import CollectorRegistry


async def test_heartbeat_age_and_gpu_health() -> None:
    now = [1000.0]
    reg = Registry(clock=lambda: now[0])
    reg.ready.set()

    class Store:
        async def load(self) -> list[NodeRecord]:
            return []

        async def put(self, rec: NodeRecord) -> None:
            pass

    reg.store = Store()
    topo = load_preset("h100_sxm_8gpu_nvswitch_nv18", "n0")
    await reg.on_topology(topo)
    hb = NodeHeartbeat.model_validate(
        {"node": "n0", "ts": 1000.0, "gpus": [{"index": 3, "healthy": False, "reason": "XID 79"}]}
    )
    await reg.on_heartbeat(hb)
    registry = CollectorRegistry()
    registry.register(RegistryMetrics(reg))
    now[0] = 1004.5
    assert registry.get_sample_value("oneplus_node_heartbeat_age_seconds", {"node": "n0"}) == 4.5
    assert registry.get_sample_value("oneplus_gpu_healthy", {"node": "n0", "gpu": "3"}) == 0
    assert registry.get_sample_value("oneplus_gpu_healthy", {"node": "n0", "gpu": "0"}) == 1
    assert registry.get_sample_value("oneplus_node_status", {"node": "n0", "status": "ready"}) == 1
