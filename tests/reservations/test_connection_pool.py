"""More Redis commands at once than the client's pool holds wait for a connection instead of failing.

The scale benchmark caught a simulated fleet's launches on hundreds of nodes at once failing with redis-py's
"Too many connections" (its default pool raises past 100 connections); each failed launch went back to JetStream
and came again 0.2 s later.
"""

from __future__ import annotations

import asyncio
import uuid

from oneplus_reservations import ReservationStore
from oneplus_reservations.connect import MAX_CONNECTIONS, RedisSettings, client_for_url, redis_client
from oneplus_testing import Servers


async def test_commands_beyond_the_pool_wait_for_a_connection(servers: Servers) -> None:
    client = client_for_url(servers.redis_url)
    key = f"pool-test-{uuid.uuid4().hex}"
    try:
        # Each BLPOP holds its connection for 50 ms: more of them than the pool has must queue, not fail.
        got = await asyncio.gather(*(client.blpop([key], timeout=0.05) for _ in range(MAX_CONNECTIONS * 2 + 10)))
        assert got == [None] * (MAX_CONNECTIONS * 2 + 10)
        assert len(client.connection_pool._in_use_connections) == 0  # every connection came back
    finally:
        await client.aclose()


async def test_the_services_client_and_the_stores_shortcut_use_the_waiting_pool(servers: Servers) -> None:
    for client in (
        redis_client(RedisSettings(url=servers.redis_url)),
        ReservationStore.from_url(servers.redis_url).r,
    ):
        try:
            assert client.connection_pool.max_connections == MAX_CONNECTIONS
            assert await client.ping()
        finally:
            await client.aclose()
