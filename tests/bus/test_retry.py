"""Reads and declarations made while a JetStream stream elects its leader are made again, within a limit; a fetch
loop stops when cancelled even if the cancellation came back as a timeout."""

from __future__ import annotations

import asyncio

import nats.errors
import nats.js.errors
import pytest
from oneplus_bus.retry import raise_if_cancelling, until_answered


class Flaky:
    def __init__(self, failures: list[BaseException]) -> None:
        self.failures = failures
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return "listed"


async def test_a_503_and_an_unanswered_request_are_asked_again() -> None:
    fn = Flaky([nats.js.errors.ServiceUnavailableError(), nats.errors.NoRespondersError(), nats.errors.TimeoutError()])
    assert await until_answered(fn, "reading", limit_s=5, pause_s=0.01) == "listed"
    assert fn.calls == 4


async def test_past_the_limit_the_last_error_is_raised() -> None:
    fn = Flaky([nats.js.errors.ServiceUnavailableError() for _ in range(100)])
    with pytest.raises(nats.js.errors.ServiceUnavailableError):
        await until_answered(fn, "reading", limit_s=0.05, pause_s=0.01)
    assert 2 <= fn.calls < 100


async def test_an_error_that_is_not_transient_is_raised_at_once() -> None:
    fn = Flaky([nats.js.errors.NotFoundError()])
    with pytest.raises(nats.js.errors.NotFoundError):
        await until_answered(fn, "reading", limit_s=5, pause_s=0.01)
    assert fn.calls == 1


async def swallowing_wait() -> None:
    """A wait whose cancellation comes out as a timeout, as Python 3.11's wait_for can do when both coincide."""
    try:
        await asyncio.sleep(10)
    except asyncio.CancelledError:
        raise TimeoutError from None


async def test_a_cancellation_that_came_back_as_a_timeout_stops_the_loop() -> None:
    rounds = 0

    async def fetch_for_ever() -> None:
        nonlocal rounds
        while True:
            rounds += 1
            try:
                await swallowing_wait()
            except TimeoutError:
                raise_if_cancelling()
                continue

    task = asyncio.create_task(fetch_for_ever())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
    assert rounds == 1


async def test_a_plain_timeout_is_not_a_cancellation() -> None:
    raise_if_cancelling()  # nothing cancelled this task: no error
