"""The engine goes away and comes back: the node reports unhealthy with the reason, then healthy again."""

from __future__ import annotations

import asyncio
import shutil
import signal
import subprocess
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
from executor_engine_support import engine_unreachable_reason, launch, new_job_id
from oneplus_node_executor.runtime.base import EngineUnavailable
from oneplus_node_executor.runtime.docker import DockerRuntime

pytestmark = pytest.mark.engine

EngineControl = Callable[[], Coroutine[Any, Any, None]]


@pytest.fixture
async def private_engine(engine_url: str, tmp_path: Path) -> AsyncIterator[tuple[str, EngineControl, EngineControl]]:
    """A second Podman API service of the test's own on a temporary socket, with stop and start controls."""
    if shutil.which("podman") is None:
        pytest.skip("the engine tests reach an engine, but this machine has no podman binary to run a private one")
    url = f"unix://{tmp_path}/podman.sock"
    proc: list[asyncio.subprocess.Process] = []

    async def start() -> None:
        proc.append(
            await asyncio.create_subprocess_exec(
                "podman",
                "system",
                "service",
                "--time=0",
                url,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        )
        for _ in range(100):
            if engine_unreachable_reason(url) is None:
                return
            await asyncio.sleep(0.1)
        raise AssertionError(f"the private podman service at {url} did not answer within 10 s")

    async def stop() -> None:
        p = proc.pop()
        p.send_signal(signal.SIGTERM)
        await asyncio.wait_for(p.wait(), 10)

    await start()
    try:
        yield url, stop, start
    finally:
        while proc:
            await stop()


async def test_engine_stopped_marks_the_node_unhealthy_until_it_returns(
    private_engine: tuple[str, EngineControl, EngineControl], node_name: str, engine_url: str
) -> None:
    url, stop, start = private_engine
    rt = DockerRuntime(url, node=node_name)
    job = new_job_id()
    try:
        assert await rt.healthy() == (True, None)
        await rt.launch(launch(job, node_name, [(0, [0])], command=["sh", "-c", "sleep 30"]), {})

        await stop()
        ok, reason = await rt.healthy()
        assert not ok
        assert reason is not None and f"container engine at {url} is unreachable" in reason
        with pytest.raises(EngineUnavailable, match="is unreachable"):
            await rt.launch(launch(new_job_id(), node_name, [(0, [1])]), {})
        with pytest.raises(EngineUnavailable):
            await rt.list_running()

        await start()
        assert await rt.healthy() == (True, None)
        # The rank kept running while the API was gone (the engine's monitor owns it, not the API service).
        assert [r.job_id for r in await rt.list_running()] == [job]
    finally:
        await rt.remove(job)
        await rt.close()
