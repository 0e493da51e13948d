"""The intake with everything its HTTP API asks beside it: the job owner (placement-solver) and the
topology-registry, each its own process on real NATS, and a few reported nodes. For tests/intake/test_http_*.py."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
from intake_process import IntakeProcess, fresh_bus
from oneplus_contracts import subjects
from oneplus_topology.presets import load_preset

from oneplus.devstack import spawn, stop

NODES = ("gpu-0", "gpu-1")


@dataclass
class HttpPlatform:
    intake: IntakeProcess
    registry: Any

    def stop(self) -> None:
        stop([self.registry])
        self.intake.stop()

    def call(self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None) -> Any:
        return self.intake.request(method, path, body, headers)


async def start_platform(
    nats_url: str,
    redis_url: str,
    workdir: Path,
    nodes: tuple[str, ...] = NODES,
    env: dict[str, str] | None = None,
) -> HttpPlatform:
    """`env`: the intake's own variables beside NATS_URL and its port (HTTP tokens, an MLflow secret...)."""
    await fresh_bus(nats_url)
    intake = await IntakeProcess(nats_url, workdir, env=dict(env or {}), redis_url=redis_url).start(timeout=90)
    env = {
        **os.environ,
        "NATS_URL": nats_url,
        "REDIS_URL": redis_url,
        "PYTHONUNBUFFERED": "1",
        "ONEPLUS_NODE_LOST_AFTER_S": "3600",  # no executor heartbeats here: the nodes stay up all the same
    }
    registry = spawn([sys.executable, "-m", "oneplus_topology_registry"], workdir / "registry.log", env)
    platform = HttpPlatform(intake, registry)
    try:
        await report_nodes(nats_url, nodes)
    except BaseException:
        platform.stop()
        raise
    return platform


async def report_nodes(nats_url: str, nodes: tuple[str, ...], timeout: float = 60.0) -> None:
    """Report `nodes` (8 V100 each) and wait until the registry lists them all."""
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        for node in nodes:
            topo = load_preset("dgx1_v100", node).model_copy(update={"leaf": "leaf-0"})
            await js.publish(
                subjects.node_topology(node), topo.model_dump_json().encode(), stream=subjects.NODES_STREAM
            )
        deadline = time.monotonic() + timeout
        while True:
            try:
                msg = await nc.request(subjects.OPS_NODE_LIST, b'{"limit": 100}', timeout=2)
                answer = json.loads(msg.data)
                if answer.get("ok") and len(answer["result"]["nodes"]) >= len(nodes):
                    return
            except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
                pass
            assert time.monotonic() < deadline, "the topology-registry did not list the reported nodes"
            await asyncio.sleep(0.3)
    finally:
        await nc.close()
