"""Handlers get the whole message from the `whole_message` decoder, not through FastStream's Context (a worker
thread per message): headers, body and JetStream metadata for durable subscribers; the reply for request/reply."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import weakref
from typing import Any

from faststream.nats import NatsMessage
from nats.aio.client import Client
from oneplus_bus.broker import takes_whole_message, whole_message_subscriber
from oneplus_bus.service import OneplusService
from oneplus_bus.settings import BusSettings
from oneplus_contracts import subjects
from oneplus_testing import Servers


async def test_a_durable_subscriber_gets_headers_body_and_stream_metadata(nc: Client, servers: Servers) -> None:
    svc = OneplusService("whole-message-test", "test", BusSettings(servers.nats_url, servers.redis_url))
    got: asyncio.Queue[NatsMessage] = asyncio.Queue()

    @svc.durable_subscriber(
        subjects.PREEMPTION_REQUEST, stream=subjects.COMMANDS_STREAM, consumer="whole-message-test", title="t"
    )
    async def on_request(msg: NatsMessage) -> None:
        await got.put(msg)

    await svc.app.start()
    try:
        ack = await nc.jetstream().publish(
            subjects.PREEMPTION_REQUEST, b"\xff not json", headers={"Oneplus-Test": "yes"}
        )
        msg = await asyncio.wait_for(got.get(), 10)
    finally:
        await svc.app.stop()
    assert msg.body == b"\xff not json", "the body is handed over as it came, undecoded"
    assert (msg.headers or {}).get("Oneplus-Test") == "yes"
    assert msg.raw_message.metadata.sequence.stream == ack.seq
    assert on_request.__name__ == "on_request", "registering returns the handler itself"


async def test_a_request_handler_answers_through_the_decoder(nc: Client, servers: Servers) -> None:
    svc = OneplusService("whole-message-reply", "test", BusSettings(servers.nats_url, servers.redis_url))

    async def answer(msg: NatsMessage) -> dict[str, Any]:
        return {"team": (msg.headers or {}).get("Oneplus-Team"), "bytes": len(msg.body)}

    whole_message_subscriber(svc.broker, "oneplus.test.whole", queue="t")(answer)
    await svc.app.start()
    try:
        reply = await nc.request("oneplus.test.whole", b"12345", headers={"Oneplus-Team": "nlp"}, timeout=10)
    finally:
        await svc.app.stop()
    assert reply.data == b'{"team":"nlp","bytes":5}'


async def test_a_handled_message_is_freed_without_the_cyclic_collector(nc: Client, servers: Servers) -> None:
    """The decoder's result is the message, which FastStream caches on the message: unbroken, that cycle kept every
    consumed message (body, headers, raw NATS message) alive until a collection found it."""
    svc = OneplusService("whole-message-free", "test", BusSettings(servers.nats_url, servers.redis_url))
    handled: list[int] = []
    freed: list[int] = []
    all_freed = asyncio.Event()

    def gone(i: int) -> None:
        freed.append(i)
        if len(freed) == 3:
            all_freed.set()

    async def answer(msg: NatsMessage) -> dict[str, Any]:
        handled.append(len(msg.body))
        weakref.finalize(msg, gone, len(msg.body))
        return {"bytes": len(msg.body)}

    whole_message_subscriber(svc.broker, "oneplus.test.whole.free", queue="t")(answer)
    await svc.app.start()
    gc.disable()  # only reference counting may free the messages now
    try:
        for i in range(1, 4):
            reply = await nc.request("oneplus.test.whole.free", b"x" * i, timeout=10)
            assert reply.data == b'{"bytes":%d}' % i
        with contextlib.suppress(TimeoutError):  # the consumer finishes its middlewares after the reply is out
            await asyncio.wait_for(all_freed.wait(), 2.0)
    finally:
        gc.enable()
        await svc.app.stop()
    assert handled == [1, 2, 3]
    assert sorted(freed) == [1, 2, 3], f"messages {sorted(set(handled) - set(freed))} wait for the cyclic collector"


def test_the_wrapper_keeps_the_handlers_name_and_hides_its_annotation() -> None:
    async def on_thing(msg: NatsMessage) -> None:
        """Does a thing."""

    wrapped = takes_whole_message(on_thing)
    assert (wrapped.__name__, wrapped.__doc__) == ("on_thing", "Does a thing.")
    # FastStream refuses the message class as an annotation, and a Context one would bring the worker thread back.
    assert wrapped.__annotations__["msg"] in (Any, "Any")
    assert not hasattr(wrapped, "__wrapped__")
