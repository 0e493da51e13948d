"""What a FastStream handler costs per request.

Four styles, each answering `--requests` concurrent requests, `--rounds` times; the process's CPU time (client and
handler together, the same client for all) and the wall time are printed per round:

- `msg: NatsMessage` through FastStream's Context: a sync dependency that fast_depends runs in a worker thread for
  every message;
- the whole message through `oneplus_bus.broker.whole_message_subscriber` (what the intake and every durable
  subscriber use), on a bare broker;
- the same on a service's broker (`make_broker`: metrics, dead letters, tracing) whose service exports spans:
  FastStream's telemetry middleware;
- the same on a service's broker with nothing to export spans to (the default): the trace is only carried on;
- the same middlewares but FastStream's telemetry middleware in place of that, recording nothing (the default until
  the broker carried the trace on itself).

Uses NATS_URL when set, else the embedded nats-server.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from typing import Any

import nats
from faststream.nats import NatsBroker, NatsMessage
from faststream.nats.opentelemetry import NatsTelemetryMiddleware
from faststream.nats.prometheus import NatsPrometheusMiddleware
from oneplus_bus.broker import make_broker, whole_message_subscriber
from oneplus_bus.deadletter import dead_letter_middleware
from oneplus_bus.settings import BusSettings
from oneplus_bus.telemetry import make_tracer_provider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from oneplus.devstack import EmbeddedServers

STYLES = {
    "bench.handler.context": "Context (worker thread)",
    "bench.handler.whole": "whole_message, bare broker",
    "bench.handler.traced": "service broker, spans exported",
    "bench.handler.quiet": "service broker, nothing exported",
    "bench.handler.unrecorded": "FastStream telemetry, unrecorded",
}


async def bench(url: str, requests: int, rounds: int) -> None:
    settings = BusSettings(url, "redis://127.0.0.1:1")  # Redis is not touched
    exported = InMemorySpanExporter()
    brokers = {
        "bench.handler.context": NatsBroker(url, logger=None),
        "bench.handler.whole": NatsBroker(url, logger=None),
        "bench.handler.traced": make_broker(
            "bench-traced", settings, make_tracer_provider("bench-traced", [exported]), CollectorRegistry()
        ),
        "bench.handler.quiet": make_broker(
            "bench-quiet", settings, make_tracer_provider("bench-quiet"), CollectorRegistry()
        ),
        "bench.handler.unrecorded": NatsBroker(
            url,
            logger=None,
            middlewares=[
                NatsTelemetryMiddleware(tracer_provider=make_tracer_provider("bench-unrecorded")),
                NatsPrometheusMiddleware(registry=CollectorRegistry(), app_name="bench-unrecorded"),
                dead_letter_middleware(settings.max_deliver),
            ],
        ),
    }

    async def answer(msg: NatsMessage) -> dict[str, Any]:
        return {"headers": len(msg.headers or {}), "bytes": len(msg.body)}

    for subject, broker in brokers.items():
        if subject == "bench.handler.context":
            broker.subscriber(subject, queue="bench")(answer)
        else:
            whole_message_subscriber(broker, subject, queue="bench")(answer)
        await broker.start()
    nc = await nats.connect(url)
    body, headers = b'{"name": "bench", "resources": {"gpus": 1}}', {"Oneplus-Team": "bench"}
    try:
        for subject in STYLES:  # a first request each: subscriptions ready, imports done
            await nc.request(subject, body, headers=headers, timeout=10)
        for r in range(rounds):
            for subject, style in STYLES.items():
                cpu, wall = time.process_time(), time.perf_counter()
                await asyncio.gather(*(nc.request(subject, body, headers=headers, timeout=60) for _ in range(requests)))
                cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
                print(
                    f"round {r + 1} {style:>32}: {requests:,} requests, CPU {cpu:.2f} s "
                    f"({cpu / requests * 1e6:.0f} µs each), wall {wall:.2f} s",
                    flush=True,
                )
                exported.clear()
    finally:
        await nc.close()
        for broker in brokers.values():
            await broker.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--requests", type=int, default=3000, help="concurrent requests per round and style")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    url = os.environ.get("NATS_URL")
    servers = None if url else EmbeddedServers().start()
    try:
        asyncio.run(bench(url or servers.nats_url, args.requests, args.rounds))  # type: ignore[union-attr]
    finally:
        if servers is not None:
            servers.stop()


if __name__ == "__main__":
    main()
