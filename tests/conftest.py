"""Shared fixtures: a real NATS JetStream and a real Redis.

When NATS_URL / REDIS_URL are set the tests use those servers (and wipe OnePlus's streams, buckets
and keys there first); otherwise they start the embedded default from the wheels, once per session. Under
pytest-xdist (`-n 2`, what `task test` runs) a session is one worker: each worker gets its own embedded NATS
and Redis, so the wipes of one never reach another; with NATS_URL / REDIS_URL set the run refuses more than
one worker (the servers would be shared).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import nats
import pytest
import redis.asyncio as aioredis
from nats.aio.client import Client
from oneplus_reservations import ReservationStore
from oneplus_testing import (
    Servers,
    give_items_their_own_ids,
    group_by_module,
    parallel_refusal,
    planned_workers,
    put_groups_in_ids,
    wipe_bus,
)

from oneplus.devstack import EmbeddedServers


def pytest_configure(config: pytest.Config) -> None:
    workers = planned_workers(getattr(config.option, "dist", "no"), getattr(config.option, "tx", None) or [])
    why = parallel_refusal(workers, os.environ)
    if why is not None:
        raise pytest.UsageError(why)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    give_items_their_own_ids(items)  # before pytest-xdist reads the ids: it runs one test per id
    if getattr(config.option, "loadgroup", False):  # an xdist worker under --dist loadgroup (a serial run keeps ids)
        group_by_module(items)
        put_groups_in_ids(items)


@pytest.fixture(scope="session", autouse=True)
def state_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A state folder per session (per xdist worker): executors made without a state dir keep their outbox under
    $XDG_STATE_HOME, which would otherwise be the user's home, shared by every worker and every earlier run."""
    home = tmp_path_factory.mktemp("state-home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_STATE_HOME", str(home))
        for name in ("ONEPLUS_STATE_HOME", "ONEPLUS_STATE_DIR"):  # each would point every executor at one folder
            mp.delenv(name, raising=False)
        yield home


@pytest.fixture(scope="session")
def servers() -> Iterator[Servers]:
    nats_url, redis_url = os.environ.get("NATS_URL"), os.environ.get("REDIS_URL")
    embedded = None
    if not nats_url or not redis_url:
        embedded = EmbeddedServers().start()
    try:
        yield Servers(nats_url or embedded.nats_url, redis_url or embedded.redis_url)  # type: ignore[union-attr]
    finally:
        if embedded is not None:
            embedded.stop()


@pytest.fixture
async def nc(servers: Servers) -> AsyncIterator[Client]:
    client = await nats.connect(servers.nats_url)
    await wipe_bus(client)
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
async def bus(servers: Servers) -> AsyncIterator[Client]:
    """A connection that leaves the streams as they are (for tests of a running platform)."""
    client = await nats.connect(servers.nats_url)
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
async def store(servers: Servers) -> AsyncIterator[ReservationStore]:
    s = ReservationStore(aioredis.Redis.from_url(servers.redis_url), cluster=f"t{uuid.uuid4().hex[:8]}")
    await s.set_epoch(1)  # what a solver does on its first start: the store takes commits from then on
    try:
        yield s
    finally:
        await s.wipe()
        await s.close()


@pytest.fixture
def cluster_name() -> str:
    return f"t{uuid.uuid4().hex[:8]}"
