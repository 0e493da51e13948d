"""A high-priority gang needs part of a running elastic gang: the elastic gang gives up only the ranks needed
(checkpoint, then a restart at the smaller size) instead of being preempted whole (issue 43 item 4, live)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from oneplus_contracts import JobCheckpointed, JobSpec
from oneplus_reservations import check_history
from oneplus_testing import Servers
from platform_fixture import fresh_platform, job_history, wait_terminal
from test_preemption_e2e import launches_of

from oneplus.client import OnePlusClient
from oneplus.devstack import PREEMPT_AT_ONCE, queue_config_env

pytestmark = pytest.mark.e2e


async def test_an_elastic_gang_shrinks_for_a_higher_priority_gang_instead_of_being_preempted_whole(
    servers: Servers, tmp_path: Path
) -> None:
    env = queue_config_env(tmp_path, PREEMPT_AT_ONCE)  # no hour of victim protection: the test runs for seconds
    async with fresh_platform(servers.nats_url, servers.redis_url, tmp_path, **env) as (p, bus, store):
        async with OnePlusClient.connect(servers.nats_url) as c:
            elastic = JobSpec(
                name="elastic",
                team="research",
                priority=0,
                ranks=2,  # both H100 nodes of the dev cluster
                elastic={"min_ranks": 1, "max_ranks": 2},  # type: ignore[arg-type]
                resources={"gpus": 8, "gpu_models": ["H100"]},  # type: ignore[arg-type]
                framework="pytorchjob",
                env={"PET_RDZV_BACKEND": "c10d", "PET_NNODES": "1:2"},
                checkpoint={"signal": "SIGUSR1", "grace_s": 1},  # type: ignore[arg-type]
                simulate={"duration_s": 25.0, "checkpoint_after_s": 0.2},  # type: ignore[arg-type]
            )
            reply = await c.submit(elastic, msg_id="elastic-shrink")
            assert reply.ok and reply.job_id, reply.error
            el = reply.job_id
            deadline = time.monotonic() + 60
            while (await c.get_job(el)).state != "RUNNING":
                assert time.monotonic() < deadline, "the elastic gang never started"
                await asyncio.sleep(0.2)
            # A shrink may come once the gang has run 10 graces at its size (oneplus_queueing.elastic).
            await asyncio.sleep(11)
            urgent = JobSpec(
                name="urgent",
                team="prod",
                priority=1000,
                preemptible=False,
                resources={"gpus": 8, "gpu_models": ["H100"]},  # type: ignore[arg-type]
                simulate={"duration_s": 4.0},  # type: ignore[arg-type]
            )
            reply = await c.submit(urgent, msg_id="urgent-shrink")
            assert reply.ok and reply.job_id, reply.error
            ur = reply.job_id
            jobs = await wait_terminal(c, [el, ur], timeout=180, platform=p)
        assert {j.state for j in jobs.values()} == {"SUCCEEDED"}, {j.job_id: (j.state, j.reason) for j in jobs.values()}

        events = await job_history(bus, el)
        placed = [e for e in events if e.type == "placed"]
        sizes = [len(e.allocation.ranks) for e in placed]
        assert sizes[:2] == [2, 1], f"it ran with 2 ranks, then kept 1 for the urgent gang: {sizes}"
        urgent_placed = next(e for e in await job_history(bus, ur) if e.type == "placed")
        shrunk = placed[1]
        assert urgent_placed.ts >= next(e for e in events if e.type == "preempting").ts
        kept = {r.node for r in shrunk.allocation.ranks}
        assert not kept & {r.node for r in urgent_placed.allocation.ranks}, "the urgent gang got the rank given up"
        assert shrunk.ts <= urgent_placed.ts + 30, "the kept rank restarted at once, not after the urgent gang"
        ck = [e for e in events if isinstance(e, JobCheckpointed)]
        assert ck and all(e.acknowledged for e in ck), "it checkpointed before giving up a rank"
        launches = await launches_of(bus, el)
        by_attempt: dict[int, list[int]] = {}  # one launch per node of each attempt
        for cmd in launches:
            by_attempt.setdefault(cmd.token, []).append(cmd.world_size)
        assert list(by_attempt.values())[:2] == [[2, 2], [1]], by_attempt
        second = [cmd for cmd in launches if cmd.token == list(by_attempt)[1]]
        first_ck = max(e.checkpoint_ts for e in ck if e.token == launches[0].token)  # each node checkpoints
        assert second[0].resume_from_checkpoint_ts == first_ck, "the smaller gang resumes from it"
        assert check_history(await store.history()) == [], "a GPU was held by two jobs"
        assert await store.held_slots() == {}
        assert p.dead() == {}
