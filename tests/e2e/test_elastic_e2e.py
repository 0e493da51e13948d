"""An elastic gang on the embedded platform: it starts below its maximum when only that fits, and grows (checkpoint,
then a restart at the larger size) once the GPUs free up."""

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

pytestmark = pytest.mark.e2e


def fixed(i: int) -> JobSpec:
    return JobSpec(
        name=f"fixed-{i}",
        resources={"gpus": 8, "gpu_models": ["H100"]},  # type: ignore[arg-type]
        simulate={"duration_s": 6.0},  # type: ignore[arg-type]
    )


async def test_an_elastic_gang_starts_below_its_maximum_and_grows_once_gpus_free(
    servers: Servers, tmp_path: Path
) -> None:
    async with fresh_platform(servers.nats_url, servers.redis_url, tmp_path) as (p, bus, store):
        async with OnePlusClient.connect(servers.nats_url) as c:
            blockers = []
            for i in range(1):  # one of the two H100 nodes (the dev cluster's only GPU model with two nodes)
                reply = await c.submit(fixed(i), msg_id=f"fixed-{i}")
                assert reply.ok, reply.error
                blockers.append(reply.job_id)
            deadline = time.monotonic() + 60
            while sum(r.state == "RUNNING" for r in await c.list_jobs()) < 1:
                assert time.monotonic() < deadline, "the fixed gangs never started"
                await asyncio.sleep(0.2)
            elastic = JobSpec(
                name="elastic",
                ranks=4,  # the most it asks; a gang keeps to one GPU model, so at most 2 fit (16 H100s)
                elastic={"min_ranks": 1, "max_ranks": 4},  # type: ignore[arg-type]
                resources={"gpus": 8, "gpu_models": ["H100"]},  # type: ignore[arg-type]
                framework="pytorchjob",
                env={"PET_RDZV_BACKEND": "c10d", "PET_NNODES": "1:4"},
                # A grace of 1 s: it may grow after 10 graces at its size (oneplus_queueing.elastic).
                checkpoint={"signal": "SIGUSR1", "grace_s": 1},  # type: ignore[arg-type]
                simulate={"duration_s": 20.0, "checkpoint_after_s": 0.2},  # type: ignore[arg-type]
            )
            reply = await c.submit(elastic, msg_id="elastic-1")
            assert reply.ok and reply.job_id, reply.error
            el = reply.job_id
            jobs = await wait_terminal(c, [el, *blockers], timeout=180, platform=p)
        assert {j.state for j in jobs.values()} == {"SUCCEEDED"}, {j.job_id: (j.state, j.reason) for j in jobs.values()}

        events = await job_history(bus, el)
        placed = [e for e in events if e.type == "placed"]
        assert [len(e.allocation.ranks) for e in placed] == [1, 2], "one rank while one H100 node was free, then two"
        preempting = next(e for e in events if e.type == "preempting")
        assert preempting.reason.startswith("elastic resize: 1 -> 2 ranks (1..4)")
        ended = max(e.ts for e in await job_history(bus, blockers[0]) if e.type == "finished")
        assert preempting.ts > ended, "it grew only once the fixed gangs had given their GPUs back"
        ck = [e for e in events if isinstance(e, JobCheckpointed)]
        assert ck and all(e.acknowledged for e in ck), "it checkpointed before the restart"
        launches = await launches_of(bus, el)
        assert launches[0].world_size == 1 and launches[-1].world_size == 2
        assert launches[-1].resume_from_checkpoint_ts == ck[-1].checkpoint_ts, "the restart resumes from it"
        assert launches[-1].spec.env["PET_NNODES"] == "1:4"
        assert check_history(await store.history()) == [], "a GPU was held by two jobs"
        assert await store.held_slots() == {}
        assert p.dead() == {}
