"""Reads and declarations made while a JetStream stream elects its leader are made again, within a limit."""

from __future__ import annotations

import nats.errors
import nats.js.errors
import pytest
from oneplus_bus.retry import until_answered


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
