"""Helpers shared by the tests that talk to real NATS and Redis (importable: tests/ is on sys.path)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from nats.aio.client import Client
from nats.js.errors import BucketNotFoundError, NotFoundError
from oneplus_contracts import subjects


class Servers:
    def __init__(self, nats_url: str, redis_url: str) -> None:
        self.nats_url = nats_url
        self.redis_url = redis_url


async def wipe_bus(nc: Client) -> None:
    """Delete OnePlus's streams and KV buckets so a test starts from nothing."""
    js = nc.jetstream()
    for name in subjects.STREAMS:
        with contextlib.suppress(NotFoundError):
            await js.delete_stream(name)
    for bucket in (subjects.JOBS_KV, subjects.TOPOLOGY_KV, subjects.QUEUES_KV, subjects.SOLVER_STATE_KV):
        with contextlib.suppress(NotFoundError, BucketNotFoundError):
            await js.delete_key_value(bucket)


async def until(check: Callable[[], object], timeout: float = 5.0) -> None:
    """Until `check()` is true (polled every 10 ms); AssertionError after `timeout` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.01)
