"""The owner lease on a real JetStream KV bucket: one holder, renewals that never race themselves, takeover."""

from __future__ import annotations

import asyncio
import uuid

from nats.aio.client import Client
from nats.js.api import KeyValueConfig
from oneplus_bus.lease import Lease


async def bucket(nc: Client):  # type: ignore[no-untyped-def]
    return await nc.jetstream().create_key_value(KeyValueConfig(bucket=f"lease_{uuid.uuid4().hex[:8]}"))


async def test_renewals_of_one_replica_side_by_side_never_read_its_own_lease_as_lost(nc: Client) -> None:
    kv = await bucket(nc)
    lease = Lease(kv, "owner.lease", "a", ttl_s=10)
    assert await lease.try_hold()
    # A commit's renewal and the beat's at once: before, one lost the compare-and-set to the other.
    results = await asyncio.gather(*(lease.try_hold() for _ in range(8)))
    assert all(results) and lease.held and lease.holder == "a"


async def test_a_second_replica_waits_out_the_ttl_then_takes_over(nc: Client) -> None:
    kv = await bucket(nc)
    now = [0.0]
    a = Lease(kv, "owner.lease", "a", ttl_s=4, clock=lambda: now[0])
    b = Lease(kv, "owner.lease", "b", ttl_s=4, clock=lambda: now[0])
    assert await a.try_hold()
    assert not await b.try_hold() and b.holder == "a"
    now[0] = 3.0
    assert not await b.try_hold(), "a's lease has not run out on b's clock"
    now[0] = 4.5
    assert await b.try_hold() and b.holder == "b"
    assert not await a.try_hold() and a.holder == "b" and not a.held
