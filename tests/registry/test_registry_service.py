"""topology-registry against real NATS: reports, heartbeats, loss and recovery, degraded NVLink, drain/cordon."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from oneplus_contracts import GpuHealth, NodeHeartbeat, NodeRecord, subjects
from oneplus_testing import Servers
from oneplus_topology.presets import load_preset

from oneplus.client import OnePlusClient
from oneplus.devstack import spawn, stop

LOST_AFTER = 1.5


@pytest.fixture
async def registry(nc: Client, servers: Servers, tmp_path: Path) -> AsyncIterator[OnePlusClient]:
    env = {
        **dict(__import__("os").environ),
        "NATS_URL": servers.nats_url,
        "REDIS_URL": servers.redis_url,
        "ONEPLUS_NODE_LOST_AFTER_S": str(LOST_AFTER),
    }
    proc = spawn([sys.executable, "-m", "oneplus_topology_registry"], tmp_path / "registry.log", env)
    try:
        async with OnePlusClient.connect(servers.nats_url) as c:
            deadline = time.monotonic() + 60
            while not [s for s in await c.services(kind="PING") if s.get("name") == "oneplus-topology-registry"]:
                assert time.monotonic() < deadline, (tmp_path / "registry.log").read_text()
                await asyncio.sleep(0.2)
            yield c
    finally:
        stop([proc])


async def report(nc: Client, node: str, preset: str = "dgx1_v100") -> None:
    topo = load_preset(preset, node).model_copy(update={"leaf": "leaf-0"})
    await nc.jetstream().publish(
        subjects.node_topology(node), topo.model_dump_json().encode(), stream=subjects.NODES_STREAM
    )


async def beat(nc: Client, node: str, gpus: list[GpuHealth] | None = None) -> None:
    hb = NodeHeartbeat(node=node, ts=time.time(), gpus=gpus or [])
    await nc.publish(subjects.node_heartbeat(node), hb.model_dump_json().encode())


async def node_record(c: OnePlusClient, node: str, until: str | None = None, timeout: float = 15.0) -> NodeRecord:
    deadline = time.monotonic() + timeout
    while True:
        recs = {r.topology.node: r for r in await c.nodes()}
        rec = recs.get(node)
        if rec is not None and (until is None or rec.status == until):
            return rec
        assert time.monotonic() < deadline, f"{node}: {rec.status if rec else 'absent'}, wanted {until}"
        await asyncio.sleep(0.1)


async def test_a_node_missing_heartbeats_is_lost_and_comes_back_when_they_return(
    registry: OnePlusClient, nc: Client
) -> None:
    changes: list[dict[str, object]] = []
    lost: list[str] = []

    async def on_change(m: Msg) -> None:
        changes.append(json.loads(m.data))

    async def on_lost(m: Msg) -> None:
        lost.append(m.subject)

    sub = await nc.subscribe(subjects.TOPOLOGY_CHANGED, cb=on_change)
    sub_lost = await nc.subscribe("oneplus.node.*.lost", cb=on_lost)
    await report(nc, "n1")
    await beat(nc, "n1")
    assert (await node_record(registry, "n1", "ready")).topology.leaf == "leaf-0"
    rec = await node_record(registry, "n1", "lost", timeout=LOST_AFTER * 6)
    assert rec.status == "lost"
    await asyncio.sleep(0.3)
    assert lost == [subjects.node_lost("n1")]
    await beat(nc, "n1")
    await node_record(registry, "n1", "ready")
    await asyncio.sleep(0.3)
    assert [c["status"] for c in changes if c["node"] == "n1"][-2:] == ["lost", "ready"]
    await sub.unsubscribe()
    await sub_lost.unsubscribe()


async def test_a_degraded_nvlink_shrinks_the_nodes_nvlink_groups(registry: OnePlusClient, nc: Client) -> None:
    from oneplus_topology.analysis import nvlink_groups

    await report(nc, "n2")
    await beat(nc, "n2")
    before = await node_record(registry, "n2", "ready")
    groups_before = nvlink_groups(before.topology)
    assert any(0 in g for g in groups_before)
    total = before.topology.gpus[0].nvlinks_total
    await beat(nc, "n2", [GpuHealth(index=0, healthy=True, nvlinks_active=total - 2)])
    deadline = time.monotonic() + 10
    while True:
        rec = await node_record(registry, "n2")
        if rec.topology.gpus[0].nvlinks_active == total - 2:
            break
        assert time.monotonic() < deadline
        await asyncio.sleep(0.1)
    assert not any(0 in g for g in nvlink_groups(rec.topology)), "GPU 0 must leave its NVLink groups"

    from rich.console import Console

    from oneplus.cli.render import nodes_table

    out = Console(width=200, record=True)
    out.print(nodes_table([rec]))
    assert "degraded GPU [0]" in out.export_text()


async def test_drain_and_cordon_through_ops_requests(registry: OnePlusClient, nc: Client) -> None:
    await report(nc, "n3")
    await beat(nc, "n3")
    await node_record(registry, "n3", "ready")
    res = await registry.node_op(subjects.OPS_NODE_CORDON, "n3")
    assert res["status"] == "cordoned"
    res = await registry.node_op(subjects.OPS_NODE_UNCORDON, "n3")
    assert res["status"] == "ready"
    res = await registry.node_op(subjects.OPS_NODE_DRAIN, "n3")
    assert res["status"] == "draining"
    from oneplus.client import PlatformError

    with pytest.raises(PlatformError, match="no node 'ghost'"):
        await registry.node_op(subjects.OPS_NODE_CORDON, "ghost")


async def test_a_malformed_report_is_dead_lettered_and_the_registry_keeps_going(
    registry: OnePlusClient, nc: Client
) -> None:
    js = nc.jetstream()
    dlq = await js.subscribe(subjects.dead_letter("oneplus.node.bad.topology"), ordered_consumer=True)
    await js.publish("oneplus.node.bad.topology", b'{"node": "bad", "gpus": "eight"}', stream=subjects.NODES_STREAM)
    msg = await dlq.next_msg(timeout=15)
    assert "gpus" in json.loads(msg.data)["reason"]
    await dlq.unsubscribe()
    await report(nc, "n4")
    await beat(nc, "n4")
    await node_record(registry, "n4", "ready")
