"""The owner takes the facts waiting in one batch, and a lone fact at once: it never waits for the next fact."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from nats.aio.client import Client
from nats.errors import TimeoutError as FetchTimeout
from nats.js.api import AckPolicy, ConsumerConfig
from oneplus_placement_solver.owner import FACT_BATCH, fetch_batch


async def puller(nc: Client) -> tuple[str, object]:
    js = nc.jetstream()
    name = f"FB{uuid.uuid4().hex[:8]}"
    await js.add_stream(name=name, subjects=[f"{name.lower()}.>"])
    sub = await js.pull_subscribe(
        f"{name.lower()}.>", durable="owner", stream=name, config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT)
    )
    return name, sub


async def test_a_lone_fact_comes_at_once_not_with_the_next_one(nc: Client) -> None:
    name, sub = await puller(nc)
    js = nc.jetstream()

    async def one_fact_later() -> None:
        await asyncio.sleep(0.2)  # the fetch is waiting by then: the case that used to wait for a second fact
        await js.publish(f"{name.lower()}.a", b"1")

    t0 = time.monotonic()
    later = asyncio.create_task(one_fact_later())
    msgs = await fetch_batch(sub, timeout=4.0)  # type: ignore[arg-type]
    waited = time.monotonic() - t0
    await later
    assert [m.data for m in msgs] == [b"1"]
    assert waited < 2.0, f"returned after {waited:.2f} s: it waited for a fact that never came"
    await js.delete_stream(name)


async def test_after_idle_timeouts_a_lone_fact_still_comes_at_once(nc: Client) -> None:
    """An owner with nothing to do times out on its fetch and asks again: then a fact used to wait for the next
    fact (or the request's expiry) before it was handed over."""
    name, sub = await puller(nc)
    js = nc.jetstream()
    for i in range(5):
        with pytest.raises((FetchTimeout, TimeoutError)):
            await fetch_batch(sub, timeout=0.2)  # type: ignore[arg-type]

        async def one_fact_later(i: int = i) -> None:
            await asyncio.sleep(0.05)
            await js.publish(f"{name.lower()}.{i}", str(i).encode())

        t0 = time.monotonic()
        later = asyncio.create_task(one_fact_later())
        msgs = await fetch_batch(sub, timeout=3.0)  # type: ignore[arg-type]
        waited = time.monotonic() - t0
        await later
        assert [m.data for m in msgs] == [str(i).encode()]
        assert waited < 1.0, f"fact {i} came after {waited:.2f} s: held back until the request expired"
        await msgs[0].ack()
    await js.delete_stream(name)


async def test_the_facts_waiting_come_in_batches_of_at_most_fact_batch_in_order(nc: Client) -> None:
    """On a quiet machine the first batch is the first FACT_BATCH facts and the second the 10 after. Under load (the
    parallel suite, the other worker busy) the rest of a batch can take longer than REST_OF_BATCH_S to arrive: the
    owner folds what came and the next fetch brings the others, in order, none lost and none twice."""
    name, sub = await puller(nc)
    js = nc.jetstream()
    for i in range(FACT_BATCH + 10):
        await js.publish(f"{name.lower()}.{i}", str(i).encode())
    batches: list[list[int]] = []
    while sum(map(len, batches)) < FACT_BATCH + 10:
        got = await fetch_batch(sub, timeout=2.0)  # type: ignore[arg-type]
        batches.append([int(m.data) for m in got])
        for m in got:
            await m.ack()
    assert [i for batch in batches for i in batch] == list(range(FACT_BATCH + 10))
    assert all(len(batch) <= FACT_BATCH for batch in batches), [len(b) for b in batches]
    assert len(batches[0]) > 1, "the facts pending behind the first came with it"
    await js.delete_stream(name)


async def test_no_fact_times_out(nc: Client) -> None:
    name, sub = await puller(nc)
    with pytest.raises((FetchTimeout, TimeoutError)):
        await fetch_batch(sub, timeout=0.3)  # type: ignore[arg-type]
    await nc.jetstream().delete_stream(name)
