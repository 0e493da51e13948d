"""`JobLedger.report(wait_s=...)` waits for the owner's fold on one shared subscription per event type.

The owner here is a stand-in that publishes each fact's job event as the solver's owner would (after a delay, or
never); everything goes through a real NATS JetStream.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from oneplus_bus.foldwatch import FoldWatch
from oneplus_bus.ledger import JobLedger
from oneplus_bus.streams import ensure_kv, ensure_streams
from oneplus_contracts import JobCancelRequested, JobEvent, parse_job_event, subjects


def cancel(job_id: str, n: int = 0) -> JobEvent:
    return JobCancelRequested(event_id=f"c-{job_id}-{n}", job_id=job_id, reason="test", by="alice")


@pytest.fixture
async def ledger(nc: Client) -> JobLedger:
    js = nc.jetstream()
    await ensure_streams(js)
    return JobLedger(js, (await ensure_kv(js))[subjects.JOBS_KV], nc)


@contextlib.asynccontextmanager
async def owner(nc: Client, delay: Callable[[str], float | None]) -> AsyncIterator[None]:
    """Folds every fact into its job event after `delay(job_id)` seconds (None: never)."""

    async def fold(msg: Msg) -> None:
        event = parse_job_event(msg.data)
        wait = delay(event.job_id)
        if wait is None:
            return
        await asyncio.sleep(wait)
        await nc.jetstream().publish(
            subjects.job_event(event.job_id, event.type), msg.data, stream=subjects.JOBS_STREAM
        )

    sub = await nc.subscribe(subjects.JOB_FACTS_ALL, cb=fold)
    try:
        yield
    finally:
        await sub.unsubscribe()


async def test_many_waits_share_one_subscription_and_each_sees_its_own_fold(nc: Client, ledger: JobLedger) -> None:
    jobs = [f"j-{i}" for i in range(40)]
    async with owner(nc, lambda job: 0.3 if job == "slow" else None if job == "never" else 0.0):
        got = await asyncio.gather(
            *(ledger.report(cancel(j), wait_s=2.0) for j in jobs),
            ledger.report(cancel("slow"), wait_s=2.0),
            ledger.report(cancel("never"), wait_s=0.3),
        )
    assert [r.folded for r in got] == [True] * 41 + [False]  # the never-folded one timed out, the rest were seen
    assert ledger._watch is not None
    assert list(ledger._watch._subs) == ["cancel_requested"]  # one subscription for the 42 waits
    assert ledger._watch.waiting == 0  # nothing left behind, the timed-out wait included


async def test_a_duplicate_fact_is_not_waited_for(nc: Client, ledger: JobLedger) -> None:
    async with owner(nc, lambda job: None):  # an owner that never folds: a wait would time out
        await ledger.report(cancel("dup"))
        again = await ledger.report(cancel("dup"), wait_s=5.0)
    assert again.duplicate and not again.folded
    assert ledger._watch is not None and ledger._watch.waiting == 0


async def test_an_id_a_wildcard_cannot_match_waits_on_a_subscription_of_its_own(nc: Client, ledger: JobLedger) -> None:
    assert not FoldWatch.watchable("team.a")
    assert FoldWatch.watchable("j-0123abcd")
    async with owner(nc, lambda job: 0.0):
        got = await ledger.report(cancel("team.a"), wait_s=2.0)
    assert got.folded
    assert ledger._watch is None  # the shared watch was not needed
