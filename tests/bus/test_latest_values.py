"""Reading a whole KV bucket: every live key, right after it was written, and nothing left behind."""

from __future__ import annotations

import asyncio

from nats.aio.client import Client
from oneplus_bus.ledger import latest_values
from oneplus_bus.streams import ensure_kv
from oneplus_contracts import subjects


async def test_a_read_right_after_each_write_sees_every_key(nc: Client) -> None:
    # The push watcher this replaced could report "done" before the values arrived and return nothing.
    js = nc.jetstream()
    kv = (await ensure_kv(js))[subjects.JOBS_KV]
    for i in range(60):
        await kv.put(f"job-{i:03d}", f"v{i}".encode())
        got = await latest_values(js, subjects.JOBS_KV)
        assert len(got) == i + 1, f"read after write {i} saw {len(got)} keys"
        assert got[-1] == f"v{i}".encode()


async def test_deleted_and_purged_keys_are_left_out_and_overwrites_give_the_latest(nc: Client) -> None:
    js = nc.jetstream()
    kv = (await ensure_kv(js))[subjects.JOBS_KV]
    for i in range(5):
        await kv.put(f"k{i}", b"old")
    await kv.put("k1", b"new")
    await kv.delete("k2")
    await kv.purge("k3")
    assert await latest_values(js, subjects.JOBS_KV) == [b"old", b"new", b"old"]  # k0, k1, k4 in key order


async def test_an_empty_bucket_reads_empty_at_once(nc: Client) -> None:
    js = nc.jetstream()
    await ensure_kv(js)
    assert await asyncio.wait_for(latest_values(js, subjects.TOPOLOGY_KV), timeout=2) == []


async def test_a_read_during_concurrent_writes_is_complete_and_leaves_no_consumer(nc: Client) -> None:
    js = nc.jetstream()
    kv = (await ensure_kv(js))[subjects.JOBS_KV]
    for i in range(1200):  # more than one fetch batch
        await kv.put(f"base-{i:04d}", b"x")

    async def churn() -> None:
        for i in range(300):
            await kv.put(f"base-{i % 50:04d}", b"y")  # overwrites remove the old value from the stream
            await kv.put(f"new-{i:04d}", b"z")

    writer = asyncio.create_task(churn())
    reads = [await latest_values(js, subjects.JOBS_KV) for _ in range(5)]
    await writer
    for got in reads:
        assert len(got) >= 1200  # every base key, whether or not its value was overwritten meanwhile
    assert len(await latest_values(js, subjects.JOBS_KV)) == 1500
    info = await js.stream_info(f"KV_{subjects.JOBS_KV}")
    assert info.state.consumer_count == 0
