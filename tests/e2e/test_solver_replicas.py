"""Several placement-solver replicas, active-active: each places its shard of the pending jobs and commits in Redis;
the one holding the owner lease records every placement. A killed owner's lease is taken over."""

from __future__ import annotations

import asyncio
import time
import urllib.request
from pathlib import Path

import pytest
from oneplus_contracts import JobSpec
from oneplus_reservations import check_history
from oneplus_testing import FAULTS, Servers
from platform_fixture import fresh_platform, job_history, wait_terminal
from prometheus_client.parser import text_string_to_metric_families

from oneplus.client import OnePlusClient
from oneplus.devstack import Platform

pytestmark = [pytest.mark.e2e, FAULTS]

REPLICAS = ("placement-solver", "placement-solver-2")


def metric(platform: Platform, name: str, sample: str) -> float:
    """The sum of `sample`'s values on process `name`'s /metrics."""
    url = platform.metrics_urls()[name]
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == sample)


def gangs(n: int, tag: str, duration: float) -> list[JobSpec]:
    return [
        JobSpec(name=f"{tag}-{i}", resources={"gpus": 1 + i % 4}, simulate={"duration_s": duration})  # type: ignore[arg-type]
        for i in range(n)
    ]


async def submit_all(c: OnePlusClient, specs: list[JobSpec], tag: str) -> list[str]:
    replies = await asyncio.gather(*(c.submit(s, msg_id=f"{tag}-{i}") for i, s in enumerate(specs)))
    ids = [r.job_id for r in replies if r.ok and r.job_id]
    assert len(ids) == len(specs), [r.error for r in replies if not r.ok]
    return ids


async def wait_leader(platform: Platform, names: tuple[str, ...], timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        leading = [n for n in names if metric(platform, n, "oneplus_solver_leading") == 1]
        if len(leading) == 1:
            return leading[0]
        await asyncio.sleep(0.2)
    raise AssertionError(f"no single leader among {names} after {timeout} s")


async def test_two_replicas_share_the_placing_and_one_records_every_placement(servers: Servers, tmp_path: Path) -> None:
    async with fresh_platform(servers.nats_url, servers.redis_url, tmp_path, solver_replicas=2) as (p, nc, store):
        leader = await wait_leader(p, REPLICAS)
        # Both replicas count each other alive before the burst, so the jobs are split between them.
        deadline = time.monotonic() + 30
        while any(metric(p, n, "oneplus_solver_replicas") != 2 for n in REPLICAS):
            assert time.monotonic() < deadline, "the replicas never saw each other"
            await asyncio.sleep(0.2)
        async with OnePlusClient.connect(servers.nats_url) as c:
            ids = await submit_all(c, gangs(60, "rep", 0.3), "rep")
            jobs = await wait_terminal(c, ids, timeout=180, platform=p)
        assert {j.state for j in jobs.values()} == {"SUCCEEDED"}, {j.job_id: (j.state, j.reason) for j in jobs.values()}
        placed = {n: metric(p, n, "oneplus_gangs_placed_total") for n in REPLICAS}
        assert all(v > 0 for v in placed.values()), f"each replica places its shard: {placed}"
        assert sum(placed.values()) >= len(ids)
        # One writer: only the leader folded facts and wrote records; each attempt was placed once.
        follower = next(n for n in REPLICAS if n != leader)
        assert metric(p, follower, "oneplus_job_events_applied_total") == 0
        for job_id in ids:
            types = [e.type for e in await job_history(nc, job_id)]
            assert types.count("placed") == 1, (job_id, types)
        assert check_history(await store.history()) == [], "a GPU was held by two gangs"
        assert await store.held_slots() == {}, "a GPU leaked"


async def test_a_killed_leader_is_replaced_and_no_job_is_lost(servers: Servers, tmp_path: Path) -> None:
    async with fresh_platform(
        servers.nats_url, servers.redis_url, tmp_path, solver_replicas=2, ONEPLUS_SOLVER_LEASE_S="3"
    ) as (p, nc, store):
        leader = await wait_leader(p, REPLICAS)
        other = next(n for n in REPLICAS if n != leader)
        async with OnePlusClient.connect(servers.nats_url) as c:
            ids = await submit_all(c, gangs(60, "takeover", 1.0), "takeover")
            js = nc.jetstream()
            deadline = time.monotonic() + 60
            while (await js.stream_info("ONEPLUS_JOBS")).state.last_seq < 100:
                assert time.monotonic() < deadline, "the burst never got going"
                await asyncio.sleep(0.05)
            p.kill(leader)
            killed = time.monotonic()
            assert await wait_leader(p, (other,), timeout=30) == other
            took = time.monotonic() - killed
            jobs = await wait_terminal(c, ids, timeout=240, platform=p)
        assert took < 3 * 3 + 5, f"the lease of a dead leader was taken over after {took:.1f} s"
        assert {j.state for j in jobs.values()} == {"SUCCEEDED"}, {j.job_id: (j.state, j.reason) for j in jobs.values()}
        assert "takes the lead" in p.logs(other)
        for job_id in ids:
            types = [e.type for e in await job_history(nc, job_id)]
            assert types.count("finished") == 1, (job_id, types)
        assert check_history(await store.history()) == [], "a GPU was held by two gangs"
        assert await store.held_slots() == {}, "a GPU leaked"


async def test_queue_and_explain_give_every_waiting_job_its_reason_whichever_replica_answers(
    servers: Servers, tmp_path: Path
) -> None:
    async with fresh_platform(servers.nats_url, servers.redis_url, tmp_path, solver_replicas=2) as (p, _, _store):
        deadline = time.monotonic() + 30
        while any(metric(p, n, "oneplus_solver_replicas") != 2 for n in REPLICAS):
            assert time.monotonic() < deadline, "the replicas never saw each other"
            await asyncio.sleep(0.2)
        # 24 whole-node jobs on 4 nodes: most of them wait, in both replicas' shards.
        specs = [
            JobSpec(name=f"wait-{i}", resources={"gpus": 8}, simulate={"duration_s": 20.0})  # type: ignore[arg-type]
            for i in range(24)
        ]
        async with OnePlusClient.connect(servers.nats_url) as c:
            ids = await submit_all(c, specs, "wait")
            deadline = time.monotonic() + 30
            while sum(r.state != "ACCEPTED" for r in await c.list_jobs()) < 4:
                assert time.monotonic() < deadline, "nothing was placed"
                await asyncio.sleep(0.2)
            await asyncio.sleep(2.5)  # a cycle of each replica has given its reasons
            for _ in range(6):  # answered by either replica
                rows = [r for r in await c.queue() if r["st"] == "PD"]
                assert len(rows) >= 10
                assert all(r["reason"] for r in rows), [r for r in rows if not r["reason"]]
            waiting = [r["job_id"] for r in rows]
            for job_id in waiting[:6]:
                out = await c.explain(job_id)
                assert out["pending"] and out.get("reason"), out
            for job_id in ids:
                await c.cancel(job_id)
