"""End to end: intake, topology-registry, placement-solver, preemption and four executors as processes."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from oneplus_contracts import JobSpec, subjects
from oneplus_reservations import ReservationStore, check_history
from platform_fixture import job_history, read_spans, start_platform, wait_terminal

from oneplus.client import OnePlusClient
from oneplus.devstack import Platform
from oneplus.workload import demo_workload

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
async def platform(servers, tmp_path_factory) -> AsyncIterator[tuple[Platform, Path]]:  # type: ignore[no-untyped-def]
    import nats
    from oneplus_testing import wipe_bus

    nc = await nats.connect(servers.nats_url)
    await wipe_bus(nc)
    await nc.close()
    await ReservationStore(aioredis.Redis.from_url(servers.redis_url)).wipe()
    workdir = tmp_path_factory.mktemp("e2e")
    p = await start_platform(servers.nats_url, servers.redis_url, workdir)
    try:
        yield p, workdir
    finally:
        p.stop()


async def test_twenty_gangs_all_succeed_without_double_holds_with_ordered_histories_and_one_trace(
    platform: tuple[Platform, Path],
    servers,
    bus,  # type: ignore[no-untyped-def]
) -> None:
    p, workdir = platform
    specs = demo_workload(20, seed=11, duration_s=(0.5, 2.0))
    assert {s.total_gpus for s in specs} >= {1, 2, 4, 8, 16}
    async with OnePlusClient.connect(servers.nats_url) as c:
        ids = []
        for i, spec in enumerate(specs):
            reply = await c.submit(spec, msg_id=f"e2e-{i}")
            assert reply.ok, reply.error
            ids.append(reply.job_id)
        jobs = await wait_terminal(c, ids, timeout=240, platform=p)
    assert {j.state for j in jobs.values()} == {"SUCCEEDED"}, {j.job_id: (j.state, j.reason) for j in jobs.values()}
    assert p.dead() == {}, "no service may crash"

    store = ReservationStore(aioredis.Redis.from_url(servers.redis_url))
    history = await store.history()
    assert check_history(history) == [], "a GPU was held by two jobs at once"
    reserved = {e.job_id for e in history if e.op == "reserve"}
    released = {e.job_id for e in history if e.op == "release"}
    assert set(ids) <= reserved and set(ids) <= released
    assert await store.held_slots() == {}, "every finished job released its GPUs"
    await store.close()

    preempted = 0
    for job_id in ids:
        events = await job_history(bus, job_id)
        assert_complete_history(events)
        preempted += sum(1 for e in events if e.type == "requeued")

    spans = read_spans(workdir / "spans")
    one = ids[-1]
    traces = {s["context"]["trace_id"] for s in spans if s["attributes"].get("oneplus.job_id") == one}
    assert len(traces) == 1, f"job {one} is spread over traces {traces}"
    (trace,) = traces
    services = {s["resource"]["attributes"]["service.name"] for s in spans if s["context"]["trace_id"] == trace}
    assert {"intake", "placement-solver", "node-executor"} <= services, services


def assert_complete_history(events: list) -> None:  # type: ignore[type-arg]
    """In stream order: accepted, attempts (placed, per node starting→running→[checkpointed]→node_finished,
    preempting→requeued between attempts), finished."""
    types = [e.type for e in events]
    assert types[0] == "accepted" and types[-1] == "finished", types
    attempts: list[list] = []  # type: ignore[type-arg]
    for e in events[1:-1]:
        if e.type == "placed":
            attempts.append([e])
        else:
            assert attempts, f"{e.type} before any placement: {types}"
            attempts[-1].append(e)
    assert attempts, types
    for i, attempt in enumerate(attempts):
        placed = attempt[0]
        for node in placed.allocation.nodes:
            per_node = [e.type for e in attempt if getattr(e, "node", None) == node]
            # A preemption may overtake a node's `running`; the fold then refuses that event.
            assert per_node in (
                ["starting", "running", "node_finished"],
                ["starting", "running", "checkpointed", "node_finished"],
                ["starting", "checkpointed", "node_finished"],
            ), (node, per_node, types)
        rest = [e.type for e in attempt if getattr(e, "node", None) is None]
        last = i == len(attempts) - 1
        # The last attempt may have been asked to step aside and finished its work first.
        allowed = (["placed"], ["placed", "preempting"]) if last else (["placed", "preempting", "requeued"],)
        assert rest in allowed, (rest, types)


def _spec(**over: object) -> dict[str, object]:
    base = json.loads(JobSpec(name="bad", resources={"gpus": 1}).model_dump_json())  # type: ignore[arg-type]
    base.update(over)
    return base


@pytest.mark.parametrize(
    ("body", "expect"),
    [
        (b"{not json", "JSON"),
        (json.dumps(_spec(colour="blue")).encode(), "colour"),
        (json.dumps(_spec(resources={"gpus": -2})).encode(), "gpus"),
        (json.dumps(_spec(resources={"gpus": 0})).encode(), "gpus"),
        (json.dumps(_spec(ranks=9, resources={"gpus": 8})).encode(), "larger than the cluster"),
        (json.dumps(_spec(queue="nope")).encode(), "nope"),
    ],
    ids=["malformed-json", "unknown-field", "negative-gpus", "zero-gpus", "gang-larger-than-cluster", "unknown-queue"],
)
async def test_bad_input_is_rejected_with_a_clear_reason_and_no_service_crashes(
    platform: tuple[Platform, Path],
    servers,
    bus,
    body: bytes,
    expect: str,  # type: ignore[no-untyped-def]
) -> None:
    p, _ = platform
    async with OnePlusClient.connect(servers.nats_url) as c:
        reply = await c.submit_raw(body, {"Nats-Msg-Id": f"bad-{random.random()}"})
        assert not reply.ok
        assert reply.error and expect.lower() in reply.error.lower(), reply.error
        assert reply.job_id is not None
        events = await job_history(bus, reply.job_id)
        assert [e.type for e in events] == ["rejected"]
        assert expect.lower() in events[0].reason.lower()
        ok = await c.submit(JobSpec(name="still-fine", resources={"gpus": 1}, simulate={"duration_s": 0.1}))  # type: ignore[arg-type]
        assert ok.ok, "intake keeps accepting after bad input"
    assert p.dead() == {}


async def test_a_retried_submission_with_the_same_id_is_one_job(platform, servers) -> None:  # type: ignore[no-untyped-def]
    async with OnePlusClient.connect(servers.nats_url) as c:
        spec = JobSpec(name="once", resources={"gpus": 1}, simulate={"duration_s": 0.1})  # type: ignore[arg-type]
        first = await c.submit(spec, msg_id="ci-run-42")
        again = await c.submit(spec, msg_id="ci-run-42")
    assert first.ok and again.ok and first.job_id == again.job_id
    assert again.duplicate and not first.duplicate


async def test_a_poison_command_is_dead_lettered_with_its_reason(platform, servers, bus) -> None:  # type: ignore[no-untyped-def]
    js = bus.jetstream()
    await js.publish(
        subjects.node_command("h100-0", "launch"),
        b'{"kind": "launch", "garbage": true}',
        stream=subjects.COMMANDS_STREAM,
    )
    sub = await js.subscribe(subjects.dead_letter(subjects.node_command("h100-0", "launch")), ordered_consumer=True)
    msg = await sub.next_msg(timeout=15)
    body = json.loads(msg.data)
    assert body["subject"] == subjects.node_command("h100-0", "launch")
    assert "ValidationError" in body["reason"]
    assert msg.headers and "Oneplus-Dlq-Reason" in msg.headers
    await sub.unsubscribe()
    assert platform[0].dead() == {}


async def test_explain_says_which_constraint_blocks_and_cancel_ends_a_pending_job(platform, servers) -> None:  # type: ignore[no-untyped-def]
    spec = JobSpec(
        name="too-tight",
        ranks=2,
        resources={"gpus": 8},  # type: ignore[arg-type]
        topology={"domain": "node", "mode": "required"},  # type: ignore[arg-type]
        simulate={"duration_s": 0.1},  # type: ignore[arg-type]
    )
    async with OnePlusClient.connect(servers.nats_url) as c:
        # It could never fit (16 GPUs on one 8-GPU node): refused at submission, with explain's reason.
        reply = await c.submit(spec, msg_id="explain-1")
        assert not reply.ok and reply.error is not None
        assert "can never run" in reply.error and "node" in reply.error and "8" in reply.error, reply.error
        # A job that waits (on a dependency here) is explained and cancelled while pending.
        first = await c.submit(
            JobSpec(name="first", resources={"gpus": 1}, simulate={"duration_s": 30}),  # type: ignore[arg-type]
            msg_id="explain-2",
        )
        assert first.ok and first.job_id
        later = JobSpec(
            name="later",
            resources={"gpus": 1},  # type: ignore[arg-type]
            dependencies=[{"type": "afterok", "job_ids": [first.job_id]}],  # type: ignore[list-item]
            simulate={"duration_s": 0.1},  # type: ignore[arg-type]
        )
        reply = await c.submit(later, msg_id="explain-3")
        assert reply.ok and reply.job_id
        deadline = time.monotonic() + 20
        while True:
            res = await c.explain(reply.job_id)
            if res.get("reason") == "Dependency" or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.3)
        assert res["pending"] is True and res.get("reason") == "Dependency", res
        rows = {r["job_id"]: r for r in await c.queue()}
        assert rows[reply.job_id]["st"] == "PD"
        await c.cancel(reply.job_id)
        await c.cancel(first.job_id)
        (rec,) = (await wait_terminal(c, [reply.job_id], timeout=30)).values()
    assert rec.state == "CANCELLED" and rec.allocation is None


async def test_scancel_signal_reaches_the_running_job_and_leaves_it_running_and_bad_asks_are_one_line(
    platform, servers
) -> None:  # type: ignore[no-untyped-def]
    from typer.testing import CliRunner

    from oneplus.cli.app import app as cli

    def scancel(*args: str) -> tuple[int, str]:
        got = CliRunner().invoke(cli, ["scancel", *args, "--nats", servers.nats_url])
        return got.exit_code, got.stderr

    async with OnePlusClient.connect(servers.nats_url) as c:
        reply = await c.submit(
            JobSpec(name="signalled", resources={"gpus": 1}, simulate={"duration_s": 60, "checkpoint_after_s": None}),  # type: ignore[arg-type]
            msg_id="signal-1",
        )
        assert reply.ok and reply.job_id
        job_id = reply.job_id
        deadline = time.monotonic() + 30
        rec = await c.get_job(job_id)
        while rec.state != "RUNNING":
            assert time.monotonic() < deadline and not rec.terminal, rec
            await asyncio.sleep(0.2)
            rec = await c.get_job(job_id)
        assert rec.allocation is not None
        node = rec.allocation.nodes[0]

        assert await asyncio.to_thread(scancel, "--signal=USR1", job_id) == (0, "")  # silent, as scancel
        logs_subject = f"{subjects.PREFIX}.ops.node.{node}.logs"
        deadline = time.monotonic() + 15
        while "received SIGUSR1" not in (await c.ops(logs_subject, {"job_id": job_id}))["lines"]:
            assert time.monotonic() < deadline, "the executor never delivered the signal"
            await asyncio.sleep(0.2)
        assert (await c.get_job(job_id)).state == "RUNNING"  # a signal does not end the job
        assert await asyncio.to_thread(scancel, "-s", "10", job_id) == (0, "")  # a number, with -s: SIGUSR1 again

        # Bad asks: one line each, naming the value; nothing changes.
        code, err = await asyncio.to_thread(scancel, "--signal=NOPE", job_id)
        assert (code, err) == (2, "scancel: error: --signal 'NOPE' is not a signal (USR1, SIGTERM, 10, ...)\n")
        code, err = await asyncio.to_thread(scancel, "-s", "USR1", "j-nosuchjob")
        assert (code, err) == (1, "scancel: error: Signal job error on job id j-nosuchjob: no job 'j-nosuchjob'\n")
        with pytest.raises(Exception, match=r"^--signal 'SIGWHAT' is not a signal"):
            await c.signal(job_id, "SIGWHAT")  # the intake checks it too (the HTTP API's and any client's ask)

        waiting = await c.submit(
            JobSpec(name="waits", resources={"gpus": 1}, dependencies=[{"type": "afterok", "job_ids": [job_id]}]),  # type: ignore[arg-type,list-item]
            msg_id="signal-2",
        )
        assert waiting.ok and waiting.job_id
        code, err = await asyncio.to_thread(scancel, "-s", "USR1", waiting.job_id)
        assert (code, err) == (1, f"scancel: error: Signal job error on job id {waiting.job_id}: job {waiting.job_id} "
                                  "is ACCEPTED: it has no running processes to signal\n")  # fmt: skip
        assert (await c.get_job(waiting.job_id)).state == "ACCEPTED"
        await c.cancel(waiting.job_id)

        # Without --signal, scancel cancels as before; an ended job has nothing to signal.
        assert await asyncio.to_thread(scancel, job_id) == (0, "")
        (done,) = (await wait_terminal(c, [job_id], timeout=30)).values()
        assert done.state == "CANCELLED"
        code, err = await asyncio.to_thread(scancel, "-s", "USR1", job_id)
        assert (code, err) == (1, f"scancel: error: Signal job error on job id {job_id}: job {job_id} already "
                                  "CANCELLED: nothing to signal\n")  # fmt: skip
