"""`StreamTail`, the informer's watch, on a real JetStream stream: messages in stream order from a sequence, a gap
in a stream followed whole answered by listing again, and a failing handler resumed from what it last folded."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import StreamConfig
from oneplus_bus.informer import StreamTail


@pytest.fixture
async def stream(nc: Client) -> AsyncIterator[tuple[JetStreamContext, str, str]]:
    js = nc.jetstream()
    name = f"TAIL_{uuid.uuid4().hex[:8]}"
    subject = f"tail.{name}"
    await js.add_stream(StreamConfig(name=name, subjects=[f"{subject}.>"]))
    try:
        yield js, name, subject
    finally:
        await js.delete_stream(name)


async def until(cond, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def test_follows_in_stream_order_from_the_sequence_after_the_one_given(
    stream: tuple[JetStreamContext, str, str],
) -> None:
    js, name, subject = stream
    for i in range(1, 6):
        await js.publish(f"{subject}.{i}", str(i).encode(), headers={"n": str(i)})
    seen: list[tuple[int, str, bytes, str]] = []

    async def handler(seq: int, subj: str, data: bytes, headers: dict[str, str]) -> None:
        await asyncio.sleep(0)  # a handler that awaits keeps the order
        seen.append((seq, subj, data, headers["n"]))

    tail = StreamTail(js, name, f"{subject}.>", handler, name="t")
    tail.start(2)
    try:
        await until(lambda: len(seen) == 3)
        for i in range(6, 206):
            await js.publish(f"{subject}.{i}", str(i).encode(), headers={"n": str(i)})
        await until(lambda: len(seen) == 203)
    finally:
        await tail.stop()
    assert [s for s, *_ in seen] == list(range(3, 206))
    assert seen[0] == (3, f"{subject}.3", b"3", "3")
    assert tail.last_seq == 205 and tail.gaps == 0


async def test_a_gap_in_a_stream_followed_whole_lists_again_and_follows_from_the_listed_sequence(
    stream: tuple[JetStreamContext, str, str],
) -> None:
    js, name, subject = stream
    for i in range(1, 4):
        await js.publish(f"{subject}.{i}", b"x")
    seen: list[int] = []
    listed: list[int] = []

    async def handler(seq: int, subj: str, data: bytes, headers: dict[str, str]) -> None:
        seen.append(seq)

    async def relist() -> int:
        last = int((await js.stream_info(name)).state.last_seq)
        listed.append(last)
        return last

    tail = StreamTail(js, name, f"{subject}.>", handler, relist=relist, whole=True, name="t")
    tail.start(0)
    try:
        await until(lambda: seen == [1, 2, 3])
        await tail.stop()
        for i in range(4, 8):
            await js.publish(f"{subject}.{i}", b"x")
        await js.delete_msg(name, 5)  # removed before the follower read it: 4, then 6
        tail.start(tail.last_seq)
        await until(lambda: listed == [7])
        await js.publish(f"{subject}.8", b"x")
        await until(lambda: seen[-1] == 8)
    finally:
        await tail.stop()
    assert seen == [1, 2, 3, 4, 8], "nothing after the gap is folded twice: the list covered 6 and 7"
    assert tail.gaps == 1 and tail.last_seq == 8


async def test_a_failing_handler_is_resumed_from_the_last_sequence_it_folded(
    stream: tuple[JetStreamContext, str, str],
) -> None:
    js, name, subject = stream
    for i in range(1, 5):
        await js.publish(f"{subject}.{i}", b"x")
    seen: list[int] = []
    failed: list[int] = []

    async def handler(seq: int, subj: str, data: bytes, headers: dict[str, str]) -> None:
        if seq == 3 and not failed:
            failed.append(seq)
            raise RuntimeError("the store was briefly away")
        seen.append(seq)

    tail = StreamTail(js, name, f"{subject}.>", handler, name="t")
    tail.start(0)
    try:
        await until(lambda: seen == [1, 2, 3, 4])
    finally:
        await tail.stop()
    assert failed == [3] and tail.last_seq == 4
