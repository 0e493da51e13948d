"""Fixtures for the executor's service-level tests: the engine, a private engine to stop, the platform around it.

The e2e helpers (tests/e2e/platform_fixture.py), the engine helpers (tests/executor_engine/...) and the fake NVML
(tests/topology/fake_pynvml.py) are imported from their folders, not copied.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).resolve().parents[1]
for folder in ("e2e", "executor_engine", "topology"):
    if str(TESTS / folder) not in sys.path:
        sys.path.insert(0, str(TESTS / folder))

from executor_engine_support import ENGINE_URL, engine_unreachable_reason  # noqa: E402

EngineControl = Callable[[], Coroutine[Any, Any, None]]


@pytest.fixture(scope="session")
def engine_url() -> str:
    reason = engine_unreachable_reason(ENGINE_URL)
    if reason is not None:
        pytest.skip(reason)
    assert ENGINE_URL is not None
    return ENGINE_URL


@pytest.fixture(scope="module")
def node_tag() -> str:
    """Node names of the module's own: the engine's label filter keeps them apart from everyone else's."""
    return "svc-" + uuid.uuid4().hex[:6]


@pytest.fixture
async def private_engine(engine_url: str, tmp_path: Path) -> AsyncIterator[tuple[str, EngineControl, EngineControl]]:
    """A Podman API service of the test's own on a temporary socket, with stop and start controls."""
    if shutil.which("podman") is None:
        pytest.skip("the engine answers, but this machine has no podman binary to run a private engine to stop")
    url = f"unix://{tmp_path}/podman.sock"
    procs: list[asyncio.subprocess.Process] = []

    async def start() -> None:
        procs.append(
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
        for _ in range(150):
            if engine_unreachable_reason(url) is None:
                return
            await asyncio.sleep(0.1)
        raise AssertionError(f"the private podman service at {url} did not answer within 15 s")

    async def stop() -> None:
        p = procs.pop()
        p.send_signal(signal.SIGTERM)
        await asyncio.wait_for(p.wait(), 15)

    await start()
    try:
        yield url, stop, start
    finally:
        while procs:
            await stop()
