"""Crash safety against the real engine: an executor killed mid-job, restarted, adopts its ranks and starts no copy."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap

import pytest
from executor_engine_support import launch, new_job_id
from oneplus_node_executor.runtime.docker import DockerRuntime
from oneplus_node_executor.runtime.reconcile import reconcile_node

pytestmark = pytest.mark.engine

# A stand-in executor process: launches the job, says so, and keeps running until it is killed.
EXECUTOR = textwrap.dedent(
    """
    import asyncio, sys
    from oneplus_contracts import LaunchRanks
    from oneplus_node_executor.runtime.docker import DockerRuntime

    async def main() -> None:
        cmd = LaunchRanks.model_validate_json(sys.stdin.read())
        rt = DockerRuntime(sys.argv[1], node=cmd.node)
        await rt.launch(cmd, {})
        print("launched", flush=True)
        await rt.wait(cmd.job_id)

    asyncio.run(main())
    """
)


async def test_killed_executor_restarts_adopts_its_ranks_and_starts_no_second_copy(
    engine_url: str, runtime: DockerRuntime, node_name: str
) -> None:
    job, orphan = new_job_id(), new_job_id()
    cmd = launch(job, node_name, [(0, [0]), (1, [1])], token=3, command=["sh", "-c", "echo up; sleep 30"])
    await runtime.launch(launch(orphan, node_name, [(0, [2])], token=1), {})

    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        EXECUTOR,
        engine_url,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ},
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(cmd.model_dump_json().encode())
    proc.stdin.close()
    assert (await asyncio.wait_for(proc.stdout.readline(), 30)).strip() == b"launched"
    proc.send_signal(signal.SIGKILL)  # mid-job: no cleanup of any kind runs
    assert await proc.wait() == -signal.SIGKILL

    restarted = DockerRuntime(engine_url, node=node_name)
    try:
        before = {(r.job_id, r.token): r.handles for r in await restarted.list_running()}
        assert set(before) == {(job, 3), (orphan, 1)}
        # Redis says: the job's current token is 3; the other job's reservation is gone.
        plan = await reconcile_node(restarted, {job: 3})
        assert [(r.job_id, r.token, r.ranks) for r in plan.adopt] == [(job, 3, (0, 1))]
        assert [r.job_id for r in plan.orphans] == [orphan]
        assert plan.leaked == {}
        # The launch command is redelivered (it was never acknowledged): nothing new starts.
        await restarted.launch(cmd, {})
        after = await restarted.list_running()
        assert [(r.job_id, r.token, r.handles) for r in after] == [(job, 3, before[(job, 3)])]
        assert await restarted.logs(job, None, follow=False) == ["[rank 0] up", "[rank 1] up"]
        # The adopted ranks are as controllable as ones this instance started.
        await restarted.stop(job, grace_s=1, reason="cancelled by user")
        end = await restarted.wait(job)
        assert end.reason == "stopped by the executor: cancelled by user"
    finally:
        await restarted.close()
