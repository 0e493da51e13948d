"""DockerRuntime against a real engine (Podman's Docker API): what a container gets, and its lifecycle."""

from __future__ import annotations

import asyncio
from typing import Any

import aiodocker
import pytest
from executor_engine_support import launch, new_job_id
from oneplus_contracts import GpuInfo, NicInfo, NodeTopology
from oneplus_node_executor.runtime.base import LaunchFailed, StaleToken
from oneplus_node_executor.runtime.docker import DockerRuntime
from oneplus_node_executor.runtime.environment import rank_environment
from oneplus_node_executor.runtime.preemption import preempt_with_checkpoint

pytestmark = pytest.mark.engine

CHECKPOINTING_JOB = [
    "sh",
    "-c",
    'trap "echo checkpointing; touch $ONEPLUS_CHECKPOINT_MARKER; exit 0" USR1; '
    "echo ready; while true; do sleep 0.1; done",
]


async def inspect(url: str, container_id: str) -> dict[str, Any]:
    async with aiodocker.Docker(url=url) as docker:
        info: dict[str, Any] = await docker.containers.container(container_id).show()
        return info


async def wait_for_line(rt: DockerRuntime, job_id: str, text: str, rank: int | None = None) -> None:
    for _ in range(100):
        if any(text in line for line in await rt.logs(job_id, rank, follow=False)):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{text!r} never appeared in the logs of {job_id}")


async def test_container_gets_env_labels_cpuset_and_limits(engine_url: str, node_name: str) -> None:
    # A 2-CPU test topology that fits this host: GPU0 is near CPU 1, GPU1 near CPU 0, one NIC on GPU0's rail.
    topo = NodeTopology(
        node=node_name,
        gpus=[GpuInfo(index=0, numa_node=1, cpu_affinity="1"), GpuInfo(index=1, numa_node=0, cpu_affinity="0")],
        nics=[NicInfo(name="mlx5_0", numa_node=1, near_gpus=[0])],
        cpus=2,
    )
    rt = DockerRuntime(engine_url, node_topology=topo)
    job = new_job_id()
    script = "env | sort; grep Cpus_allowed_list /proc/self/status; echo done; sleep 30"
    cmd = launch(job, node_name, [(0, [0]), (1, [1])], command=["sh", "-c", script], memory_mb=96, cpus=0.5)
    try:
        await rt.launch(cmd, rank_environment(cmd, topo))
        running = await rt.list_running()
        assert [(r.job_id, r.token, r.ranks) for r in running] == [(job, 1, (0, 1))]
        infos = [await inspect(engine_url, h) for h in running[0].handles]
        for rank, info, cpuset in zip((0, 1), infos, ("1", "0"), strict=True):
            config, host = info["Config"], info["HostConfig"]
            env = dict(item.split("=", 1) for item in config["Env"])
            assert env["RANK"] == str(rank) and env["LOCAL_RANK"] == str(rank) and env["WORLD_SIZE"] == "2"
            assert env["CUDA_VISIBLE_DEVICES"] == str(rank) and env["MASTER_PORT"] == "29511"
            assert env["ONEPLUS_TOKEN"] == "1" and env["ONEPLUS_JOB_ID"] == job
            assert config["Labels"]["oneplus.job"] == job
            assert config["Labels"]["oneplus.rank"] == str(rank)
            assert config["Labels"]["oneplus.token"] == "1"
            assert host["CpusetCpus"] == cpuset
            assert host["Memory"] == 96 * 1024 * 1024
            assert host["NanoCpus"] == 500_000_000
            assert host["NetworkMode"] == "none"
            assert not host.get("DeviceRequests")
            assert info["Name"].lstrip("/") == f"oneplus-{job}-r{rank}-t1"
        await wait_for_line(rt, job, "done", rank=0)
        await wait_for_line(rt, job, "done", rank=1)
        inside0 = await rt.logs(job, 0, follow=False)
        assert "NCCL_IB_HCA==mlx5_0" in inside0 and "Cpus_allowed_list:\t1" in inside0
        inside1 = await rt.logs(job, 1, follow=False)
        assert not any(line.startswith("NCCL_IB_HCA") for line in inside1)
        assert "Cpus_allowed_list:\t0" in inside1
    finally:
        await rt.remove(job)
        await rt.close()


async def test_sigusr1_checkpoint_handshake(runtime: DockerRuntime, node_name: str) -> None:
    job = new_job_id()
    cmd = launch(job, node_name, [(0, [0])], command=CHECKPOINTING_JOB)
    await runtime.launch(cmd, {})
    await wait_for_line(runtime, job, "ready")
    assert await runtime.checkpoint_acknowledged(job) is None
    out = await preempt_with_checkpoint(runtime, job, signal="SIGUSR1", grace_s=10, poll_s=0.1)
    assert out.acknowledged and out.checkpoint_ts is not None
    assert out.waited_s < 5
    end = await runtime.wait(job)
    assert end.checkpointed and end.checkpoint_ts == out.checkpoint_ts
    assert end.per_rank == {0: 0}
    assert "checkpointing" in await runtime.logs(job, 0, follow=False)


async def test_job_that_ignores_the_signal_is_stopped_after_the_grace(runtime: DockerRuntime, node_name: str) -> None:
    job = new_job_id()
    # Writes a marker before any signal (an earlier periodic checkpoint), then ignores USR1 and TERM.
    script = 'touch $ONEPLUS_CHECKPOINT_MARKER; trap "" USR1 TERM; echo ready; while true; do sleep 0.1; done'
    await runtime.launch(launch(job, node_name, [(0, [0])], command=["sh", "-c", script]), {})
    await wait_for_line(runtime, job, "ready")
    await asyncio.sleep(1.1)  # the marker's mtime (whole seconds) is now older than the signal
    out = await preempt_with_checkpoint(runtime, job, signal="SIGUSR1", grace_s=0.5, stop_grace_s=1, poll_s=0.1)
    assert not out.acknowledged  # the old marker does not count as an answer to this signal
    end = await runtime.wait(job)
    assert end.exit_code == 137
    assert end.reason == "stopped by the executor: stop requested"
    assert await runtime.list_running() == []


async def test_redelivered_launch_starts_nothing_even_from_a_new_runtime(
    engine_url: str, runtime: DockerRuntime, node_name: str
) -> None:
    job = new_job_id()
    cmd = launch(job, node_name, [(0, [0]), (1, [1])], token=7)
    await runtime.launch(cmd, {})
    first = await runtime.list_running()
    await runtime.launch(cmd, {})
    again = DockerRuntime(engine_url, node=node_name)  # the executor restarted: nothing in memory
    try:
        found = await again.list_running()
        assert found == first
        await again.launch(cmd, {})
        assert await again.list_running() == first
        assert len(first[0].handles) == 2
    finally:
        await again.close()


async def test_older_token_is_refused_and_newer_token_replaces_the_old_ranks(
    runtime: DockerRuntime, node_name: str
) -> None:
    job = new_job_id()
    await runtime.launch(launch(job, node_name, [(0, [0])], token=5), {})
    with pytest.raises(StaleToken, match=r"with token 4 refused: node .* holds it with token 5"):
        await runtime.launch(launch(job, node_name, [(0, [0])], token=4), {})
    await runtime.launch(launch(job, node_name, [(0, [0])], token=6), {})
    assert [(r.job_id, r.token) for r in await runtime.list_managed()] == [(job, 6)]


@pytest.mark.parametrize(
    ("policy", "reason"),
    [
        ("IfNotPresent", "image localhost/nope:latest not found on node .* and pulling it failed"),
        ("Never", r"image localhost/nope:latest not found on node .* \(pull_policy=Never\)"),
    ],
)
async def test_missing_image_fails_the_launch_with_that_reason(
    runtime: DockerRuntime, node_name: str, policy: str, reason: str
) -> None:
    job = new_job_id()
    cmd = launch(job, node_name, [(0, [0])], image="localhost/nope", pull_policy=policy)
    with pytest.raises(LaunchFailed, match=reason):
        await runtime.launch(cmd, {})
    assert await runtime.list_managed() == []


async def test_command_that_cannot_start_leaves_no_half_gang(runtime: DockerRuntime, node_name: str) -> None:
    job = new_job_id()
    cmd = launch(job, node_name, [(0, [0]), (1, [1])], command=["/bin/no-such-program"])
    with pytest.raises(LaunchFailed, match=r"starting rank 0 of job .* failed"):
        await runtime.launch(cmd, {})
    assert await runtime.list_managed() == []


async def test_exit_code_becomes_the_reason(runtime: DockerRuntime, node_name: str) -> None:
    job = new_job_id()
    script = 'if [ "$RANK" = 1 ]; then echo failing; exit 3; fi; exit 0'
    await runtime.launch(launch(job, node_name, [(0, [0]), (1, [1])], command=["sh", "-c", script]), {})
    end = await runtime.wait(job)
    assert (end.exit_code, end.reason, end.per_rank) == (3, "rank 1 exited with code 3", {0: 0, 1: 3})
    assert not end.checkpointed
    assert [(r.job_id, r.exited) for r in await runtime.list_managed()] == [(job, True)]


async def test_on_failure_restarts_the_rank_until_it_succeeds(runtime: DockerRuntime, node_name: str) -> None:
    job = new_job_id()
    # The container's filesystem survives a restart, so the second run sees the first one's file.
    script = "if [ -f /tmp/ran-once ]; then echo second; exit 0; fi; touch /tmp/ran-once; echo first; exit 5"
    cmd = launch(job, node_name, [(0, [0])], command=["sh", "-c", script], restart_policy="OnFailure")
    await runtime.launch(cmd, {})
    end = await runtime.wait(job)
    assert (end.exit_code, end.per_rank) == (0, {0: 0})
    assert await runtime.logs(job, 0, follow=False) == ["first", "second"]


async def test_restarts_are_bounded(engine_url: str, node_name: str) -> None:
    rt = DockerRuntime(engine_url, node=node_name, max_restarts=2)
    job = new_job_id()
    try:
        cmd = launch(job, node_name, [(0, [0])], command=["sh", "-c", "echo run; exit 4"], restart_policy="Always")
        await rt.launch(cmd, {})
        end = await rt.wait(job)
        assert end.reason == "rank 0 exited with code 4 after 2 restart(s)"
        assert await rt.logs(job, 0, follow=False) == ["run", "run", "run"]
    finally:
        await rt.remove(job)
        await rt.close()


async def test_logs_by_rank_and_followed_until_the_ranks_end(runtime: DockerRuntime, node_name: str) -> None:
    job = new_job_id()
    script = 'echo "hello from $RANK"; sleep 0.6; echo "bye from $RANK" >&2'
    await runtime.launch(launch(job, node_name, [(0, [0]), (1, [1])], command=["sh", "-c", script]), {})
    followed = [line async for line in runtime.stream_logs(job)]
    assert sorted(followed) == sorted(
        ["[rank 0] hello from 0", "[rank 1] hello from 1", "[rank 0] bye from 0", "[rank 1] bye from 1"]
    )
    assert followed.index("[rank 0] hello from 0") < followed.index("[rank 0] bye from 0")
    assert await runtime.logs(job, 1, follow=False) == ["hello from 1", "bye from 1"]
    assert await runtime.logs(job, 0, follow=True) == ["hello from 0", "bye from 0"]
    with pytest.raises(LookupError, match=r"has no rank 7 on node .* \(ranks here: \[0, 1\]\)"):
        await runtime.logs(job, 7, follow=False)
    with pytest.raises(LookupError, match="job job-nope has no containers"):
        await runtime.logs("job-nope", None, follow=False)


async def test_cancel_stops_the_ranks_with_sigterm(runtime: DockerRuntime, node_name: str) -> None:
    job = new_job_id()
    script = 'trap "echo terminating; exit 143" TERM; echo ready; while true; do sleep 0.1; done'
    await runtime.launch(launch(job, node_name, [(0, [0])], command=["sh", "-c", script]), {})
    await wait_for_line(runtime, job, "ready")
    waiter = asyncio.create_task(runtime.wait(job))
    await runtime.stop(job, grace_s=5, reason="cancelled by user")
    end = await waiter
    assert (end.exit_code, end.reason) == (143, "stopped by the executor: cancelled by user")
    assert "terminating" in await runtime.logs(job, 0, follow=False)
