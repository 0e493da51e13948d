"""SIGKILL the placement-solver in the middle of a run and restart it: no job lost, no GPU leaked."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from oneplus_contracts import Allocation, JobPlaced, JobSpec, RankPlacement, subjects
from oneplus_placement_solver.launch import launch_commands
from oneplus_placement_solver.memory import USAGE_SAVE_EVERY_S
from oneplus_placement_solver.owner import JobOwner
from oneplus_reservations import check_history
from oneplus_stores.archive import JobArchive
from oneplus_testing import FAULTS, Servers
from platform_fixture import fresh_platform, job_history, wait_terminal

from oneplus.client import OnePlusClient
from oneplus.workload import demo_workload

pytestmark = [pytest.mark.e2e, FAULTS]


async def default_usage(c: OnePlusClient, timeout: float = 5.0) -> float:
    """The `default` queue's decayed GPU-hours as `oneplus queues` shows them (waits for a solver to answer)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            rows = await c.ops(f"{subjects.PREFIX}.ops.queues.list", {})
            return float(next(r for r in rows if r["queue"] == "default")["usage_gpu_hours"])
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


async def test_solver_killed_mid_run_and_restarted_loses_no_job_and_leaks_no_gpu(
    servers: Servers, tmp_path: Path
) -> None:
    async with fresh_platform(servers.nats_url, servers.redis_url, tmp_path) as (p, _, store):
        async with OnePlusClient.connect(servers.nats_url) as c:
            ids = []
            # Long enough that jobs still wait when the solver is killed, a few seconds into the run.
            for i, spec in enumerate(demo_workload(20, seed=5, duration_s=(2.0, 4.0))):
                reply = await c.submit(spec, msg_id=f"crash-{i}")
                assert reply.ok, reply.error
                ids.append(reply.job_id)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                states = [r.state for r in await c.list_jobs()]
                placed = sum(s not in ("ACCEPTED",) for s in states)
                if placed >= 4 and "ACCEPTED" in states:
                    break
                await asyncio.sleep(0.1)
            await asyncio.sleep(1.0)  # fair share has accrued
            used_before = await default_usage(c)
            await asyncio.sleep(USAGE_SAVE_EVERY_S + 1)  # and a save since then holds at least that much
            p.kill("placement-solver")
            killed_at = {r.job_id: r.state for r in await c.list_jobs()}
            assert "ACCEPTED" in killed_at.values(), "the kill must land while jobs still wait"
            await asyncio.sleep(2.0)
            p.start_service("placement-solver")
            # The restarted solver carries fair share on; a fresh history would read 0 right after the restart.
            used_after = await default_usage(c, timeout=60)
            assert used_before > 0 and used_after >= 0.5 * used_before, (used_before, used_after)
            jobs = await wait_terminal(c, ids, timeout=240, platform=p)
        assert {j.state for j in jobs.values()} == {"SUCCEEDED"}, {j.job_id: (j.state, j.reason) for j in jobs.values()}
        assert check_history(await store.history()) == []
        assert await store.held_slots() == {}, "a GPU leaked"
        assert await store.all() == []


async def test_a_gang_whose_solver_died_between_its_launch_commands_still_runs_on_every_node(
    servers: Servers, tmp_path: Path
) -> None:
    """The state a solver leaves when it is killed after recording `placed` and sending the first of two launches."""
    async with fresh_platform(servers.nats_url, servers.redis_url, tmp_path) as (p, nc, store):
        p.kill("placement-solver")
        spec = next(s for s in demo_workload(20, seed=5, duration_s=(1.0, 2.0)) if s.ranks == 2 and s.total_gpus == 16)
        async with OnePlusClient.connect(servers.nats_url) as c:
            reply = await c.submit(spec, msg_id="half-launched")
            assert reply.ok, reply.error
            job_id = reply.job_id
            alloc = Allocation(
                ranks=[RankPlacement(rank=r, node=f"h100-{r}", gpus=list(range(8))) for r in range(2)], domain="leaf"
            )
            token = await store.reserve(job_id, alloc)
            assert isinstance(token, int)
            js = nc.jetstream()
            # What the dead solver did as the job's owner: fold `placed`, publish it, write the hot view.
            owner = JobOwner(js, JobArchive(js), min_age_s=300)
            await owner.bootstrap()
            await owner.drain_facts()  # the submission's acceptance, which nobody folded while the solver was dead
            (rec,) = await owner.commit(
                JobPlaced(event_id=f"placed-{job_id}-{token}", job_id=job_id, allocation=alloc, token=token, attempt=1)
            )
            assert rec is not None
            first = launch_commands(rec, alloc, token)[0]  # the solver died before the second
            await js.publish(
                subjects.node_command(first.node, "launch"),
                first.model_dump_json().encode(),
                headers={"Nats-Msg-Id": first.command_id},
                stream=subjects.COMMANDS_STREAM,
            )
            p.start_service("placement-solver")
            job = (await wait_terminal(c, [job_id], timeout=120, platform=p))[job_id]
        assert job.state == "SUCCEEDED", (job.state, job.reason)
        assert job.nodes_done == {"h100-0": 0, "h100-1": 0} and job.token == token, "the same attempt, on both nodes"
        assert "resending the launch of" in p.logs("placement-solver")
        assert check_history(await store.history()) == []
        assert await store.held_slots() == {}


async def test_a_solver_killed_mid_burst_resumes_from_its_sequence_placing_no_job_twice(
    servers: Servers, tmp_path: Path
) -> None:
    """A burst of small gangs, the solver SIGKILLed while it places them, then restarted: it lists the hot view,
    replays the job stream after it, and goes on. Every job runs once per attempt, no GPU is held twice."""
    async with fresh_platform(servers.nats_url, servers.redis_url, tmp_path) as (p, nc, store):
        async with OnePlusClient.connect(servers.nats_url) as c:
            specs = [
                JobSpec(name=f"burst-{i}", resources={"gpus": 1 + i % 4}, simulate={"duration_s": 0.5})  # type: ignore[arg-type]
                for i in range(80)
            ]
            replies = await asyncio.gather(*(c.submit(s, msg_id=f"burst-{i}") for i, s in enumerate(specs)))
            ids = [r.job_id for r in replies if r.ok and r.job_id]
            assert len(ids) == len(specs)
            js = nc.jetstream()
            deadline = time.monotonic() + 60
            while (await js.stream_info(subjects.JOBS_STREAM)).state.last_seq < 150:
                assert time.monotonic() < deadline, "the burst never got going"
                await asyncio.sleep(0.05)
            p.kill("placement-solver")
            killed_at = (await js.stream_info(subjects.JOBS_STREAM)).state.last_seq
            p.start_service("placement-solver")
            jobs = await wait_terminal(c, ids, timeout=240, platform=p)
        assert {j.state for j in jobs.values()} == {"SUCCEEDED"}, {j.job_id: (j.state, j.reason) for j in jobs.values()}
        for job_id in ids:
            events = await job_history(nc, job_id)
            placed = [e for e in events if e.type == "placed"]
            assert len(placed) == jobs[job_id].attempt == 1 + jobs[job_id].preemptions, [e.type for e in events]
            assert len({e.token for e in placed}) == len(placed), "one token per attempt"
        assert check_history(await store.history()) == [], "a GPU was held twice"
        assert await store.held_slots() == {}
        log = p.logs("placement-solver")
        assert "events replayed, at sequence" in log
        resumed = [line for line in log.splitlines() if "events replayed, at sequence" in line][-1]
        assert int(resumed.rsplit(" ", 1)[-1]) >= killed_at - 5, resumed  # it resumed where the stream was, not at 0
