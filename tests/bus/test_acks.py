"""An acknowledgement that never comes (its connection dropped) ends the wait instead of hanging it."""

from __future__ import annotations

import asyncio

import pytest
from nats.aio.client import Client
from nats.js.api import PubAck
from oneplus_bus.acks import wait_acks
from oneplus_bus.streams import ensure_streams
from oneplus_contracts import subjects


async def test_acks_come_back_in_order(nc: Client) -> None:
    js = nc.jetstream()
    await ensure_streams(js)
    futures = [
        await js.publish_async(subjects.RESERVATION_AUDIT, b"{}", stream=subjects.AUDIT_STREAM) for _ in range(5)
    ]
    acks = await wait_acks(futures)
    assert [a.seq for a in acks] == sorted(a.seq for a in acks) and len(set(a.seq for a in acks)) == 5


async def test_a_lost_ack_times_out_and_cancels_the_wait() -> None:
    lost: asyncio.Future[PubAck] = asyncio.get_running_loop().create_future()
    with pytest.raises(TimeoutError):
        await wait_acks([lost], timeout=0.1)
    assert lost.cancelled()
    assert await wait_acks([]) == []
