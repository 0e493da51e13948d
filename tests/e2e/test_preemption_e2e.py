"""A high-priority 16-GPU gang arrives on a cluster full of low-priority preemptible work (issue 5, end to end)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import nats
import pytest
from oneplus_contracts import NODE_COMMAND_ADAPTER, JobCheckpointed, JobSpec, LaunchRanks
from oneplus_reservations import check_history
from oneplus_testing import Servers
from platform_fixture import fresh_platform, job_history, wait_terminal

from oneplus.client import OnePlusClient
from oneplus.devstack import PREEMPT_AT_ONCE, queue_config_env

pytestmark = pytest.mark.e2e

LOW_S = 10.0


def low(i: int) -> JobSpec:
    return JobSpec(
        name=f"explore-{i}",
        team="research",
        priority=0,
        preemptible=True,
        resources={"gpus": 8},  # type: ignore[arg-type]
        checkpoint={"signal": "SIGUSR1", "grace_s": 10},  # type: ignore[arg-type]
        simulate={"duration_s": LOW_S, "checkpoint_after_s": 0.3},  # type: ignore[arg-type]
    )


async def launches_of(bus: nats.aio.client.Client, job_id: str) -> list[LaunchRanks]:
    js = bus.jetstream()
    sub = await js.subscribe("oneplus.cmd.node.*.launch", ordered_consumer=True)
    out = []
    try:
        while True:
            try:
                msg = await sub.next_msg(timeout=0.5)
            except (TimeoutError, nats.errors.TimeoutError):
                break
            cmd = NODE_COMMAND_ADAPTER.validate_json(msg.data)
            if cmd.job_id == job_id and isinstance(cmd, LaunchRanks):
                out.append(cmd)
    finally:
        await sub.unsubscribe()
    return out


async def test_high_priority_gang_starts_after_victims_checkpoint_and_victims_resume_from_it(
    servers: Servers, tmp_path: Path
) -> None:
    # The low gangs run for seconds: a site config without the default hour of victim protection lets the urgent
    # gang evict them at once, as a site whose urgent work must never wait would set it.
    env = queue_config_env(tmp_path, PREEMPT_AT_ONCE)
    async with fresh_platform(servers.nats_url, servers.redis_url, tmp_path, **env) as (
        p,
        bus,
        store,
    ):
        async with OnePlusClient.connect(servers.nats_url) as c:
            lows = []
            for i in range(4):
                reply = await c.submit(low(i), msg_id=f"low-{i}")
                assert reply.ok, reply.error
                lows.append(reply.job_id)
            deadline = time.monotonic() + 60
            while sum(r.state == "RUNNING" for r in await c.list_jobs()) < 4:
                assert time.monotonic() < deadline, "the low-priority work never filled the cluster"
                await asyncio.sleep(0.2)
            urgent = JobSpec(
                name="urgent",
                team="prod",
                priority=1000,
                preemptible=False,
                ranks=2,
                resources={"gpus": 8},  # type: ignore[arg-type]
                topology={"domain": "leaf", "mode": "required"},  # type: ignore[arg-type]
                simulate={"duration_s": 1.0},  # type: ignore[arg-type]
            )
            reply = await c.submit(urgent, msg_id="urgent-1")
            assert reply.ok and reply.job_id
            hi = reply.job_id
            jobs = await wait_terminal(c, [hi, *lows], timeout=180, platform=p)
        assert {j.state for j in jobs.values()} == {"SUCCEEDED"}, {j.job_id: (j.state, j.reason) for j in jobs.values()}

        hi_events = await job_history(bus, hi)
        hi_placed = next(e for e in hi_events if e.type == "placed")
        hi_nodes = set(hi_placed.allocation.nodes)
        victims = [v for v in lows if jobs[v].preemptions > 0]
        assert len(victims) == 2, "least lost work: exactly the two gangs of one leaf step aside"
        for v in victims:
            events = await job_history(bus, v)
            types = [e.type for e in events]
            i = types.index("preempting")
            assert types[i:].count("placed") == 1 and types[-1] == "finished", types
            ck = [e for e in events if isinstance(e, JobCheckpointed)]
            assert ck and all(e.acknowledged for e in ck), "the victim checkpointed before it stopped"
            second = [k for k, t in enumerate(types) if t == "placed"][1]
            stopped = max(e.ts for e in events[:second] if e.type == "node_finished")
            assert hi_placed.ts > stopped, "the preemptor started only after its victims had stopped"
            first_nodes = set(next(e for e in events if e.type == "placed").allocation.nodes)
            assert first_nodes <= hi_nodes, "the freed GPUs went to the preemptor"
            relaunch = (await launches_of(bus, v))[-1]
            assert relaunch.resume_from_checkpoint_ts == ck[-1].checkpoint_ts, "it resumes from its checkpoint"
            assert 0 < relaunch.resume_progress_s < LOW_S
        assert all(jobs[v].preemptions == 0 for v in lows if v not in victims)
        assert check_history(await store.history()) == [], "a GPU was held by two jobs"
        assert await store.held_slots() == {}
        assert p.dead() == {}
