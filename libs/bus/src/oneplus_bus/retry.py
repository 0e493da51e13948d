"""Waiting out a JetStream cluster that is electing a stream's leader: its requests answer 503 or go unanswered for
a few seconds (a server killed, cut off or restarting), and a read or declaration made then is simply made again."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import nats.errors
import nats.js.errors

log = logging.getLogger("oneplus.bus")

T = TypeVar("T")

# What a JetStream request answers while a stream has no leader, or no server took the request.
TRANSIENT: tuple[type[BaseException], ...] = (
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.js.errors.ServiceUnavailableError,
    nats.js.errors.NoStreamResponseError,
)


async def until_answered(fn: Callable[[], Awaitable[T]], what: str, limit_s: float, pause_s: float = 1.0) -> T:
    """`fn()`, again after `pause_s` while JetStream answers with a transient error, for up to `limit_s`."""
    deadline = asyncio.get_running_loop().time() + limit_s
    while True:
        try:
            return await fn()
        except TRANSIENT as exc:
            if asyncio.get_running_loop().time() + pause_s > deadline:
                raise
            log.warning("%s: JetStream not answering (%s); again in %g s", what, type(exc).__name__, pause_s)
            await asyncio.sleep(pause_s)


def raise_if_cancelling() -> None:
    """Re-raise a cancellation that a timeout swallowed. On Python 3.11, `asyncio.wait_for` (which nats-py's `fetch`
    uses) can raise TimeoutError when the task is cancelled as the wait times out; a loop that treats a timeout as
    "nothing yet, fetch again" would then never stop. Call it where such a loop catches the timeout."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
