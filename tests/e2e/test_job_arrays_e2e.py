"""Job arrays end to end: the five services as processes, four simulated nodes.

An array goes in as one request (HTTP `POST /v1/jobs`, a CloudEvent, `oneplus sbatch`), its tasks run as jobs with
`%N` held, `queue` shows the pending tasks as one row, `scancel` takes the array's id or one task's, and bad array
specs are refused in one line naming the value, with nothing already accepted lost.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis
from oneplus_contracts import JobRecord, JobSpec
from oneplus_reservations import ReservationStore
from platform_fixture import start_platform

from oneplus.client import OnePlusClient
from oneplus.devstack import Platform

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
async def platform(servers, tmp_path_factory) -> AsyncIterator[Platform]:  # type: ignore[no-untyped-def]
    import nats
    from oneplus_testing import wipe_bus

    nc = await nats.connect(servers.nats_url)
    await wipe_bus(nc)
    await nc.close()
    await ReservationStore(aioredis.Redis.from_url(servers.redis_url)).wipe()
    p = await start_platform(servers.nats_url, servers.redis_url, tmp_path_factory.mktemp("arrays"))
    try:
        yield p
    finally:
        p.stop()


def post(platform: Platform, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, object]]:
    url = f"http://127.0.0.1:{platform.intake_http_port()}/v1/jobs"
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


async def tasks_of(c: OnePlusClient, array_id: str) -> list[JobRecord]:
    return [r for r in await c.list_jobs() if r.spec.array_task and r.spec.array_task.array_job_id == array_id]


async def until(c: OnePlusClient, array_id: str, count: int, states: set[str], timeout: float = 60) -> list[JobRecord]:
    deadline = time.monotonic() + timeout
    while True:
        got = await tasks_of(c, array_id)
        if len(got) == count and all(r.state in states for r in got):
            return got
        assert time.monotonic() < deadline, f"{array_id}: {sorted((r.job_id, r.state) for r in got)}"
        await asyncio.sleep(0.3)


async def test_an_array_over_http_runs_every_task_with_its_limit_held(platform: Platform, servers) -> None:  # type: ignore[no-untyped-def]
    doc = "name: sweep\nresources: {gpus: 1}\narray: '0-11%3'\nsimulate: {duration_s: 0.6}\n"
    status, reply = await asyncio.to_thread(
        post, platform, doc.encode(), {"Content-Type": "application/yaml", "Idempotency-Key": "sweep-http-1"}
    )
    assert status == 201 and reply["ok"], reply
    array_id = str(reply["job_id"])
    async with OnePlusClient.connect(servers.nats_url) as c:
        done = await until(c, array_id, 12, {"SUCCEEDED"})
    assert sorted(r.spec.array_task.task_id for r in done if r.spec.array_task) == list(range(12))
    # %3: no moment had more than three tasks holding GPUs.
    spans = [(r.placed_ts or 0.0, r.finished_ts or 0.0) for r in done]
    most = max(sum(1 for a, b in spans if a <= t < b) for t, _ in spans)
    assert most <= 3, spans
    again = await asyncio.to_thread(
        post, platform, doc.encode(), {"Content-Type": "application/yaml", "Idempotency-Key": "sweep-http-1"}
    )
    assert again[0] == 200 and again[1]["duplicate"] and again[1]["job_id"] == array_id, again


async def test_a_cloudevent_array_waits_in_one_queue_row_and_scancel_takes_the_array_or_a_task(
    platform: Platform, servers
) -> None:  # type: ignore[no-untyped-def]
    async with OnePlusClient.connect(servers.nats_url) as c:
        blocker = await c.submit(
            JobSpec(name="blocker", resources={"gpus": 1}, simulate={"duration_s": 120}),  # type: ignore[arg-type]
            msg_id="arrays-blocker",
        )
        assert blocker.ok and blocker.job_id
        spec = JobSpec(
            name="waits",
            resources={"gpus": 1},  # type: ignore[arg-type]
            array="0-49%10",  # type: ignore[arg-type]
            dependencies=[{"type": "afterok", "job_ids": [blocker.job_id]}],  # type: ignore[list-item]
            simulate={"duration_s": 0.1},  # type: ignore[arg-type]
        )
        reply = await c.submit_cloudevent(spec, "/ci/arrays", "arrays-ce-1")
        assert reply.ok and reply.job_id, reply.error
        array_id = reply.job_id
        await until(c, array_id, 50, {"ACCEPTED"})
        rows: list[dict[str, object]] = []
        deadline = time.monotonic() + 20
        while not any(r["job_id"] == f"{array_id}_[0-49%10]" for r in rows):
            assert time.monotonic() < deadline, rows
            rows = await c.queue()
            await asyncio.sleep(0.3)
        assert not any(str(r["job_id"]).startswith(f"{array_id}_") and "[" not in str(r["job_id"]) for r in rows)
        await c.cancel(f"{array_id}_7")
        got = {r.job_id: r.state for r in await until(c, array_id, 50, {"ACCEPTED", "CANCELLED"})}
        deadline = time.monotonic() + 20
        while got[f"{array_id}_7"] != "CANCELLED":
            assert time.monotonic() < deadline
            got = {r.job_id: r.state for r in await tasks_of(c, array_id)}
        assert sum(s == "CANCELLED" for s in got.values()) == 1
        await c.cancel(array_id)
        await until(c, array_id, 50, {"CANCELLED"})
        assert (await c.get_job(blocker.job_id)).state in ("PLACED", "STARTING", "RUNNING")  # untouched
        await c.cancel(blocker.job_id)


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"#!/bin/bash\n#SBATCH --array=5-1\n#SBATCH --gpus=1\nhostname\n", "--array=5-1: 5-1: the range ends (1)"),
        (b"#!/bin/bash\n#SBATCH --array=1-9:0\n#SBATCH --gpus=1\nhostname\n", "the step must be 1 or more (got 0)"),
        (b"#!/bin/bash\n#SBATCH --array=0-9%0\n#SBATCH --gpus=1\nhostname\n", "%0: at most 0 tasks at once"),
        (b"#!/bin/bash\n#SBATCH --array=0-1001\n#SBATCH --gpus=1\nhostname\n", "task id 1001 is above the site's"),
        (b'{"name": "big", "resources": {"gpus": 1}, "array": "0-5000"}', "task id 5000 is above the site's"),
    ],
    ids=["reversed", "step-0", "limit-0", "above-max-sbatch", "above-max-json"],
)
async def test_bad_array_specs_are_refused_in_one_line_and_nothing_is_lost(
    platform: Platform, servers, body: bytes, says: str
) -> None:  # type: ignore[no-untyped-def]
    async with OnePlusClient.connect(servers.nats_url) as c:
        before = {r.job_id for r in await c.list_jobs()}
        reply = await c.submit_raw(body, {"Nats-Msg-Id": f"bad-array-{says}"})
        assert not reply.ok and reply.error is not None and says in reply.error, reply.error
        assert "\n" not in reply.error
        after = {r.job_id for r in await c.list_jobs()}
        assert before <= after and not any(j.startswith(f"{reply.job_id}_") for j in after)
        ok = await c.submit(JobSpec(name="fine", resources={"gpus": 1}, simulate={"duration_s": 0.1}))  # type: ignore[arg-type]
        assert ok.ok
    assert platform.dead() == {}
