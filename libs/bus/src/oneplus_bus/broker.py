"""One FastStream NATS broker per service, with tracing, metrics and dead letters wired the same way."""

from __future__ import annotations

import logging

from faststream.nats import NatsBroker
from faststream.nats.opentelemetry import NatsTelemetryMiddleware
from faststream.nats.prometheus import NatsPrometheusMiddleware
from opentelemetry.sdk.trace import TracerProvider
from prometheus_client import CollectorRegistry

from .deadletter import count_dead_letters, dead_letter_middleware
from .logs import FASTSTREAM_LOGGER
from .settings import BusSettings


def make_broker(
    service: str,
    settings: BusSettings,
    tracer_provider: TracerProvider,
    registry: CollectorRegistry | None = None,
) -> NatsBroker:
    middlewares: list[object] = [
        NatsTelemetryMiddleware(tracer_provider=tracer_provider),
        dead_letter_middleware(settings.max_deliver),
    ]
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
