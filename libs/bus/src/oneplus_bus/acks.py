"""Waiting for JetStream's acknowledgements of pipelined publishes, for a bounded time.

nats-py resolves a `publish_async` future when its ack arrives; a message that went out on a connection NATS then
dropped never gets one, and its future never resolves (it has no timeout of its own). Whoever waits on it without a
bound hangs, holding whatever lock it holds: the job owner did, after a NATS restart.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from nats.js.api import PubAck

PUBLISH_ACK_TIMEOUT_S = 5.0


async def wait_acks(futures: Sequence[asyncio.Future[PubAck]], timeout: float = PUBLISH_ACK_TIMEOUT_S) -> list[PubAck]:
    """The acks of `futures`, in order; TimeoutError (and every future cancelled) when they do not all come in time."""
    if not futures:
        return []
    return list(await asyncio.wait_for(asyncio.gather(*futures), timeout))
