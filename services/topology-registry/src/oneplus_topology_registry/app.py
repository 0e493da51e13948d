"""topology-registry: the cluster model in the `topology` KV bucket.

Consumes node topology reports and heartbeats, marks nodes lost after missed heartbeats and back
when they return, serves drain/cordon, and emits `topology.changed` whenever placement must know.

The working set is in memory: every node's record, read once from the `topology` bucket at start and kept current
from the reports and heartbeats this service consumes itself. The bucket is written only when a record changes in
a way others can see (status, health, flags, topology); a heartbeat that changes nothing but its time updates
memory, and the time is persisted at most every `persist_heartbeat_s` per node in the `node_heartbeats` bucket,
which no other service watches (in the `topology` bucket, 512 nodes' times every 30 s woke the solver, the intake
and the preemption service to parse 512 unchanged boards). A restarted registry counts every node it reads (but a
lost one) as seen at its start, so nobody is declared lost for a heartbeat time the buckets had not caught up with.
The loss detector and `oneplus nodes` read memory; the `topology` bucket is for the solver and the intake.

`build(settings)` makes the service; `python -m oneplus_topology_registry` runs one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from faststream.nats import NatsMessage
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError
from nats.js.kv import KeyValue
from oneplus_bus.deadletter import _is_poison, _publish_dead_letter
from oneplus_bus.ledger import latest_values
from oneplus_bus.service import OneplusService, OpsError
from oneplus_bus.settings import BusSettings
from oneplus_contracts import NodeHeartbeat, NodeLease, NodeRecord, NodeReportRequest, NodeTopology, subjects
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from .health import apply_heartbeat, heartbeat_due, record_changed, status_of, summary_changed
from .settings import RegistrySettings

__all__ = ["Registry", "RegistrySettings", "build", "build_registry", "main"]

log = logging.getLogger("oneplus.registry")

DEFAULT_PAGE = 100  # nodes per `node-list` page when the request names no limit
MAX_PAGE = 1000
REPLY_MARGIN = 4096  # bytes kept free in a reply for its envelope
HEARTBEAT_QUEUE = "topology-registry"  # replicas share the heartbeats: each one reaches one replica
OLD_HEARTBEAT_CONSUMER = "topology-registry-heartbeats"


class NodeStore(Protocol):
    """Where node records are kept for the rest of the platform (the `topology` KV bucket), and the nodes'
    heartbeat times for the registry's own restart (the `node_heartbeats` bucket)."""

    async def load(self) -> list[NodeRecord]: ...

    async def put(self, rec: NodeRecord) -> None: ...

    async def load_beats(self) -> dict[str, float]: ...

    async def put_beat(self, node: str, ts: float) -> None: ...


Publish = Callable[[str, bytes], Awaitable[None]]


class KvNodeStore:
    def __init__(self, js: JetStreamContext, kv: KeyValue, beats: KeyValue) -> None:
        self.js = js
        self.kv = kv
        self.beats = beats
        self.writes = 0

    async def load(self) -> list[NodeRecord]:
        return [NodeRecord.model_validate_json(v) for v in await latest_values(self.js, subjects.TOPOLOGY_KV)]

    async def put(self, rec: NodeRecord) -> None:
        await self.kv.put(rec.topology.node, rec.model_dump_json().encode())
        self.writes += 1

    async def load_beats(self) -> dict[str, float]:
        beats: dict[str, float] = {}
        for value in await latest_values(self.js, subjects.HEARTBEATS_KV):
            try:
                row = json.loads(value)
                beats[str(row["node"])] = float(row["last_heartbeat"])
            except (ValueError, KeyError, TypeError):
                continue  # a time that cannot be read is one the topology record's own time stands in for
        return beats

    async def put_beat(self, node: str, ts: float) -> None:
        await self.beats.put(node, json.dumps({"node": node, "last_heartbeat": ts}).encode())


class Registry:
    """The registry's behaviour over its working set; the bus is reached through `store` and `publish` only."""

    def __init__(
        self,
        store: NodeStore | None = None,
        publish: Publish | None = None,
        settings: RegistrySettings | None = None,
        *,
        clock: Callable[[], float] = time.time,
        max_payload: Callable[[], int] = lambda: 1024 * 1024,
    ) -> None:
        self.store = store
        self.publish = publish
        # Asks one node for its full report (a NodeReportRequest, core NATS); set by `build`.
        self.ask_report: Callable[[str], Awaitable[None]] | None = None
        self.settings = settings or RegistrySettings()
        self.clock = clock
        self.max_payload = max_payload
        self.records: dict[str, NodeRecord] = {}  # the working set: every node as the registry knows it now
        self.stored: dict[str, NodeRecord] = {}  # what the bucket holds, as last written or read
        # node → the newest heartbeat time stored in either bucket (a record written on change carries its time too)
        self.persisted_beat: dict[str, float] = {}
        self.newest_beat: dict[str, float] = {}  # node → the `ts` (node's clock) of the newest heartbeat folded
        self.ready = asyncio.Event()
        self._locks: dict[str, asyncio.Lock] = {}
        # Node → the record last announced, for the nodes whose last write was not answered: the loss detector writes
        # memory's record again (a node lost while the bus was away may never be heard again, and then nothing else
        # would write it), and the commit that writes it announces what changed since that record.
        self._unwritten: dict[str, NodeRecord | None] = {}

    @property
    def unwritten(self) -> set[str]:
        """The nodes whose last write was not answered."""
        return set(self._unwritten)

    def _store(self) -> NodeStore:
        assert self.store is not None, "the registry's store is attached on start"
        return self.store

    async def bootstrap(self) -> None:
        """Read the bucket once. Every node but a lost one counts as seen now: the stored heartbeat can be
        `persist_heartbeat_s` old, and a restart must not declare anyone lost for that."""
        now = self.clock()
        store = self._store()
        self.persisted_beat = await store.load_beats()
        for rec in await store.load():
            node = rec.topology.node
            self.stored[node] = rec
            seen = self.persisted_beat[node] = max(rec.last_heartbeat, self.persisted_beat.get(node, 0.0))
            rec = rec.model_copy(update={"last_heartbeat": seen if rec.status == "lost" else max(seen, now)})
            self.records.setdefault(node, rec)
        self.ready.set()
        log.info("registry: %d nodes read from the %s bucket", len(self.records), subjects.TOPOLOGY_KV)

    async def commit(self, rec: NodeRecord, before: NodeRecord | None, reason: str) -> None:
        """Take `rec` into memory; write the bucket if it changed (or its heartbeat is due); say so if it matters."""
        node = rec.topology.node
        self.records[node] = rec
        if node in self._unwritten:
            # A change whose write failed was not announced either (the solver requeues a lost node's gangs on its
            # `lost` announcement): say what changed since the last record announced.
            before = self._unwritten[node]
        if self._must_write(node) or self._beat_due(node):
            async with self._locks.setdefault(node, asyncio.Lock()):
                # A write of this node may have landed while this one waited; writes of one node land in order.
                if self._must_write(node):
                    latest = self.records[node]
                    try:
                        await self._store().put(latest)
                    except BaseException:
                        # Not answered is not refused: nats-py keeps the write in its buffer while it reconnects
                        # and sends it once the server is back. Whichever record the bucket holds then, the next
                        # commit writes memory's (a node back after an outage was left `lost` in the bucket).
                        self.stored.pop(node, None)
                        self._unwritten.setdefault(node, before)
                        raise
                    self.stored[node] = latest
                    self._unwritten.pop(node, None)
                    self.persisted_beat[node] = max(self.persisted_beat.get(node, 0.0), latest.last_heartbeat)
                if self._beat_due(node):
                    ts = self.records[node].last_heartbeat
                    await self._store().put_beat(node, ts)
                    self.persisted_beat[node] = ts
        if before is None or summary_changed(before, rec):
            await self.announce(rec, before, reason)

    def _must_write(self, node: str) -> bool:
        rec, stored = self.records[node], self.stored.get(node)
        return stored is None or record_changed(stored, rec)

    def _beat_due(self, node: str) -> bool:
        """Whether the node's heartbeat time is old enough in the store to persist again (in `node_heartbeats`)."""
        stored = self.persisted_beat.get(node, 0.0)
        return heartbeat_due(stored, self.records[node].last_heartbeat, self.settings.persist_heartbeat_s)

    async def announce(self, rec: NodeRecord, before: NodeRecord | None, reason: str) -> None:
        if self.publish is None:
            return
        body = json.dumps({"node": rec.topology.node, "status": rec.status, "reason": reason, "ts": self.clock()})
        await self.publish(subjects.TOPOLOGY_CHANGED, body.encode())
        if rec.status == "lost" and (before is None or before.status != "lost"):
            await self.publish(subjects.node_lost(rec.topology.node), body.encode())

    def status(self, rec: NodeRecord) -> NodeRecord:
        status = status_of(rec, self.clock(), self.settings.lost_after_s)
        return rec if status == rec.status else rec.model_copy(update={"status": status})

    async def on_topology(self, topo: NodeTopology) -> None:
        await self.ready.wait()
        before = self.records.get(topo.node)
        rec = NodeRecord(topology=topo, last_heartbeat=self.clock())
        if before is not None:
            rec = rec.model_copy(update={"cordoned": before.cordoned, "draining": before.draining})
        await self.commit(self.status(rec), before, "topology reported")

    async def on_heartbeat(self, hb: NodeHeartbeat) -> None:
        await self.ready.wait()
        before = self.records.get(hb.node)
        if before is None:
            return  # a heartbeat before the topology report: the report will follow
        newest = self.newest_beat.get(hb.node)
        if newest is not None and hb.ts < newest:
            # A redelivered or replayed heartbeat must not set the node's clock back: the loss detector would call
            # the node lost, the next heartbeat ready again, and every flap ends the gangs placed there meanwhile.
            log.info("heartbeat from %s older than one already folded (%.3f < %.3f): ignored", hb.node, hb.ts, newest)
            return
        self.newest_beat[hb.node] = hb.ts
        log.debug("heartbeat from %s", hb.node)  # one a node every few seconds: never at INFO
        await self.commit(self.status(apply_heartbeat(before, hb)), before, "heartbeat")

    async def on_lease(self, lease: NodeLease) -> None:
        """Alive, the last report still holds: only the node's clock moves. A node declared lost comes back on a
        full report only, which it is asked for here: the solver forgot its ranks when it was lost, and must know
        them again before its GPUs are offered."""
        await self.ready.wait()
        before = self.records.get(lease.node)
        if before is None or lease.ts <= before.last_heartbeat:
            return  # unknown yet (its report follows), or not newer than what was folded: no clock set back
        if before.status == "lost":
            if self.ask_report is not None:
                await self.ask_report(lease.node)
            return
        await self.commit(self.status(before.model_copy(update={"last_heartbeat": lease.ts})), before, "lease")

    async def check_lost(self) -> None:
        """One pass of the loss detector, over memory: only time moves a status between commits, so only a node
        silent past the threshold and not yet lost is looked at (every node each second was 0.01 of a core at
        4,096 nodes)."""
        for node in sorted(self._unwritten):
            rec = self.records[node]
            if not await self._written(rec, rec, f"status {rec.status}"):
                return  # the bus is still away: the next pass
        now = self.clock()
        silent_since = now - self.settings.lost_after_s
        for rec in [r for r in self.records.values() if 0 < r.last_heartbeat < silent_since and r.status != "lost"]:
            if self.records.get(rec.topology.node) is not rec:
                continue  # a heartbeat came while an earlier node's write waited (a bus coming back): alive
            status = status_of(rec, now, self.settings.lost_after_s)
            if status != rec.status:
                log.warning("node %s: %s -> %s", rec.topology.node, rec.status, status)
                if not await self._written(rec.model_copy(update={"status": status}), rec, f"status {status}"):
                    return

    async def _written(self, rec: NodeRecord, before: NodeRecord, reason: str) -> bool:
        """Commit for the loss detector: a write the bus does not answer is a warning, not a failed loop, and is
        tried again on the next pass (`unwritten`)."""
        try:
            await self.commit(rec, before, reason)
        except Exception as exc:
            log.warning("node %s: %s not stored yet (%s: %s); written again on the next pass", rec.topology.node,
                        rec.status, type(exc).__name__, exc)  # fmt: skip
            return False
        return True

    async def loss_detector(self) -> None:
        await self.ready.wait()
        while True:
            await asyncio.sleep(min(1.0, self.settings.lost_after_s / 4))
            await self.check_lost()

    async def set_flags(self, node: str, **flags: bool) -> NodeRecord:
        await self.ready.wait()
        before = self.records.get(node)
        if before is None:
            raise OpsError(f"no node {node!r}", 404)
        rec = self.status(before.model_copy(update=flags))
        await self.commit(rec, before, ", ".join(f"{k}={v}" for k, v in flags.items()))
        return rec

    def nodes(self) -> list[NodeRecord]:
        return [self.records[n] for n in sorted(self.records)]

    def node_list(self, payload: dict[str, Any]) -> Any:
        """Without `limit` or `cursor`: every node, as before, when they fit in one reply (an error saying to page
        when they do not). With them: `{"nodes": [...], "next": cursor or null}`, nodes named after `cursor` in name
        order, at most `limit` and never more than one reply holds."""
        budget = self.max_payload() - REPLY_MARGIN
        if "limit" not in payload and "cursor" not in payload:
            rows = [r.model_dump(mode="json") for r in self.nodes()]
            size = len(json.dumps(rows))
            if size > budget:
                raise OpsError(
                    f"{len(rows)} nodes ({size} bytes) do not fit in one reply of at most {budget} bytes: "
                    "ask for pages with 'limit' and 'cursor'",
                    413,
                )
            return rows
        try:
            limit = int(payload.get("limit") or DEFAULT_PAGE)
        except (TypeError, ValueError) as exc:
            raise OpsError(f"limit must be a whole number: {exc}") from exc
        if limit < 1:
            raise OpsError(f"limit must be at least 1, got {limit}")
        limit = min(limit, MAX_PAGE)
        cursor = payload.get("cursor")
        if cursor is not None and not isinstance(cursor, str):
            raise OpsError("cursor must be the 'next' of the previous page (a string)")
        names = sorted(n for n in self.records if cursor is None or n > cursor)
        items: list[dict[str, Any]] = []
        size = 0
        for name in names[:limit]:
            row = self.records[name].model_dump(mode="json")
            row_size = len(json.dumps(row)) + 2
            if items and size + row_size > budget:
                break
            items.append(row)
            size += row_size
        more = len(items) < len(names)
        return {"nodes": items, "next": items[-1]["topology"]["node"] if more and items else None}


class RegistryMetrics(Collector):
    """Read from the working set when scraped (nothing per heartbeat): heartbeat age, status and GPU health."""

    def __init__(self, reg: Registry) -> None:
        self.reg = reg

    def collect(self) -> Any:
        now = self.reg.clock()
        age = GaugeMetricFamily(
            "oneplus_node_heartbeat_age_seconds",
            "Seconds since the node's executor last sent a heartbeat (lost after ONEPLUS_NODE_LOST_AFTER_S)",
            labels=["node"],
        )
        status = GaugeMetricFamily(
            "oneplus_node_status",
            "1 for the node's status (ready, cordoned, draining, unhealthy, lost)",
            labels=["node", "status"],
        )
        healthy = GaugeMetricFamily(
            "oneplus_gpu_healthy",
            "1 when the node's last heartbeat reported the GPU healthy, else 0",
            labels=["node", "gpu"],
        )
        for rec in list(self.reg.records.values()):
            node = rec.topology.node
            if rec.last_heartbeat:
                age.add_metric([node], max(0.0, now - rec.last_heartbeat))
            status.add_metric([node, rec.status], 1)
            for g in rec.topology.gpus:
                healthy.add_metric([node, str(g.index)], 1 if g.healthy else 0)
        return [age, status, healthy]


def build(
    settings: BusSettings | None = None, registry_settings: RegistrySettings | None = None
) -> tuple[OneplusService, Registry]:
    """The registry service (consumers, ops endpoints, loss detector) around a `Registry` over the bus."""
    svc = OneplusService("topology-registry", "Keeps the cluster topology model and node health", settings)
    reg = Registry(settings=registry_settings or RegistrySettings.from_env(), max_payload=lambda: svc.nc.max_payload)
    svc.metrics.register(RegistryMetrics(reg))

    async def publish(subject: str, body: bytes) -> None:
        await svc.js.publish(subject, body, stream=subjects.NODES_STREAM)

    async def ask_report(node: str) -> None:
        await svc.nc.publish(subjects.NODE_REPORT_REQUEST, NodeReportRequest(nodes=[node]).model_dump_json().encode())

    async def start() -> None:
        reg.ask_report = ask_report
        reg.store = KvNodeStore(svc.js, svc.kv[subjects.TOPOLOGY_KV], svc.kv[subjects.HEARTBEATS_KV])
        reg.publish = publish
        await reg.bootstrap()

    svc.on_start(start)
    svc.background(reg.loss_detector)

    @svc.durable_subscriber(
        "oneplus.node.*.topology",
        stream=subjects.NODES_STREAM,
        consumer="topology-registry-reports",
        title="node topology reports",
    )
    async def on_topology(msg: NatsMessage) -> None:
        await reg.on_topology(NodeTopology.model_validate_json(msg.body))

    def folding(what: str, fold: Callable[[bytes], Awaitable[None]]) -> Callable[[Msg], Awaitable[None]]:
        """A core subscription's callback for heartbeats or leases: a malformed one is dead-lettered; one whose
        bucket write was refused (JetStream electing a leader, no answer) is in memory already, and the next one,
        seconds away, writes the bucket, which still differs from memory."""

        async def on_msg(msg: Msg) -> None:
            try:
                await fold(msg.data)
            except Exception as exc:
                if _is_poison(exc):
                    await _publish_dead_letter({"broker": svc.broker}, msg, exc, 1)
                else:
                    log.warning("%s on %s not stored (%s: %s): the next one will be", what, msg.subject,
                                type(exc).__name__, exc)  # fmt: skip

        return on_msg

    on_heartbeat = folding("heartbeat", lambda data: reg.on_heartbeat(NodeHeartbeat.model_validate_json(data)))
    on_lease = folding("lease", lambda data: reg.on_lease(NodeLease.model_validate_json(data)))

    async def retire_stored_heartbeats() -> None:
        """Until 2026-12 heartbeats were stored in ONEPLUS_NODES and read on a durable consumer: an upgraded
        registry deletes that consumer and the heartbeats the stream still holds, once."""
        try:
            await svc.js.delete_consumer(subjects.NODES_STREAM, OLD_HEARTBEAT_CONSUMER)
        except NotFoundError:
            return
        await svc.js.purge_stream(subjects.NODES_STREAM, subject=subjects.node_heartbeat("*"))
        log.info("heartbeats are core NATS now: consumer %s and the stored heartbeats removed", OLD_HEARTBEAT_CONSUMER)

    async def subscribe_heartbeats() -> None:
        # The hot path at scale (4,096 nodes every 5 s are 820 a second): a core NATS queue subscription, not a
        # JetStream consumer. A heartbeat is news only until the next one, so the server neither stores it nor
        # waits for an acknowledgement, and no span, metrics or log line is made per heartbeat.
        await retire_stored_heartbeats()
        subs.append(await svc.nc.subscribe(subjects.node_heartbeat("*"), queue=HEARTBEAT_QUEUE, cb=on_heartbeat))
        subs.append(await svc.nc.subscribe(subjects.node_lease("*"), queue=HEARTBEAT_QUEUE, cb=on_lease))

    async def stop() -> None:
        for sub in subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    subs: list[Any] = []
    svc.on_start(subscribe_heartbeats)
    svc.on_stop(stop)

    async def set_flags(payload: dict[str, Any], **flags: bool) -> dict[str, Any]:
        node = str(payload.get("node") or "")
        if not node:
            raise OpsError("the request needs a 'node'")
        rec = await reg.set_flags(node, **flags)
        return {"node": node, "status": rec.status, "cordoned": rec.cordoned, "draining": rec.draining}

    @svc.ops("node-list", subjects.OPS_NODE_LIST)
    async def node_list(payload: dict[str, Any], headers: dict[str, str]) -> Any:
        await reg.ready.wait()
        return reg.node_list(payload)

    @svc.ops("node-drain", subjects.OPS_NODE_DRAIN)
    async def node_drain(payload: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
        return await set_flags(payload, draining=bool(payload.get("drain", True)))

    @svc.ops("node-cordon", subjects.OPS_NODE_CORDON)
    async def node_cordon(payload: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
        return await set_flags(payload, cordoned=bool(payload.get("cordon", True)))

    @svc.ops("node-uncordon", subjects.OPS_NODE_UNCORDON)
    async def node_uncordon(payload: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
        return await set_flags(payload, cordoned=False, draining=False)

    return svc, reg


def build_registry(
    settings: BusSettings | None = None, registry_settings: RegistrySettings | None = None
) -> OneplusService:
    return build(settings, registry_settings)[0]


def main() -> None:
    build_registry(registry_settings=RegistrySettings.load_or_exit()).run()
