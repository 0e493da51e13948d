"""The engine goes away and comes back: the node reports unhealthy with the reason, then healthy again."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from executor_engine_support import EngineControl, launch, new_job_id, private_podman
from oneplus_node_executor.runtime.base import EngineUnavailable
from oneplus_node_executor.runtime.docker import DockerRuntime
from oneplus_testing import DEPENDENCY_FAULTS

pytestmark = [pytest.mark.engine, DEPENDENCY_FAULTS]


@pytest.fixture
async def private_engine(engine_url: str, tmp_path: Path) -> AsyncIterator[tuple[str, EngineControl, EngineControl]]:
    """A Podman API service of the test's own on a temporary socket, with stop and start controls."""
    async with private_podman(tmp_path) as engine:
        yield engine


async def test_engine_stopped_marks_the_node_unhealthy_until_it_returns(
    private_engine: tuple[str, EngineControl, EngineControl], node_name: str, engine_url: str
) -> None:
    url, stop, start = private_engine
    # The executor's own ping timeout (app.py): the default 3 s is tight on a loaded CI host.
    rt = DockerRuntime(url, node=node_name, ping_timeout_s=5.0)
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
