"""topology-registry against real NATS: reports, heartbeats, loss and recovery, degraded NVLink, drain/cordon.

The registry runs in this process, built by `build(settings)`; one test runs it as `python -m
oneplus_topology_registry` to keep the entry point honest.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import nats.errors
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from oneplus_bus.settings import BusSettings
from oneplus_contracts import GpuHealth, NodeHeartbeat, NodeLease, NodeRecord, NodeReportRequest, subjects
from oneplus_testing import Servers
from oneplus_topology.presets import load_preset
from oneplus_topology_registry.app import Registry, RegistrySettings, build

from oneplus.client import OnePlusClient
from oneplus.devstack import spawn, stop

LOST_AFTER = 1.5


async def until_registry_answers(c: OnePlusClient, timeout: float = 60.0, why: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not [s for s in await c.services(kind="PING") if s.get("name") == "oneplus-topology-registry"]:
        assert time.monotonic() < deadline, why or "the registry did not answer"
        await asyncio.sleep(0.2)


@pytest.fixture
async def started(nc: Client, servers: Servers) -> AsyncIterator[Registry]:
    svc, reg = build(BusSettings(servers.nats_url, servers.redis_url), RegistrySettings(lost_after_s=LOST_AFTER))
    await svc.app.start()
    try:
        yield reg
    finally:
        await svc.app.stop()


@pytest.fixture
async def registry(started: Registry, servers: Servers) -> AsyncIterator[OnePlusClient]:
    async with OnePlusClient.connect(servers.nats_url) as c:
        await until_registry_answers(c)
        yield c


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
        recs: dict[str, NodeRecord] = {r.topology.node: r for r in await c.nodes()}
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


async def lease(nc: Client, node: str, report_ts: float = 0.0) -> None:
    await nc.publish(
        subjects.node_lease(node), NodeLease(node=node, ts=time.time(), report_ts=report_ts).model_dump_json().encode()
    )


async def test_leases_keep_a_node_ready_and_a_lost_one_comes_back_on_the_full_report_it_is_asked_for(
    registry: OnePlusClient, nc: Client
) -> None:
    """A lease moves only the node's clock. A node declared lost is forgotten by the solver (its ranks too): a lease
    from it asks it for its full report, and the report, not the lease, brings it back."""
    asked: list[NodeReportRequest] = []

    async def on_ask(m: Msg) -> None:
        asked.append(NodeReportRequest.model_validate_json(m.data))

    sub = await nc.subscribe(subjects.NODE_REPORT_REQUEST, cb=on_ask)
    await report(nc, "l1")
    await beat(nc, "l1")
    await node_record(registry, "l1", "ready")
    for _ in range(int(LOST_AFTER * 4 / 0.3)):  # twice the loss threshold on leases alone
        await lease(nc, "l1")
        await asyncio.sleep(0.3)
    assert (await node_record(registry, "l1")).status == "ready" and not asked

    await node_record(registry, "l1", "lost", timeout=LOST_AFTER * 6)
    await lease(nc, "l1")
    deadline = time.monotonic() + 10
    while not asked:
        assert time.monotonic() < deadline, "the lost node was not asked for its report"
        await asyncio.sleep(0.05)
    assert asked[0].nodes == ["l1"]
    await asyncio.sleep(0.3)
    assert (await node_record(registry, "l1")).status == "lost", "a lease does not bring a lost node back"
    await beat(nc, "l1")
    await node_record(registry, "l1", "ready")
    await sub.unsubscribe()


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


async def kv_writes(nc: Client) -> int:
    """Every put into the `topology` bucket, counted by the stream under it (nothing else writes there)."""
    info = await nc.jetstream().stream_info(f"KV_{subjects.TOPOLOGY_KV}")
    return int(info.state.last_seq or 0)


async def test_heartbeats_that_change_nothing_write_nothing_and_a_change_writes_once(
    registry: OnePlusClient, nc: Client
) -> None:
    await report(nc, "w1")
    await node_record(registry, "w1", "ready")
    await asyncio.sleep(0.2)
    assert await kv_writes(nc) == 1, "the report is written once"
    for _ in range(5):
        await beat(nc, "w1")
        await asyncio.sleep(0.05)
    rec = await node_record(registry, "w1", "ready")
    assert time.time() - rec.last_heartbeat < 1.0, "the registry's memory has the newest heartbeat"
    assert await kv_writes(nc) == 1, "heartbeats that change nothing stay in memory"
    await beat(nc, "w1", [GpuHealth(index=3, healthy=False, reason="Xid 79")])
    deadline = time.monotonic() + 10
    while (await node_record(registry, "w1")).unhealthy_gpus != [3]:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.2)
    assert await kv_writes(nc) == 2, "a GPU going bad is written once"
    await registry.node_op(subjects.OPS_NODE_CORDON, "w1")
    assert await kv_writes(nc) == 3


async def test_heartbeat_times_go_to_their_own_bucket_and_the_topology_bucket_hears_of_changes_only(
    nc: Client, servers: Servers
) -> None:
    settings = RegistrySettings(lost_after_s=LOST_AFTER, persist_heartbeat_s=0.2)
    svc, reg = build(BusSettings(servers.nats_url, servers.redis_url), settings)
    await svc.app.start()
    try:
        async with OnePlusClient.connect(servers.nats_url) as c:
            await until_registry_answers(c)
            await report(nc, "h1")
            await node_record(c, "h1", "ready")
            for _ in range(6):
                await beat(nc, "h1")
                await asyncio.sleep(0.1)
            sent = time.time()
            await node_record(c, "h1", "ready")
        js = nc.jetstream()
        beats = await js.key_value(subjects.HEARTBEATS_KV)
        deadline = time.monotonic() + 10
        while True:
            entry = await beats.get("h1")
            row = json.loads(entry.value or b"{}")
            if row.get("node") == "h1" and sent - row["last_heartbeat"] < 1.0:
                break
            assert time.monotonic() < deadline, f"no recent heartbeat time stored: {row}"
            await asyncio.sleep(0.1)
        assert await kv_writes(nc) == 1, "the topology bucket holds the report only: no heartbeat time woke a watcher"
        # What the registry reads back on a restart: a value that is no time is passed over, not a failed start.
        await beats.put("junk", b"not json")
        loaded = await reg._store().load_beats()
        assert "junk" not in loaded and sent - loaded["h1"] < 1.0
    finally:
        await svc.app.stop()


async def test_a_restarted_registry_reads_the_bucket_once_and_counts_every_node_as_seen_at_its_start(
    started: Registry, nc: Client, servers: Servers
) -> None:
    async with OnePlusClient.connect(servers.nats_url) as c:
        await until_registry_answers(c)
        await report(nc, "r1")
        await beat(nc, "r1")
        await node_record(c, "r1", "ready")
    # The bucket holds a heartbeat older than the loss threshold, as a registry persisting every 30 s leaves it.
    kv = await nc.jetstream().key_value(subjects.TOPOLOGY_KV)
    stale = started.records["r1"].model_copy(update={"last_heartbeat": time.time() - 60})
    await kv.put("r1", stale.model_dump_json().encode())
    svc2, reg2 = build(BusSettings(servers.nats_url, servers.redis_url), RegistrySettings(lost_after_s=LOST_AFTER))
    await svc2.app.start()
    try:
        await reg2.ready.wait()
        assert reg2.records["r1"].status == "ready"
        assert time.time() - reg2.records["r1"].last_heartbeat < 5, "seen at the registry's start, not 60 s ago"
        await reg2.check_lost()
        assert reg2.records["r1"].status == "ready"
    finally:
        await svc2.app.stop()


async def test_the_node_list_pages_by_limit_and_cursor(registry: OnePlusClient, nc: Client) -> None:
    names = [f"p{i:02d}" for i in range(25)]
    for n in names:
        await report(nc, n)
    deadline = time.monotonic() + 15
    while len((await registry.ops(subjects.OPS_NODE_LIST, {"limit": 1000}))["nodes"]) < len(names):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.1)
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        page = await registry.ops(subjects.OPS_NODE_LIST, {"limit": 10, "cursor": cursor})
        seen += [r["topology"]["node"] for r in page["nodes"]]
        pages += 1
        cursor = page["next"]
        if cursor is None:
            break
    assert seen == names and pages == 3


def test_a_page_never_outgrows_the_reply_and_an_unpaged_list_too_big_says_to_page() -> None:
    from oneplus_bus.service import OpsError

    reg = Registry(max_payload=lambda: 4096 + 3 * 5000)  # room for about three records of a DGX-1
    for i in range(10):
        topo = load_preset("dgx1_v100", f"n{i}")
        reg.records[topo.node] = NodeRecord(topology=topo)
    page = reg.node_list({"limit": 100})
    assert 1 <= len(page["nodes"]) <= 3 and page["next"] == page["nodes"][-1]["topology"]["node"]
    assert len(json.dumps(page)) < 4096 + 3 * 5000
    with pytest.raises(OpsError, match="ask for pages"):
        reg.node_list({})


async def test_the_registry_runs_as_a_module(nc: Client, servers: Servers, tmp_path: Path) -> None:
    env = {**os.environ, "NATS_URL": servers.nats_url, "REDIS_URL": servers.redis_url}
    proc = spawn([sys.executable, "-m", "oneplus_topology_registry"], tmp_path / "registry.log", env)
    try:
        async with OnePlusClient.connect(servers.nats_url) as c:
            await until_registry_answers(c, why=(tmp_path / "registry.log").read_text())
            await report(nc, "m1")
            await node_record(c, "m1", "ready")
    finally:
        stop([proc])


async def test_a_malformed_heartbeat_is_dead_lettered(registry: OnePlusClient, nc: Client) -> None:
    js = nc.jetstream()
    dlq = await js.subscribe(subjects.dead_letter("oneplus.node.bad.heartbeat"), ordered_consumer=True)
    await nc.publish("oneplus.node.bad.heartbeat", b'{"node": "bad", "ts": "yesterday"}')
    msg = await dlq.next_msg(timeout=15)
    assert "ts" in json.loads(msg.data)["reason"]
    await dlq.unsubscribe()


async def test_a_heartbeat_the_bucket_refuses_while_jetstream_elects_is_not_dead_lettered(
    started: Registry, registry: OnePlusClient, nc: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 503 on the bucket write of a heartbeat (a stream leader being elected) drops that heartbeat with a warning:
    its news is in memory and the next heartbeat stores it. Dead-lettering it would flag a loss that is none."""
    import nats.js.errors

    await report(nc, "t1")
    await beat(nc, "t1")
    await node_record(registry, "t1", "ready")
    store = started._store()
    real_put = store.put
    refused = 0

    async def put(rec: NodeRecord) -> None:
        nonlocal refused
        if refused < 1 and rec.topology.node == "t1":
            refused += 1
            raise nats.js.errors.ServiceUnavailableError()
        await real_put(rec)

    monkeypatch.setattr(store, "put", put)
    js = nc.jetstream()
    dlq = await js.subscribe(subjects.dead_letter(subjects.node_heartbeat("t1")), ordered_consumer=True)
    kv = await js.key_value(subjects.TOPOLOGY_KV)
    bad = [GpuHealth(index=3, healthy=False, reason="Xid 79")]
    await beat(nc, "t1", bad)  # its write refused
    deadline = time.monotonic() + 15
    while refused < 1:
        assert time.monotonic() < deadline, "the heartbeat was not delivered"
        await asyncio.sleep(0.05)
    await beat(nc, "t1", bad)  # the next heartbeat stores what the bucket missed
    while NodeRecord.model_validate_json((await kv.get("t1")).value or b"").unhealthy_gpus != [3]:
        assert time.monotonic() < deadline, "the next heartbeat did not store the GPU's failure"
        await asyncio.sleep(0.05)
    with pytest.raises(nats.errors.TimeoutError):
        await dlq.next_msg(timeout=1.0)
    await dlq.unsubscribe()


class _MemoryStore:
    def __init__(self) -> None:
        self.records: dict[str, NodeRecord] = {}
        self.beats: dict[str, float] = {}
        self.puts = 0

    async def load(self) -> list[NodeRecord]:
        return list(self.records.values())

    async def put(self, rec: NodeRecord) -> None:
        self.records[rec.topology.node] = rec
        self.puts += 1

    async def load_beats(self) -> dict[str, float]:
        return dict(self.beats)

    async def put_beat(self, node: str, ts: float) -> None:
        self.beats[node] = ts


async def test_a_heartbeat_time_is_persisted_apart_from_the_record_the_other_services_watch() -> None:
    """Every `persist_heartbeat_s` a node's heartbeat time is stored, in the `node_heartbeats` bucket: written into
    the `topology` record, 512 nodes' times every 30 s woke the solver, the intake and the preemption service to
    parse 512 unchanged boards, in a wave that took 4-7% of a burst's CPU (docs/fleet.md)."""
    now = [1000.0]
    store = _MemoryStore()
    reg = Registry(store, None, RegistrySettings(lost_after_s=100.0, persist_heartbeat_s=30.0), clock=lambda: now[0])
    await reg.bootstrap()
    await reg.on_topology(load_preset("dgx1_v100", "r1").model_copy(update={"leaf": "leaf-0"}))
    assert store.puts == 1 and store.beats == {}, "the report is the record's one write; its time is in it"
    for ts in (1005.0, 1010.0, 1029.0):
        await reg.on_heartbeat(NodeHeartbeat(node="r1", ts=ts))
    assert store.beats == {}, "not due before persist_heartbeat_s"
    await reg.on_heartbeat(NodeHeartbeat(node="r1", ts=1031.0))
    assert store.beats == {"r1": 1031.0}
    for ts in (1040.0, 1060.0, 1062.0):
        await reg.on_heartbeat(NodeHeartbeat(node="r1", ts=ts))
    assert store.beats == {"r1": 1062.0}, "again once 30 s have passed since the stored time"
    assert store.puts == 1, "a heartbeat that changes nothing but the time never rewrites the topology record"
    await reg.on_heartbeat(NodeHeartbeat(node="r1", ts=1063.0, gpus=[GpuHealth(index=3, healthy=False)]))
    assert store.puts == 2 and store.records["r1"].unhealthy_gpus == [3], "a change is written at once"


async def test_a_restarted_registry_takes_a_lost_nodes_newest_time_from_either_bucket() -> None:
    store = _MemoryStore()
    topo = load_preset("dgx1_v100", "gone").model_copy(update={"leaf": "leaf-0"})
    store.records["gone"] = NodeRecord(topology=topo, last_heartbeat=900.0, status="lost")
    store.beats["gone"] = 950.0  # persisted after the record's last change, before the node went silent
    store.records["up"] = NodeRecord(topology=topo.model_copy(update={"node": "up"}), last_heartbeat=900.0)
    reg = Registry(store, None, RegistrySettings(lost_after_s=10.0), clock=lambda: 2000.0)
    await reg.bootstrap()
    assert reg.records["gone"].last_heartbeat == 950.0 and reg.records["gone"].status == "lost"
    assert reg.records["up"].last_heartbeat == 2000.0, "a node not lost counts as seen at the registry's start"


async def test_a_redelivered_older_heartbeat_does_not_flap_the_node_lost() -> None:
    """A heartbeat delivered again after a newer one (a redelivery after a failed write, an outbox replay) must not
    set the node's clock back: the loss detector would call it lost and end the gangs placed there, and the next
    heartbeat would bring it back for the next placement, again and again (seen in the multi-host lab run)."""
    now = [1000.0]
    published: list[str] = []

    async def publish(subject: str, body: bytes) -> None:
        published.append(subject)

    reg = Registry(_MemoryStore(), publish, RegistrySettings(lost_after_s=LOST_AFTER), clock=lambda: now[0])
    await reg.bootstrap()
    await reg.on_topology(load_preset("dgx1_v100", "r1").model_copy(update={"leaf": "leaf-0"}))
    await reg.on_heartbeat(NodeHeartbeat(node="r1", ts=1000.0))
    now[0] = 1001.0
    await reg.on_heartbeat(NodeHeartbeat(node="r1", ts=1001.0))
    await reg.on_heartbeat(NodeHeartbeat(node="r1", ts=998.0))  # the old one, delivered again
    await reg.check_lost()
    assert reg.records["r1"].status == "ready" and reg.records["r1"].last_heartbeat == 1001.0
    assert subjects.node_lost("r1") not in published
    now[0] = 1001.0 + LOST_AFTER + 0.1  # silence past the limit is still a loss
    await reg.check_lost()
    assert reg.records["r1"].status == "lost" and published.count(subjects.node_lost("r1")) == 1


async def test_a_node_heard_while_the_loss_detector_waits_on_a_write_is_not_declared_lost() -> None:
    """A bus coming back after an outage longer than the threshold: the detector finds every node silent, and its
    first write waits on the bus while the nodes' heartbeats arrive. A node heard meanwhile is alive; writing the
    record the detector read before, marked lost, put its old time back (seen in the chaos run: the node heard 10 ms
    earlier declared lost)."""
    now = [1000.0]
    store = _MemoryStore()
    reg = Registry(store, None, RegistrySettings(lost_after_s=10.0), clock=lambda: now[0])
    await reg.bootstrap()
    for node in ("s1", "s2"):
        await reg.on_topology(load_preset("dgx1_v100", node).model_copy(update={"leaf": "leaf-0"}))
        await reg.on_heartbeat(NodeHeartbeat(node=node, ts=1000.0))
    now[0] = 1020.0  # both silent past the threshold
    real_put = store.put

    async def slow_put(rec: NodeRecord) -> None:
        if rec.topology.node == "s1" and rec.status == "lost":
            await reg.on_heartbeat(NodeHeartbeat(node="s2", ts=1019.5))  # s2 heard while s1's write waits
        await real_put(rec)

    store.put = slow_put  # type: ignore[method-assign]
    await reg.check_lost()
    assert reg.records["s1"].status == "lost"
    assert reg.records["s2"].status == "ready" and reg.records["s2"].last_heartbeat == 1019.5


async def test_a_write_not_answered_that_lands_later_is_overwritten_when_the_node_comes_back() -> None:
    """The chaos test's NATS outage: the detector's `lost` write timed out, nats-py sent it once the server was back,
    and the node's next heartbeat changed nothing the registry believed stored, so the bucket kept `lost` for good
    (the solver never offered the node's GPUs again)."""
    now = [1000.0]
    store = _MemoryStore()
    reg = Registry(store, None, RegistrySettings(lost_after_s=10.0), clock=lambda: now[0])
    await reg.bootstrap()
    await reg.on_topology(load_preset("dgx1_v100", "t1").model_copy(update={"leaf": "leaf-0"}))
    await reg.on_heartbeat(NodeHeartbeat(node="t1", ts=1000.0))
    real_put = store.put

    async def put_then_time_out(rec: NodeRecord) -> None:
        await real_put(rec)  # it lands ...
        raise nats.errors.TimeoutError  # ... but the answer never came

    store.put = put_then_time_out  # type: ignore[method-assign]
    now[0] = 1020.0
    await reg.check_lost()  # a warning, not a failed loop
    assert store.records["t1"].status == "lost" and reg.unwritten == {"t1"}
    store.put = real_put  # type: ignore[method-assign]
    await reg.on_heartbeat(NodeHeartbeat(node="t1", ts=1020.5))
    assert reg.records["t1"].status == "ready"
    assert store.records["t1"].status == "ready", "the bucket holds what memory holds"


async def test_a_loss_the_bus_did_not_take_is_written_again_on_the_next_pass() -> None:
    """A node that died while the bus was away is never heard again: nothing but the loss detector writes it lost."""
    now = [1000.0]
    store = _MemoryStore()
    reg = Registry(store, None, RegistrySettings(lost_after_s=10.0), clock=lambda: now[0])
    await reg.bootstrap()
    await reg.on_topology(load_preset("dgx1_v100", "t2").model_copy(update={"leaf": "leaf-0"}))
    real_put = store.put

    async def refused(rec: NodeRecord) -> None:
        raise nats.errors.TimeoutError

    store.put = refused  # type: ignore[method-assign]
    now[0] = 1020.0
    await reg.check_lost()
    assert reg.records["t2"].status == "lost" and store.records["t2"].status == "ready"
    await reg.check_lost()  # still away: tried, kept
    assert reg.unwritten == {"t2"}
    store.put = real_put  # type: ignore[method-assign]
    await reg.check_lost()
    assert store.records["t2"].status == "lost" and not reg.unwritten


async def test_heartbeats_are_not_stored_and_an_upgraded_registry_retires_the_stored_ones(
    nc: Client, servers: Servers
) -> None:
    """Heartbeats are core NATS: the stream keeps the nodes' reports, not 820 heartbeats a second at 4,096 nodes.
    A stream made before that (all of `oneplus.node.>`, a durable heartbeat consumer) is brought up to date."""
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, StreamConfig
    from oneplus_topology_registry.app import OLD_HEARTBEAT_CONSUMER

    js = nc.jetstream()
    with contextlib.suppress(Exception):
        await js.delete_stream(subjects.NODES_STREAM)
    await js.add_stream(
        StreamConfig(name=subjects.NODES_STREAM, subjects=["oneplus.node.>", "oneplus.topology.changed"])
    )
    await js.add_consumer(
        subjects.NODES_STREAM,
        ConsumerConfig(
            durable_name=OLD_HEARTBEAT_CONSUMER,
            filter_subject="oneplus.node.*.heartbeat",
            deliver_policy=DeliverPolicy.NEW,
            ack_policy=AckPolicy.EXPLICIT,
        ),
    )
    for node in ("u1", "u2"):
        await js.publish(
            subjects.node_heartbeat(node), NodeHeartbeat(node=node, ts=time.time()).model_dump_json().encode()
        )
    assert (await js.stream_info(subjects.NODES_STREAM)).state.messages == 2

    svc, _ = build(BusSettings(servers.nats_url, servers.redis_url), RegistrySettings(lost_after_s=LOST_AFTER))
    await svc.app.start()
    try:
        async with OnePlusClient.connect(servers.nats_url) as c:
            await until_registry_answers(c)
            info = await js.stream_info(subjects.NODES_STREAM, subjects_filter="oneplus.node.>")
            assert "oneplus.node.*.heartbeat" not in (info.config.subjects or [])
            assert not info.state.subjects, f"stored heartbeats left: {info.state.subjects}"
            assert OLD_HEARTBEAT_CONSUMER not in [ci.name for ci in await js.consumers_info(subjects.NODES_STREAM)]
            await report(nc, "u1")
            await beat(nc, "u1", [GpuHealth(index=2, healthy=False, reason="Xid 79")])
            deadline = time.monotonic() + 15
            while (await node_record(c, "u1")).unhealthy_gpus != [2]:
                assert time.monotonic() < deadline, "the heartbeat was not folded"
                await asyncio.sleep(0.1)
            info = await js.stream_info(subjects.NODES_STREAM, subjects_filter="oneplus.node.>")
            assert set(info.state.subjects or {}) == {subjects.node_topology("u1")}
    finally:
        await svc.app.stop()


async def test_a_loss_whose_write_failed_is_announced_once_it_is_written() -> None:
    """The solver requeues a lost node's gangs on the registry's `lost` announcement, which follows the write: a loss
    written only on a later pass is announced then, once."""
    now = [1000.0]
    store = _MemoryStore()
    published: list[str] = []

    async def publish(subject: str, body: bytes) -> None:
        published.append(subject)

    reg = Registry(store, publish, RegistrySettings(lost_after_s=10.0), clock=lambda: now[0])
    await reg.bootstrap()
    await reg.on_topology(load_preset("dgx1_v100", "t3").model_copy(update={"leaf": "leaf-0"}))
    real_put = store.put

    async def refused(rec: NodeRecord) -> None:
        raise nats.errors.TimeoutError

    store.put = refused  # type: ignore[method-assign]
    now[0] = 1020.0
    await reg.check_lost()
    assert subjects.node_lost("t3") not in published, "not written, not announced"
    store.put = real_put  # type: ignore[method-assign]
    await reg.check_lost()
    await reg.check_lost()
    assert published.count(subjects.node_lost("t3")) == 1
