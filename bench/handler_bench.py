"""What a FastStream handler costs per request: `msg: NatsMessage` through FastStream's Context against the whole
message through `oneplus_bus.broker.whole_message_subscriber` (what the intake and every durable subscriber use).

Context is a sync dependency that fast_depends runs in a worker thread for every message. Each style answers
`--requests` concurrent requests, `--rounds` times; the process's CPU time (client and handler together, the same
client for both) and the wall time are printed per round. Uses NATS_URL when set, else the embedded nats-server.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from typing import Any

import nats
from faststream.nats import NatsBroker, NatsMessage
from oneplus_bus.broker import whole_message_subscriber

from oneplus.devstack import EmbeddedServers

CONTEXT = "bench.handler.context"
WHOLE = "bench.handler.whole"


async def bench(url: str, requests: int, rounds: int) -> None:
    broker = NatsBroker(url, logger=None)

    async def answer(msg: NatsMessage) -> dict[str, Any]:
        return {"headers": len(msg.headers or {}), "bytes": len(msg.body)}

    broker.subscriber(CONTEXT, queue="bench")(answer)
    whole_message_subscriber(broker, WHOLE, queue="bench")(answer)
    await broker.start()
    nc = await nats.connect(url)
    body, headers = b'{"name": "bench", "resources": {"gpus": 1}}', {"Oneplus-Team": "bench"}
    try:
        for subject in (CONTEXT, WHOLE):  # a first request each: subscriptions ready, imports done
            await nc.request(subject, body, headers=headers, timeout=10)
        for r in range(rounds):
            for subject in (CONTEXT, WHOLE):
                cpu, wall = time.process_time(), time.perf_counter()
                await asyncio.gather(*(nc.request(subject, body, headers=headers, timeout=60) for _ in range(requests)))
                cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
                style = "Context (worker thread)" if subject == CONTEXT else "whole_message decoder"
                print(
                    f"round {r + 1} {style:>24}: {requests:,} requests, CPU {cpu:.2f} s "
                    f"({cpu / requests * 1e6:.0f} µs each), wall {wall:.2f} s",
                    flush=True,
                )
    finally:
        await nc.close()
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
