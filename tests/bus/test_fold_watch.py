"""`JobLedger.report(wait_s=...)` waits for the owner's fold on one shared subscription per event type.

The owner here is a stand-in that tells each waiting reporter its fact's outcome as the solver's owner does (after a
delay, or never); everything goes through a real NATS JetStream. tests/solver/test_fact_outcome.py runs the real
owner.
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
from oneplus_contracts import FactOutcome, JobCancelRequested, JobEvent, parse_job_event, subjects


def cancel(job_id: str, n: int = 0) -> JobEvent:
    return JobCancelRequested(event_id=f"c-{job_id}-{n}", job_id=job_id, reason="test", by="alice")


@pytest.fixture
async def ledger(nc: Client) -> JobLedger:
    js = nc.jetstream()
    await ensure_streams(js)
    return JobLedger(js, (await ensure_kv(js))[subjects.JOBS_KV], nc)


@contextlib.asynccontextmanager
async def owner(nc: Client, delay: Callable[[str], float | None]) -> AsyncIterator[None]:
    """Folds every fact into its job event after `delay(job_id)` seconds (None: never) and tells a reporter that
    waits; a job named `refused-...` has its facts refused."""

    folding: set[asyncio.Task[None]] = set()

    async def on_fact(msg: Msg) -> None:  # one task per fact: a subscription's callbacks run one at a time
        task = asyncio.create_task(fold(msg))
        folding.add(task)
        task.add_done_callback(folding.discard)

    async def fold(msg: Msg) -> None:
        event = parse_job_event(msg.data)
        wait = delay(event.job_id)
        if wait is None:
            return
        await asyncio.sleep(wait)
        applied = not event.job_id.startswith("refused-")
        if applied:
            await nc.jetstream().publish(
                subjects.job_event(event.job_id, event.type), msg.data, stream=subjects.JOBS_STREAM
            )
        if (msg.headers or {}).get(subjects.AWAIT_FOLD_HEADER):
            outcome = FactOutcome(job_id=event.job_id, event_id=event.event_id, type=event.type, applied=applied)
            await nc.publish(subjects.fact_outcome(event.job_id, event.type), outcome.model_dump_json().encode())

    sub = await nc.subscribe(subjects.JOB_FACTS_ALL, cb=on_fact)
    try:
        yield
    finally:
        await sub.unsubscribe()
        for task in folding:
            task.cancel()


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


async def test_a_refused_fact_ends_the_wait_at_once_unfolded(nc: Client, ledger: JobLedger) -> None:
    async with owner(nc, lambda job: 0.0):
        # A wait that ran to its end would take a minute: the refusal answers it.
        got = await asyncio.wait_for(ledger.report(cancel("refused-1"), wait_s=60.0), timeout=10.0)
    assert not got.folded and not got.duplicate
    assert ledger._watch is not None and ledger._watch.waiting == 0


async def test_a_fact_reported_without_a_wait_asks_for_no_outcome(nc: Client, ledger: JobLedger) -> None:
    sub = await nc.subscribe(subjects.JOB_FACTS_ALL)
    await ledger.report(cancel("quiet"))
    await ledger.report(cancel("waits"), wait_s=0.1)
    heard = [await sub.next_msg(timeout=2.0) for _ in range(2)]
    await sub.unsubscribe()
    asked = {parse_job_event(m.data).job_id: (m.headers or {}).get(subjects.AWAIT_FOLD_HEADER) for m in heard}
    assert asked == {"quiet": None, "waits": "1"}
