"""topology-registry: the cluster model in the `topology` KV bucket.

Consumes node topology reports and heartbeats, marks nodes lost after missed heartbeats and back
when they return, serves drain/cordon, and emits `topology.changed` whenever placement must know.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from typing import Any

from faststream.nats import NatsMessage
from nats.js.api import DeliverPolicy
from nats.js.errors import KeyNotFoundError
from oneplus_bus.ledger import latest_values
from oneplus_bus.service import OneplusService, OpsError
from oneplus_contracts import NodeHeartbeat, NodeRecord, NodeTopology, subjects

from .health import apply_heartbeat, status_of, summary_changed

log = logging.getLogger("oneplus.registry")

svc = OneplusService("topology-registry", "Keeps the cluster topology model and node health")
broker = svc.broker
app = svc.app
LOST_AFTER_S = float(os.environ.get("ONEPLUS_NODE_LOST_AFTER_S", "10"))
_locks: dict[str, asyncio.Lock] = {}


def _lock(node: str) -> asyncio.Lock:
    return _locks.setdefault(node, asyncio.Lock())


async def get_node(node: str) -> tuple[NodeRecord | None, int]:
    try:
        entry = await svc.kv[subjects.TOPOLOGY_KV].get(node)
    except KeyNotFoundError:
        return None, 0
    if entry.value is None:
        return None, 0
    return NodeRecord.model_validate_json(entry.value), entry.revision or 0


async def put_node(rec: NodeRecord, before: NodeRecord | None, reason: str) -> None:
    await svc.kv[subjects.TOPOLOGY_KV].put(rec.topology.node, rec.model_dump_json().encode())
    if before is None or summary_changed(before, rec):
        body = {"node": rec.topology.node, "status": rec.status, "reason": reason, "ts": time.time()}
        await svc.js.publish(subjects.TOPOLOGY_CHANGED, json.dumps(body).encode(), stream=subjects.NODES_STREAM)
        if rec.status == "lost" and (before is None or before.status != "lost"):
            await svc.js.publish(
                subjects.node_lost(rec.topology.node), json.dumps(body).encode(), stream=subjects.NODES_STREAM
            )


@svc.durable_subscriber(
    "oneplus.node.*.topology",
    stream=subjects.NODES_STREAM,
    consumer="topology-registry-reports",
    title="node topology reports",
)
async def on_topology(msg: NatsMessage) -> None:
    topo = NodeTopology.model_validate_json(msg.body)
    async with _lock(topo.node):
        before, _ = await get_node(topo.node)
        rec = NodeRecord(topology=topo, last_heartbeat=time.time())
        if before is not None:
            rec = rec.model_copy(update={"cordoned": before.cordoned, "draining": before.draining})
        rec = rec.model_copy(update={"status": status_of(rec, time.time(), LOST_AFTER_S)})
        await put_node(rec, before, "topology reported")


@svc.durable_subscriber(
    "oneplus.node.*.heartbeat",
    stream=subjects.NODES_STREAM,
    consumer="topology-registry-heartbeats",
    title="node heartbeats",
    deliver_policy=DeliverPolicy.NEW,
    max_deliver=2,
    ack_wait=10,
)
async def on_heartbeat(msg: NatsMessage) -> None:
    hb = NodeHeartbeat.model_validate_json(msg.body)
    async with _lock(hb.node):
        before, _ = await get_node(hb.node)
        if before is None:
            return  # a heartbeat before the topology report: the report will follow
        rec = apply_heartbeat(before, hb)
        rec = rec.model_copy(update={"status": status_of(rec, time.time(), LOST_AFTER_S)})
        await put_node(rec, before, "heartbeat")


async def all_nodes() -> list[NodeRecord]:
    return [NodeRecord.model_validate_json(v) for v in await latest_values(svc.js, subjects.TOPOLOGY_KV)]


@svc.background
async def loss_detector() -> None:
    while True:
        await asyncio.sleep(min(1.0, LOST_AFTER_S / 4))
        now = time.time()
        for rec in await all_nodes():
            status = status_of(rec, now, LOST_AFTER_S)
            if status != rec.status:
                async with _lock(rec.topology.node):
                    fresh, _ = await get_node(rec.topology.node)
                    if fresh is None:
                        continue
                    status = status_of(fresh, time.time(), LOST_AFTER_S)
                    if status != fresh.status:
                        log.warning("node %s: %s -> %s", fresh.topology.node, fresh.status, status)
                        await put_node(fresh.model_copy(update={"status": status}), fresh, f"status {status}")


async def _set_flag(payload: dict[str, Any], **flags: bool) -> dict[str, Any]:
    node = str(payload.get("node") or "")
    if not node:
        raise OpsError("the request needs a 'node'")
    async with _lock(node):
        before, _ = await get_node(node)
        if before is None:
            raise OpsError(f"no node {node!r}", 404)
        rec = before.model_copy(update=flags)
        rec = rec.model_copy(update={"status": status_of(rec, time.time(), LOST_AFTER_S)})
        await put_node(rec, before, ", ".join(f"{k}={v}" for k, v in flags.items()))
    return {"node": node, "status": rec.status, "cordoned": rec.cordoned, "draining": rec.draining}


@svc.ops("node-list", subjects.OPS_NODE_LIST)
async def node_list(payload: dict[str, Any], headers: dict[str, str]) -> list[dict[str, Any]]:
    return [r.model_dump(mode="json") for r in await all_nodes()]


@svc.ops("node-drain", subjects.OPS_NODE_DRAIN)
async def node_drain(payload: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
    return await _set_flag(payload, draining=bool(payload.get("drain", True)))


@svc.ops("node-cordon", subjects.OPS_NODE_CORDON)
async def node_cordon(payload: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
    return await _set_flag(payload, cordoned=bool(payload.get("cordon", True)))


@svc.ops("node-uncordon", subjects.OPS_NODE_UNCORDON)
async def node_uncordon(payload: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
    return await _set_flag(payload, cordoned=False, draining=False)


def main() -> None:
    svc.run()
