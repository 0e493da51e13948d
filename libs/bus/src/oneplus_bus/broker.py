"""One FastStream NATS broker per service, with tracing, metrics and dead letters wired the same way."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from faststream._internal.middlewares import BaseMiddleware
from faststream.message import StreamMessage
from faststream.nats import NatsBroker
from faststream.nats.message import NatsMessage
from faststream.nats.opentelemetry import NatsTelemetryMiddleware
from faststream.nats.prometheus import NatsPrometheusMiddleware
from opentelemetry import context, propagate, trace
from opentelemetry.sdk.trace import TracerProvider
from prometheus_client import CollectorRegistry

from .deadletter import count_dead_letters, dead_letter_middleware
from .logs import FASTSTREAM_LOGGER
from .settings import BusSettings
from .telemetry import inject, records_spans

R = TypeVar("R")
MessageHandler = Callable[[NatsMessage], Awaitable[Any]]
H = TypeVar("H", bound=MessageHandler)


def trace_context_middleware(tracer_provider: TracerProvider) -> type[BaseMiddleware]:
    """The message's trace carried on without building spans, for a provider that exports none.

    A handler runs inside the trace its message carries (a new one when it carries none), so its logs and the
    messages it sends name that trace, as under FastStream's telemetry middleware. That middleware builds two spans,
    their attributes and baggage for every message even when none is recorded: about 55 µs a request (bench:handler),
    8% of the intake's CPU in a burst (docs/scale.md)."""
    tracer = tracer_provider.get_tracer("oneplus.bus")

    class TraceContextMiddleware(BaseMiddleware):
        async def consume_scope(self, call_next: Any, msg: Any) -> Any:
            parent = propagate.extract(msg.headers or {})
            if trace.get_current_span(parent).get_span_context().is_valid:
                token = context.attach(parent)  # the sender's span stays the current one: no span of ours is kept
                try:
                    return await call_next(msg)
                finally:
                    context.detach(token)
            name = f"{getattr(msg.raw_message, 'subject', '')} process"
            with tracer.start_as_current_span(name, kind=trace.SpanKind.CONSUMER):  # a new trace, never recorded
                return await call_next(msg)

        async def publish_scope(self, call_next: Any, cmd: Any) -> Any:
            if "traceparent" not in cmd.headers:
                inject(cmd.headers)
            return await call_next(cmd)

    return TraceContextMiddleware


def make_broker(
    service: str,
    settings: BusSettings,
    tracer_provider: TracerProvider,
    registry: CollectorRegistry | None = None,
) -> NatsBroker:
    telemetry: object = (
        NatsTelemetryMiddleware(tracer_provider=tracer_provider)
        if records_spans(tracer_provider)
        else trace_context_middleware(tracer_provider)
    )
    middlewares: list[object] = [telemetry, dead_letter_middleware(settings.max_deliver)]
    if registry is not None:
        middlewares.insert(1, NatsPrometheusMiddleware(registry=registry, app_name=service))
    broker = NatsBroker(
        # Every server of NATS_URL (comma-separated): the broker fails over between a cluster's servers.
        servers=settings.nats_servers,
        name=f"oneplus-{service}",
        middlewares=middlewares,  # type: ignore[arg-type]
        max_reconnect_attempts=-1,
        reconnect_time_wait=1,
        graceful_timeout=5.0,
        inbox_prefix=settings.inbox_prefix,
        # "Received" and "Processed" for every message are two log lines per job event at INFO: debug detail at scale.
        log_level=logging.DEBUG,
        # A plain logger under the root's handler (ONEPLUS_LOG_LEVEL/FORMAT), not FastStream's coloured stdout one.
        logger=logging.getLogger(FASTSTREAM_LOGGER),
    )
    if registry is not None:
        count_dead_letters(broker, registry)
    return broker


async def whole_message(msg: StreamMessage[Any]) -> StreamMessage[Any]:
    """A subscriber decoder that hands the handler the message itself: headers, body and JetStream metadata."""
    return msg


def takes_whole_message(
    handler: Callable[[NatsMessage], Awaitable[R]],
) -> Callable[[Any], Awaitable[R]]:
    """`handler` for a subscriber with `decoder=whole_message`, without FastStream's `Context` injection.

    A `msg: NatsMessage` parameter is resolved by a sync Context dependency that fast_depends runs in a worker thread
    for every message: 460-700 µs of CPU per request that way against 140-160 µs here (`task bench:handler`)."""

    async def call(msg: Any) -> R:  # Any: FastStream refuses the message class itself as an annotation
        try:
            return await handler(msg)
        finally:
            # FastStream caches the decoder's result on the message, and here that result is the message itself: a
            # cycle that left every message to the cyclic collector. Cleared, it goes when its consumer is done.
            if isinstance(msg, StreamMessage):
                msg.clear_cache()

    call.__name__ = getattr(handler, "__name__", "handler")
    call.__qualname__ = getattr(handler, "__qualname__", call.__name__)
    call.__doc__ = handler.__doc__
    return call


def whole_message_subscriber(broker: NatsBroker, subject: str, **options: Any) -> Callable[[H], H]:
    """`broker.subscriber(subject, **options)` whose handler is given the whole message (`takes_whole_message`);
    registering returns the handler itself."""
    subscriber = broker.subscriber(subject, decoder=whole_message, **options)

    def register(fn: H) -> H:
        subscriber(takes_whole_message(fn))
        return fn

    return register
