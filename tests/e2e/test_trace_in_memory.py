"""One job is one trace across intake, placement-solver and node-executor, read from an in-memory exporter.

The services run in this process, each built by its bootstrap function from its settings and started side by side,
so a single InMemorySpanExporter sees every span; the separate-process run is checked in test_platform_e2e.
"""

from __future__ import annotations

import pytest
from nats.aio.client import Client
from oneplus_bus import telemetry
from oneplus_bus.settings import BusSettings
from oneplus_contracts import JobSpec
from oneplus_intake.app import build_intake
from oneplus_node_executor.app import create_executor
from oneplus_node_executor.runtime.simulated import SimulatedRuntime
from oneplus_placement_solver.app import build_solver
from oneplus_reservations import ReservationStore
from oneplus_testing import Servers
from oneplus_topology.presets import load_preset
from oneplus_topology_registry.app import build_registry
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from platform_fixture import wait_terminal

from oneplus.client import OnePlusClient
from oneplus.demo import wait_for_platform


async def test_spans_of_one_job_in_three_services_share_one_trace_id(
    nc: Client, servers: Servers, store: ReservationStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    await store.wipe()
    monkeypatch.setenv("NATS_URL", servers.nats_url)
    monkeypatch.setenv("REDIS_URL", servers.redis_url)
    monkeypatch.setenv("ONEPLUS_HTTP_PORT", "off")
    exporter = InMemorySpanExporter()
    telemetry.EXTRA_EXPORTERS.append(exporter)
    apps = []
    try:
        settings = BusSettings(servers.nats_url, servers.redis_url)
        # Each service builds its own tracer provider, which now also exports to `exporter`.
        services = [build_intake(settings)[0], build_registry(settings), build_solver(settings)[0]]
        executor, _ = create_executor(
            load_preset("h100_sxm_8gpu_nvswitch_nv18", "mem-0"), SimulatedRuntime(), settings, heartbeat_s=0.5
        )
        apps = [s.app for s in services] + [executor.app]
        for app in apps:
            await app.start()
        async with OnePlusClient.connect(servers.nats_url) as c:
            await wait_for_platform(c, 1, services=("intake", "topology-registry", "placement-solver", "node-executor"))
            reply = await c.submit(JobSpec(name="traced", resources={"gpus": 2}, simulate={"duration_s": 0.2}))  # type: ignore[arg-type]
            assert reply.ok and reply.job_id
            (rec,) = (await wait_terminal(c, [reply.job_id], timeout=60)).values()
        assert rec.state == "SUCCEEDED"
    finally:
        for app in reversed(apps):
            await app.stop()
        telemetry.EXTRA_EXPORTERS.remove(exporter)
    spans = exporter.get_finished_spans()
    mine = {s.context.trace_id for s in spans if s.attributes and s.attributes.get("oneplus.job_id") == rec.job_id}
    assert len(mine) == 1, f"the job's spans are spread over {len(mine)} traces"
    (trace_id,) = mine
    services = {str(s.resource.attributes["service.name"]) for s in spans if s.context.trace_id == trace_id}
    assert {"intake", "placement-solver", "node-executor"} <= services, services
