"""A simulated fleet of 64 nodes in this process against real NATS and Redis, with the topology registry beside it.

The fleet speaks what 64 executors would: every node registers, a launch on one node's subject reaches that node
and its facts carry the reservation's token, a stale token starts nothing, and 64 nodes heartbeating write the
registry's KV bucket once per node (the reports), not once per heartbeat.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from executor_fakes import send_launch_batch
from nats.aio.client import Client
from nats.aio.msg import Msg
from oneplus_bus.settings import BusSettings
from oneplus_contracts import (
    Allocation,
    FactOutcome,
    JobSpec,
    LaunchRanks,
    NodeHeartbeat,
    NodeLease,
    NodeReportRequest,
    RankPlacement,
    RankResources,
    subjects,
)
from oneplus_node_executor.fleet import SimulatedFleet, build_fleet, parser, synthetic_nodes
from oneplus_reservations import ReservationStore
from oneplus_testing import Servers
from oneplus_topology_registry.app import Registry, RegistrySettings, build

from oneplus.client import OnePlusClient

N = 64
HEARTBEAT_S = 0.5


class Fleet:
    def __init__(self, fleet: SimulatedFleet, registry: Registry, client: OnePlusClient) -> None:
        self.fleet = fleet
        self.registry = registry
        self.client = client


async def listed(c: OnePlusClient) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    cursor = None
    while True:
        page = await c.ops(subjects.OPS_NODE_LIST, {"limit": 50, "cursor": cursor})
        rows += page["nodes"]
        cursor = page["next"]
        if cursor is None:
            return rows


@pytest.fixture
async def fleet(nc: Client, servers: Servers, store: ReservationStore, tmp_path: Path) -> AsyncIterator[Fleet]:
    settings = BusSettings(servers.nats_url, servers.redis_url, cluster=store.ks.cluster)
    reg_svc, reg = build(settings, RegistrySettings(lost_after_s=10))
    nodes = synthetic_nodes(N, "h100_sxm_8gpu_nvswitch_nv18", nodes_per_leaf=16, prefix="sim")
    fl = SimulatedFleet(nodes, settings, name="test", heartbeat_s=HEARTBEAT_S, state_dir=tmp_path / "state")
    await reg_svc.app.start()
    await fl.app.start()
    try:
        async with OnePlusClient.connect(servers.nats_url) as c:
            deadline = time.monotonic() + 60
            while len([r for r in await listed(c) if r["status"] == "ready"]) < N:
                assert time.monotonic() < deadline, "the fleet's nodes did not all register"
                await asyncio.sleep(0.2)
            yield Fleet(fl, reg, c)
    finally:
        await fl.app.stop()
        await reg_svc.app.stop()


def launch(job_id: str, node: str, token: int, duration_s: float = 0.3) -> LaunchRanks:
    spec = JobSpec.model_validate(
        {
            "name": "fleet",
            "resources": RankResources(gpus=2, cpus=1, memory_mb=64),
            "simulate": {"duration_s": duration_s},
        }
    )
    ranks = [RankPlacement(rank=0, node=node, gpus=[0, 1], cpus=1, memory_mb=64)]
    return LaunchRanks(
        job_id=job_id,
        node=node,
        token=token,
        spec=spec,
        ranks=ranks,
        world_size=1,
        node_rank=0,
        nodes=[node],
        master_addr=node,
    )


async def send(nc: Client, cmd: LaunchRanks) -> None:
    await nc.jetstream().publish(
        subjects.node_command(cmd.node, cmd.kind), cmd.model_dump_json().encode(), stream=subjects.COMMANDS_STREAM
    )


async def facts_of(nc: Client, job_id: str) -> tuple[list[dict[str, object]], object]:
    got: list[dict[str, object]] = []

    async def on_fact(m: Msg) -> None:
        # A stand-in job owner: the fleet's outbox sends each fact straight to it and lets it go once answered.
        fact = json.loads(m.data)
        got.append({"subject": m.subject, **fact})
        outcome = FactOutcome(job_id=job_id, event_id=fact["event_id"], type=fact["type"], applied=True)
        await m.respond(outcome.model_dump_json().encode())

    sub = await nc.subscribe(subjects.job_report(job_id, "*"), cb=on_fact)
    return got, sub


async def until(check, timeout: float = 15.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


async def test_every_node_of_the_fleet_registers_with_its_leaf_and_spine(fleet: Fleet) -> None:
    rows = await listed(fleet.client)
    names = [r["topology"]["node"] for r in rows]
    assert names == [f"sim-{i:04d}" for i in range(N)]
    leaves = {r["topology"]["leaf"] for r in rows}
    assert len(leaves) == N // 16
    assert sum(len(r["topology"]["gpus"]) for r in rows) == 8 * N
    info = await fleet.client.nc.jetstream().consumer_info(subjects.COMMANDS_STREAM, "fleet-test")
    assert len(info.config.filter_subjects or []) == N


async def test_a_launch_reaches_its_node_and_reports_facts_with_the_token(
    fleet: Fleet, nc: Client, store: ReservationStore
) -> None:
    node = "sim-0037"
    alloc = Allocation(ranks=[RankPlacement(rank=0, node=node, gpus=[0, 1], cpus=1, memory_mb=64)])
    token = await store.reserve("fj-1", alloc, lease_s=10)
    assert isinstance(token, int)
    got, sub = await facts_of(nc, "fj-1")
    await send(nc, launch("fj-1", node, token))
    await until(lambda: any(f["type"] == "node_finished" for f in got))
    await sub.unsubscribe()  # type: ignore[attr-defined]
    assert [f["type"] for f in got] == ["starting", "running", "node_finished"]
    assert all(f["token"] == token and f["node"] == node for f in got)
    assert got[-1]["exit_code"] == 0
    assert await fleet.fleet.executors[node].runtime.logs("fj-1", None, follow=False)
    others = [ex for n, ex in fleet.fleet.executors.items() if n != node]
    assert not [ex.node for ex in others if await ex.runtime.logs("fj-1", None, follow=False)]


async def test_a_launch_with_a_stale_token_starts_nothing(fleet: Fleet, nc: Client, store: ReservationStore) -> None:
    node = "sim-0005"
    alloc = Allocation(ranks=[RankPlacement(rank=0, node=node, gpus=[3], cpus=1, memory_mb=64)])
    old = await store.reserve("fj-2", alloc, lease_s=10)
    assert isinstance(old, int)
    assert await store.release("fj-2", old)
    new = await store.reserve("fj-2", alloc, lease_s=10)
    assert isinstance(new, int) and new > old
    got, sub = await facts_of(nc, "fj-2")
    await send(nc, launch("fj-2", node, old))
    js = nc.jetstream()

    async def settled() -> bool:
        info = await js.consumer_info(subjects.COMMANDS_STREAM, "fleet-test")
        return bool(info.num_ack_pending == 0 and info.num_pending == 0)

    deadline = time.monotonic() + 10
    while not await settled():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.3)
    assert got == [], "the stale launch was acknowledged and refused"
    assert "fj-2" not in fleet.fleet.executors[node].tokens
    await send(nc, launch("fj-2", node, new, duration_s=30))
    await until(lambda: any(f["type"] == "running" for f in got))
    await sub.unsubscribe()  # type: ignore[attr-defined]
    assert [(f["type"], f["token"]) for f in got] == [("starting", new), ("running", new)]


async def test_a_batch_of_launches_for_one_node_runs_them_all_from_one_message(
    fleet: Fleet, nc: Client, store: ReservationStore
) -> None:
    node = "sim-0021"
    cmds: list[LaunchRanks] = []
    for i in range(3):
        alloc = Allocation(ranks=[RankPlacement(rank=0, node=node, gpus=[2 * i, 2 * i + 1], cpus=1, memory_mb=64)])
        token = await store.reserve(f"fb-{i}", alloc, lease_s=10)
        assert isinstance(token, int)
        cmd = launch(f"fb-{i}", node, token)
        cmds.append(cmd.model_copy(update={"ranks": alloc.ranks}))
    watched = [await facts_of(nc, f"fb-{i}") for i in range(3)]
    await send_launch_batch(nc, node, cmds)  # one append for the three
    await until(lambda: all(any(f["type"] == "node_finished" for f in got) for got, _ in watched))
    for (got, sub), cmd in zip(watched, cmds, strict=True):
        await sub.unsubscribe()  # type: ignore[attr-defined]
        assert [f["type"] for f in got] == ["starting", "running", "node_finished"], cmd.job_id
        assert all(f["token"] == cmd.token and f["node"] == node for f in got)
    info = await nc.jetstream().consumer_info(subjects.COMMANDS_STREAM, "fleet-test")
    assert info.num_ack_pending == 0 and info.num_pending == 0  # acknowledged once all three were handled


async def test_the_fleet_renews_the_leases_of_its_running_jobs(
    fleet: Fleet, nc: Client, store: ReservationStore
) -> None:
    alloc = Allocation(ranks=[RankPlacement(rank=0, node="sim-0063", gpus=[7], cpus=1, memory_mb=64)])
    token = await store.reserve("fj-3", alloc, lease_s=2)
    assert isinstance(token, int)
    got, sub = await facts_of(nc, "fj-3")
    await send(nc, launch("fj-3", "sim-0063", token, duration_s=60))
    await until(lambda: any(f["type"] == "running" for f in got))
    await asyncio.sleep(3 * HEARTBEAT_S * 2)  # well past the 2 s lease: only renewals keep it
    assert await store.current_token("fj-3") == token
    # Fenced out: the reservation goes, the next renewal round stops the ranks and the node reports why.
    assert await store.release("fj-3", token)
    await until(lambda: any(f["type"] == "node_finished" for f in got))
    await sub.unsubscribe()  # type: ignore[attr-defined]
    assert got[-1]["reason"] == "reservation lost (fenced out)" and got[-1]["fault"] == "infrastructure"
    assert "fj-3" not in fleet.fleet.executors["sim-0063"].alive


async def test_a_reset_store_keeps_the_fleets_ranks_and_heartbeats_report_them(
    fleet: Fleet, nc: Client, store: ReservationStore
) -> None:
    node = "sim-0010"
    alloc = Allocation(ranks=[RankPlacement(rank=0, node=node, gpus=[0, 1], cpus=1, memory_mb=64)])
    token = await store.reserve("fj-4", alloc, lease_s=10)
    assert isinstance(token, int)
    got, sub = await facts_of(nc, "fj-4")
    beats: list[NodeHeartbeat] = []

    async def on_beat(m: Msg) -> None:
        beats.append(NodeHeartbeat.model_validate_json(m.data))

    hb_sub = await nc.subscribe(subjects.node_heartbeat(node), cb=on_beat)
    await send(nc, launch("fj-4", node, token, duration_s=60))
    await until(lambda: any(f["type"] == "running" for f in got))
    await until(lambda: any(b.ranks for b in beats))
    assert [(r.job_id, r.token, r.gpus) for r in beats[-1].ranks] == [("fj-4", token, [0, 1])]

    await store.wipe()  # Redis restarted empty
    await asyncio.sleep(4 * HEARTBEAT_S)  # several renewal rounds find it reset
    ex = fleet.fleet.executors[node]
    assert ex.store_reset and "fj-4" in ex.alive and "fj-4" not in ex.stopping
    assert await ex.runtime.list_running() and not [f for f in got if f["type"] == "node_finished"]
    assert await store.restore("fj-4", token, alloc, lease_s=10) is True  # the solver's rebuild, same token
    await store.set_epoch(2)
    await until(lambda: not ex.store_reset)
    assert "fj-4" in ex.alive and beats[-1].ranks[0].job_id == "fj-4"
    await sub.unsubscribe()  # type: ignore[attr-defined]
    await hb_sub.unsubscribe()


async def test_64_heartbeating_nodes_write_the_registry_bucket_once_each(fleet: Fleet, nc: Client) -> None:
    info = await nc.jetstream().stream_info(f"KV_{subjects.TOPOLOGY_KV}")
    before = int(info.state.last_seq or 0)
    assert before == N, "one write per node: its topology report"
    await asyncio.sleep(4 * HEARTBEAT_S + 0.5)  # four rounds: 256 heartbeats
    newest = min(r.last_heartbeat for r in fleet.registry.records.values())
    assert time.time() - newest < 3 * HEARTBEAT_S, "the registry's memory follows every node's heartbeats"
    info = await nc.jetstream().stream_info(f"KV_{subjects.TOPOLOGY_KV}")
    assert int(info.state.last_seq or 0) == before, "heartbeats that change nothing write nothing"
    rows = await listed(fleet.client)
    assert len(rows) == N and all(r["status"] == "ready" for r in rows)


async def test_nodes_report_once_then_lease_until_asked_and_a_lease_names_the_report_it_repeats(
    fleet: Fleet, nc: Client
) -> None:
    """An unchanged report is not sent again (a lease is, every heartbeat); a report request naming one node gets
    that node's full report, one naming none gets every node's."""
    await until(lambda: all(ex.report_ts for ex in fleet.fleet.executors.values()))  # each sent its first report
    reports: list[NodeHeartbeat] = []
    leases: list[NodeLease] = []

    async def on_report(m: Msg) -> None:
        reports.append(NodeHeartbeat.model_validate_json(m.data))

    async def on_lease(m: Msg) -> None:
        leases.append(NodeLease.model_validate_json(m.data))

    subs = [
        await nc.subscribe(subjects.node_heartbeat("*"), cb=on_report),
        await nc.subscribe(subjects.node_lease("*"), cb=on_lease),
    ]
    await asyncio.sleep(3 * HEARTBEAT_S + 0.2)
    assert not reports, f"unchanged reports sent again: {[r.node for r in reports][:5]}"
    assert {lease.node for lease in leases} == set(fleet.fleet.nodes), "every node leases, every heartbeat"
    ex = fleet.fleet.executors["sim-0005"]
    assert all(lease.report_ts == fleet.fleet.executors[lease.node].report_ts for lease in leases)

    await nc.publish(subjects.NODE_REPORT_REQUEST, NodeReportRequest(nodes=["sim-0005"]).model_dump_json().encode())
    await until(lambda: reports)
    await asyncio.sleep(2 * HEARTBEAT_S)
    assert [r.node for r in reports] == ["sim-0005"], "the node asked, once"
    assert ex.report_ts == reports[0].ts

    reports.clear()
    await nc.publish(subjects.NODE_REPORT_REQUEST, NodeReportRequest().model_dump_json().encode())
    await until(lambda: len(reports) >= N)
    await asyncio.sleep(2 * HEARTBEAT_S)
    assert sorted(r.node for r in reports) == sorted(fleet.fleet.nodes), "every node, once"
    for sub in subs:
        await sub.unsubscribe()


def test_a_cluster_file_names_the_fleet_and_its_nodes(tmp_path: Path) -> None:
    path = tmp_path / "lab.yaml"
    path.write_text(
        "name: lab\n"
        "fabric: {nodes_per_leaf: 4, leaves_per_spine: 2}\n"
        "node_groups:\n"
        "  - {prefix: h100, count: 6, topology: h100_sxm_8gpu_nvswitch_nv18}\n"
        "  - {prefix: l40s, count: 3, topology: l40s_8gpu_pcie_node_sys}\n"
    )
    fl = build_fleet(parser().parse_args(["--cluster", str(path)]), BusSettings("nats://x", "redis://x"))
    assert fl.name == "lab" and fl.consumer == "fleet-lab"
    assert fl.nodes[:2] == ["h100-00", "h100-01"] and fl.nodes[-1] == "l40s-02"
    assert len({ex.topology.leaf for ex in fl.executors.values()}) == 3
    fl = build_fleet(parser().parse_args(["--nodes", "3", "--prefix", "gpu"]), BusSettings("nats://x", "redis://x"))
    assert fl.nodes == ["gpu-0000", "gpu-0001", "gpu-0002"]
    with pytest.raises(ValueError, match="appears twice"):
        SimulatedFleet([*synthetic_nodes(2), *synthetic_nodes(1)], BusSettings("nats://x", "redis://x"))
