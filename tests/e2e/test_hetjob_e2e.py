"""Heterogeneous jobs end to end: the five services as processes, the four simulated demo nodes.

A hetjob script goes in as one request and runs as one job whose components were placed together, each by its own
shape; bad ones are refused in one line naming the value, with nothing already accepted lost.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis
from oneplus_contracts import JobSpec
from oneplus_reservations import ReservationStore
from platform_fixture import start_platform, wait_terminal

from oneplus.client import OnePlusClient
from oneplus.devstack import Platform

pytestmark = pytest.mark.e2e

# Component 0: one CPU-only task (the batch script); component 1: both H100 nodes, 8 GPUs each.
HET = b"""#!/bin/bash
#ONEPLUS --simulate-s 0.5
#SBATCH --job-name=rl --ntasks=1
#SBATCH hetjob
#SBATCH --nodes=2 --ntasks-per-node=1 --gpus-per-node=8 -C h100
srun --het-group=1 python train.py
"""


@pytest.fixture(scope="module")
async def platform(servers, tmp_path_factory) -> AsyncIterator[Platform]:  # type: ignore[no-untyped-def]
    import nats
    from oneplus_testing import wipe_bus

    nc = await nats.connect(servers.nats_url)
    await wipe_bus(nc)
    await nc.close()
    await ReservationStore(aioredis.Redis.from_url(servers.redis_url)).wipe()
    p = await start_platform(servers.nats_url, servers.redis_url, tmp_path_factory.mktemp("hetjob"))
    try:
        yield p
    finally:
        p.stop()


async def test_a_hetjob_script_runs_as_one_job_its_components_placed_together(platform: Platform, servers) -> None:  # type: ignore[no-untyped-def]
    async with OnePlusClient.connect(servers.nats_url) as c:
        reply = await c.submit_raw(HET, {"Nats-Msg-Id": "hetjob-e2e-1"})
        assert reply.ok and reply.job_id, reply.error
        done = await wait_terminal(c, [reply.job_id], 60, platform)
    rec = done[reply.job_id]
    assert rec.state == "SUCCEEDED", rec.reason
    assert rec.spec.components is not None and rec.allocation is not None
    driver, *trainers = rec.allocation.ranks
    assert sorted(r.node for r in trainers) == ["h100-0", "h100-1"] and [len(r.gpus) for r in trainers] == [8, 8]
    assert driver.node not in {"h100-0", "h100-1"}  # component 0 on a node of its own


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (
            b"#!/bin/bash\n#SBATCH -n1\n#SBATCH hetjob\nhostname\n",
            "line 3: #SBATCH hetjob: heterogeneous job component 1 is empty",
        ),
        (
            b"#!/bin/bash\n#SBATCH -n1\n#SBATCH hetjob\n#SBATCH --nodes=3 --gpus-per-node=8 -C h100\nhostname\n",
            "can never run on this cluster, even with every GPU free: component 1 (3 rank(s)): needs 24 GPUs",
        ),
    ],
    ids=["empty-component", "component-never-fits"],
)
async def test_bad_hetjobs_are_refused_in_one_line_and_nothing_is_lost(
    platform: Platform, servers, body: bytes, says: str
) -> None:  # type: ignore[no-untyped-def]
    async with OnePlusClient.connect(servers.nats_url) as c:
        before = {r.job_id for r in await c.list_jobs()}
        reply = await c.submit_raw(body, {"Nats-Msg-Id": f"bad-het-{says}"})
        assert not reply.ok and reply.error is not None and says in reply.error, reply.error
        assert "\n" not in reply.error
        after = {r.job_id for r in await c.list_jobs()}
        assert before <= after
        ok = await c.submit(JobSpec(name="fine", resources={"gpus": 1}, simulate={"duration_s": 0.1}))  # type: ignore[arg-type]
        assert ok.ok
    assert platform.dead() == {}
