from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import executor_engine_support
import pytest
from oneplus_node_executor.runtime.docker import DockerRuntime

engine_url = executor_engine_support.engine_url  # the shared fixture: skips with the reason when no engine answers


@pytest.fixture
def node_name() -> str:
    """A node name of its own per test: the label filter keeps tests (and other users of the engine) apart."""
    return "test-" + uuid.uuid4().hex[:8]


@pytest.fixture
async def runtime(engine_url: str, node_name: str) -> AsyncIterator[DockerRuntime]:
    rt = DockerRuntime(engine_url, node=node_name)
    try:
        yield rt
    finally:
        await remove_node_containers(engine_url, node_name)
        await rt.close()


async def remove_node_containers(url: str, node: str) -> None:
    cleaner = DockerRuntime(url, node=node)
    try:
        for ranks in await cleaner.list_managed():
            await cleaner.remove(ranks.job_id)
    finally:
        await cleaner.close()
