"""Which ended attempts keep their containers for `oneplus logs`."""

from __future__ import annotations

import asyncio
import tracemalloc

import pytest
from oneplus_contracts import JobSpec, LaunchRanks, RankPlacement
from oneplus_node_executor.retention import FinishedRanks
from oneplus_node_executor.runtime.simulated import STOPPED_EXIT, SimulatedRuntime


def test_beyond_keep_the_oldest_attempts_are_handed_back_in_order() -> None:
    kept = FinishedRanks(2)
    assert kept.ended("a", 1) == []
    assert kept.ended("b", 1) == []
    assert kept.ended("c", 4) == [("a", 1)]
    assert ("b", 1) in kept and ("a", 1) not in kept and len(kept) == 2


def test_an_attempt_reported_twice_counts_once_and_becomes_the_newest() -> None:
    kept = FinishedRanks(2)
    kept.ended("a", 1)
    kept.ended("b", 1)
    assert kept.ended("a", 1) == []
    assert kept.ended("c", 1) == [("b", 1)]


def test_two_attempts_of_one_job_are_kept_apart_and_drain_empties_oldest_first() -> None:
    kept = FinishedRanks(3)
    kept.ended("a", 1)
    kept.ended("a", 2)
    assert kept.drain() == [("a", 1), ("a", 2)]
    assert len(kept) == 0


def test_keep_zero_removes_at_once_and_a_negative_keep_is_refused() -> None:
    assert FinishedRanks(0).ended("a", 1) == [("a", 1)]
    with pytest.raises(ValueError, match="keep=-1"):
        FinishedRanks(-1)


def launch_cmd(job_id: str = "j-1", token: int = 3, duration_s: float = 0.0) -> LaunchRanks:
    spec = JobSpec(name="train", resources={"gpus": 2}, simulate={"duration_s": duration_s})  # type: ignore[arg-type]
    sent = LaunchRanks(
        command_id=f"c-{job_id}-{token}",
        job_id=job_id,
        node="n1",
        token=token,
        spec=spec,
        ranks=[RankPlacement(rank=0, node="n1", gpus=[0, 1])],
        world_size=1,
        node_rank=0,
        nodes=["n1"],
        master_addr="n1",
    )
    return LaunchRanks.model_validate_json(sent.model_dump_json())  # as a node gets it: parsed from the bus


async def test_a_running_simulated_job_holds_its_command_slimmed() -> None:
    cmd = launch_cmd(duration_s=60.0)
    sent = cmd.model_dump_json()
    rt = SimulatedRuntime()
    await rt.launch(cmd, {0: {"RANK": "0"}})
    assert not cmd.model_fields_set and not cmd.spec.model_fields_set and not cmd.ranks[0].model_fields_set
    assert cmd.model_dump_json() == sent, "slimmed, the command says all it said"
    assert [r.job_id for r in await rt.list_running()] == ["j-1"]
    await rt.stop("j-1", grace_s=0.0)
    assert (await rt.wait("j-1")).exit_code == STOPPED_EXIT


async def test_an_ended_simulated_job_keeps_its_logs_and_exit_and_still_answers() -> None:
    rt = SimulatedRuntime()
    await rt.launch(launch_cmd(), {0: {"RANK": "0"}})
    first = await rt.wait("j-1")
    assert first.exit_code == 0
    assert await rt.list_running() == []
    assert await rt.wait("j-1") == first, "asked again after the end, the same exit"
    assert (await rt.logs("j-1", None, False))[1:] == ["[rank 0] started on n1 gpus=[0, 1]", "[rank 0] exited 0"]
    assert await rt.logs("j-1", 0, False) == await rt.logs("j-1", None, False)
    assert await rt.checkpoint_acknowledged("j-1") is None
    await rt.signal("j-1", "SIGUSR1")  # no rank left: nothing happens
    await rt.stop("j-1", grace_s=0.0)
    await rt.launch(launch_cmd(), {0: {"RANK": "0"}})  # the same attempt again: starts nothing
    assert await rt.list_running() == [] and await rt.wait("j-1") == first
    assert await rt.remove("j-1", 2) == 0, "another attempt's removal leaves this one"
    assert await rt.remove("j-1", 3) == 1
    assert await rt.logs("j-1", None, False) == [] and await rt.remove("j-1", 3) == 0


async def test_a_newer_attempt_replaces_an_ended_one() -> None:
    rt = SimulatedRuntime()
    await rt.launch(launch_cmd(token=3), {0: {}})
    await rt.wait("j-1")
    await rt.launch(launch_cmd(token=4, duration_s=60.0), {0: {}})
    assert [(r.job_id, r.token) for r in await rt.list_running()] == [("j-1", 4)]
    assert await rt.remove("j-1", 3) == 0, "the ended attempt is gone; the running one stays"
    await rt.close()


async def test_ended_simulated_jobs_take_a_fraction_of_the_memory_of_running_ones() -> None:
    """A fleet keeps 16 ended jobs on each node (8,192 on 512 nodes): kept whole they were ~40 objects each, and the
    fleet's CPU a gang grew with them."""

    async def kept(duration_s: float) -> int:
        rt = SimulatedRuntime()
        cmds = [launch_cmd(f"j-{i}", duration_s=duration_s) for i in range(300)]
        tracemalloc.start()
        try:
            for cmd in cmds:
                await rt.launch(cmd, {0: {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "n1"}})
            del cmds
            await asyncio.sleep(0.05)  # zero-length runs end
            size = tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
            await rt.close()
        return size

    running, ended = await kept(60.0), await kept(0.0)
    assert ended <= 0.3 * running, (running, ended)


async def test_a_simulated_job_says_so_in_its_logs_and_its_exit() -> None:
    """The dev stack's runtime runs no process: its logs and exit reason say so, naming the command not run."""
    rt = SimulatedRuntime()
    cmd = launch_cmd(duration_s=0.05)
    cmd = cmd.model_copy(update={"spec": cmd.spec.model_copy(update={"command": ["torchrun", "train.py"]})})
    await rt.launch(cmd, {0: {"RANK": "0"}})
    end = await rt.wait("j-1")
    assert end.exit_code == 0 and end.reason == "simulated: exited 0 after 0.05 s (no process ran)"
    assert (await rt.logs("j-1", None, False))[0] == (
        "[simulated] runtime simulated: `torchrun train.py` is not run; the ranks hold their GPUs 0.05 s "
        "(simulate.duration_s) and exit 0"
    )
