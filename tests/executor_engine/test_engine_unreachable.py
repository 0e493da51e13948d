"""Without any engine the runtime says so, with the address it tried; no engine is needed for this test."""

from __future__ import annotations

from pathlib import Path

import pytest
from executor_engine_support import launch, new_job_id
from oneplus_node_executor.runtime.base import EngineUnavailable
from oneplus_node_executor.runtime.docker import DockerRuntime


async def test_no_engine_at_all_gives_a_clear_reason(tmp_path: Path) -> None:
    rt = DockerRuntime(f"unix://{tmp_path}/absent.sock", node="n")
    try:
        ok, reason = await rt.healthy()
        assert not ok
        assert reason is not None and f"unix://{tmp_path}/absent.sock is unreachable (ping)" in reason
        with pytest.raises(EngineUnavailable, match=r"unreachable \(listing containers\)"):
            await rt.launch(launch(new_job_id(), "n", [(0, [0])]), {})
    finally:
        await rt.close()
