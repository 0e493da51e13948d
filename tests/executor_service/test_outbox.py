"""The executor's outbox: facts kept on disk before they are sent, delivered in order until stored, across a NATS
outage and an executor restart, with a resent fact stored once (its event id is its Nats-Msg-Id)."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from pathlib import Path

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.errors import NotFoundError
from oneplus_bus.ledger import JobLedger, read_stream
from oneplus_bus.settings import BusSettings
from oneplus_bus.streams import ensure_kv, ensure_streams
from oneplus_contracts import (
    Allocation,
    FactOutcome,
    JobEvent,
    JobNodeFinished,
    JobRunning,
    JobSpec,
    JobStarting,
    LaunchRanks,
    RankPlacement,
    RankResources,
    parse_job_event,
    subjects,
)
from oneplus_node_executor.app import create_executor
from oneplus_node_executor.outbox import Outbox
from oneplus_node_executor.runtime.simulated import SimulatedRuntime
from oneplus_reservations import ReservationStore
from oneplus_topology.presets import load_preset

from oneplus.devstack import EmbeddedServers


def facts(job_id: str, node: str = "n1", token: int = 7) -> list[JobEvent]:
    return [
        JobStarting(event_id=f"starting-{job_id}-{token}-{node}", job_id=job_id, node=node, token=token),
        JobRunning(event_id=f"running-{job_id}-{token}-{node}", job_id=job_id, node=node, token=token),
        JobNodeFinished(
            event_id=f"nodefin-{job_id}-{token}-{node}",
            job_id=job_id,
            node=node,
            token=token,
            exit_code=0,
            reason="exited",
        ),
    ]


async def stored(js: object, job_id: str | None = None) -> list[tuple[str, str]]:
    """(job, type) of every fact in the facts stream, in stream order."""
    rows = await read_stream(js, subjects.FACTS_STREAM, 1)  # type: ignore[arg-type]
    out = [(e.job_id, e.type) for e in (parse_job_event(data) for _, data, _ in rows)]
    return [row for row in out if job_id is None or row[0] == job_id]


async def stand_in_owner(nc: Client) -> None:
    """Answers the executor's direct reports as the job owner does, keeping each in the facts stream where this
    file's tests read them (`stored`); the owner itself is tests/solver/test_direct_reports.py's."""
    js = nc.jetstream()
    ledger = JobLedger(js, (await ensure_kv(js))[subjects.JOBS_KV], nc)

    async def answer(msg: Msg) -> None:
        event = parse_job_event(msg.data)
        await ledger.report(event)
        outcome = FactOutcome(job_id=event.job_id, event_id=event.event_id, type=event.type, applied=True)
        await msg.respond(outcome.model_dump_json().encode())

    await nc.subscribe(subjects.JOB_REPORTS_ALL, queue=subjects.JOB_REPORTS_QUEUE, cb=answer)


async def test_facts_left_by_a_crash_are_sent_first_in_order_and_a_resent_one_is_stored_once(
    nc: Client, tmp_path: Path
) -> None:
    js = nc.jetstream()
    await ensure_streams(js)
    ledger = JobLedger(js, (await ensure_kv(js))[subjects.JOBS_KV], nc)
    path = tmp_path / "outbox-n1.jsonl"

    async def acked_then_crashed(event: JobEvent, traceparent: str | None) -> None:
        if event.type == "starting" and event.job_id == "o-x":
            await ledger.report(event, traceparent)  # stored, but the executor died before it saw the ack
        raise TimeoutError("nats: timeout")

    first = Outbox(acked_then_crashed, path, max_backoff_s=0.05)
    for event in [*facts("o-x"), *facts("o-y")[:1]]:
        first.put(event)
    first.put(facts("o-x")[0])  # the same fact again (a redelivered launch): kept once
    assert len(first.pending) == 4
    await asyncio.sleep(0.3)
    await first.close(flush_s=0)  # the crash: four facts still pending on disk
    assert await stored(js) == [("o-x", "starting")]
    assert len(path.read_text().splitlines()) == 4

    second = Outbox(lambda event, tp: ledger.report(event, tp), path)
    assert second.open() == 4
    second.start()
    assert await second.flush(10)
    assert await stored(js, "o-x") == [("o-x", "starting"), ("o-x", "running"), ("o-x", "node_finished")]
    assert await stored(js, "o-y") == [("o-y", "starting")]
    assert path.read_text() == "", "compacted once nothing is pending"
    await second.close()


async def test_hundreds_of_facts_go_out_in_pipelined_rounds_each_jobs_in_order() -> None:
    got: list[tuple[str, str]] = []
    in_flight = peak = rounds = 0

    async def deliver(event: JobEvent, traceparent: str | None) -> None:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.01)  # a round trip
        in_flight -= 1
        got.append((event.job_id, event.type))

    box = Outbox(deliver, None, batch=256)
    original = box._round

    def counted():  # type: ignore[no-untyped-def]
        nonlocal rounds
        rounds += 1
        return original()

    box._round = counted  # type: ignore[method-assign]
    jobs = [f"p-{i}" for i in range(300)]
    for job in jobs:
        for event in facts(job):
            box.put(event)
    assert await box.flush(10)
    assert len(got) == 900 and peak >= 200, f"pipelined (peak {peak} in flight)"
    assert rounds <= 8, f"{rounds} rounds, not one round trip per fact"
    for job in jobs:
        assert [t for j, t in got if j == job] == ["starting", "running", "node_finished"]
    await box.close()


async def test_delivery_is_retried_with_a_capped_backoff_until_the_bus_takes_it() -> None:
    tries: list[float] = []

    async def down_then_up(event: JobEvent, traceparent: str | None) -> None:
        tries.append(time.monotonic())
        if len(tries) < 6:
            raise ConnectionError("nats: no servers available for connection")

    box = Outbox(down_then_up, None, max_backoff_s=0.2)
    box.put(facts("r-1")[0])
    assert await box.flush(10)
    gaps = [b - a for a, b in itertools.pairwise(tries)]
    assert len(tries) == 6 and max(gaps) < 0.4 and gaps[-1] >= 0.15, gaps
    assert box.delivered == 1 and not box.pending
    await box.close()


async def test_a_node_end_during_a_nats_outage_is_recorded_once_the_bus_is_back(tmp_path: Path) -> None:
    """NATS killed while a job runs, for longer than a request timeout; the job ends during the outage; its lease is
    no longer renewed; once NATS is back (and an owner answers) the node's end reaches the owner."""
    servers = EmbeddedServers(workdir=tmp_path / "servers").start()
    node = "outage-0"
    settings = BusSettings(servers.nats_url, servers.redis_url, cluster="outage")
    store = ReservationStore.from_url(servers.redis_url, "outage")
    svc = None
    try:
        await store.set_epoch(1)
        alloc = Allocation(ranks=[RankPlacement(rank=0, node=node, gpus=[0], cpus=1, memory_mb=64)])
        token = await store.reserve("o-job", alloc, lease_s=30)
        assert isinstance(token, int)
        topo = load_preset("l40s_8gpu_pcie_node_sys", node)
        svc, ex = create_executor(topo, SimulatedRuntime(), settings, heartbeat_s=0.2, state_dir=tmp_path / "state")
        await svc.app.start()
        job = JobSpec.model_validate(
            {"name": "o", "resources": RankResources(gpus=1, cpus=1, memory_mb=64), "simulate": {"duration_s": 2}}
        )
        cmd = LaunchRanks(
            job_id="o-job",
            node=node,
            token=token,
            spec=job,
            ranks=alloc.ranks,
            world_size=1,
            node_rank=0,
            nodes=[node],
            master_addr=node,
        )
        client = await nats.connect(servers.nats_url)
        js = client.jetstream()
        await stand_in_owner(client)
        await js.publish(subjects.node_command(node, cmd.kind), cmd.model_dump_json().encode())
        deadline = time.monotonic() + 20
        while await stored(js, "o-job") != [("o-job", "starting"), ("o-job", "running")]:
            assert time.monotonic() < deadline, "the launch was not reported"
            await asyncio.sleep(0.1)
        await client.close()

        servers.kill_nats()
        killed = time.monotonic()
        while ex.tokens:
            assert time.monotonic() - killed < 10, "the job's end was not kept during the outage"
            await asyncio.sleep(0.1)
        assert [e.type for e in (x.event for x in ex.outbox.pending.values())] == ["node_finished"]
        assert ex.held() == [], "no lease renewed for ranks that have exited"
        await asyncio.sleep(max(0.0, 7 - (time.monotonic() - killed)))  # longer than a request timeout
        saved = [json.loads(line) for line in (tmp_path / "state" / f"outbox-{node}.jsonl").read_text().splitlines()]
        assert [row["event"]["type"] for row in saved if "event" in row] == ["node_finished"]
        servers.start_nats()

        client = await nats.connect(servers.nats_url)
        js = client.jetstream()
        await stand_in_owner(client)  # an owner answers again: the outbox's resend of the node's end reaches it
        deadline = time.monotonic() + 30
        while True:
            try:
                msg = await js.get_last_msg(subjects.FACTS_STREAM, subjects.job_fact("o-job", "node_finished"))
                break
            except NotFoundError:
                assert time.monotonic() < deadline, "the node's end never reached the bus"
                await asyncio.sleep(0.2)
        fin = parse_job_event(msg.data or b"")
        assert isinstance(fin, JobNodeFinished) and fin.exit_code == 0 and fin.token == token
        assert await stored(js, "o-job") == [("o-job", "starting"), ("o-job", "running"), ("o-job", "node_finished")]
        await client.close()
        assert await ex.outbox.flush(5)
    finally:
        if svc is not None:
            await svc.app.stop()
        await store.close()
        servers.stop()
