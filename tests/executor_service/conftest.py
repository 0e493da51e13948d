"""Fixtures for the executor's service-level tests: the engine, a private engine to stop, the platform around it.

The e2e helpers (tests/e2e/platform_fixture.py), the engine helpers (tests/executor_engine/...) and the fake NVML
(tests/topology/fake_pynvml.py) are imported from their folders, not copied.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
for folder in ("e2e", "executor_engine", "topology"):
    if str(TESTS / folder) not in sys.path:
        sys.path.insert(0, str(TESTS / folder))

import executor_engine_support  # noqa: E402
from executor_engine_support import EngineControl, private_podman  # noqa: E402

engine_url = executor_engine_support.engine_url  # the shared fixture: skips with the reason when no engine answers


@pytest.fixture(scope="module")
def node_tag() -> str:
    """Node names of the module's own: the engine's label filter keeps them apart from everyone else's."""
    return "svc-" + uuid.uuid4().hex[:6]


@pytest.fixture
async def private_engine(engine_url: str, tmp_path: Path) -> AsyncIterator[tuple[str, EngineControl, EngineControl]]:
    """A Podman API service of the test's own on a temporary socket, with stop and start controls."""
    async with private_podman(tmp_path) as engine:
        yield engine


@pytest.fixture(autouse=True)
async def close_fake_executors() -> AsyncIterator[None]:
    """Executors made by executor_fakes.executor(): their outbox senders end with the test."""
    import executor_fakes

    yield
    for ex in executor_fakes.CREATED:
        ex.closing = True
        await ex.outbox.close(flush_s=0)
    executor_fakes.CREATED.clear()
