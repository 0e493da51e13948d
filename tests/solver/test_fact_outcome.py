"""A reporter that waits for its fact reads its own write: the owner tells the outcome after the hot-view write.

CI caught `DELETE /v1/jobs/{id}` answered 202 and a `GET` right after showing the job PLACED, not cancel_requested:
the wait ended on the job event, which the owner publishes before it writes the record to the `jobs` KV bucket.
Here the owner's hot-view write is slowed down so that the old order shows the old record every time.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence

import pytest
from nats.aio.client import Client
from oneplus_bus.ledger import JobLedger
from oneplus_bus.streams import ensure_kv, ensure_streams
from oneplus_contracts import JobAccepted, JobCancelRequested, subjects
from oneplus_placement_solver.owner import Applied, JobOwner
from oneplus_stores.archive import JobArchive
from test_cycle_store_ops import spec


class SlowProjection(JobOwner):
    """An owner whose state save never comes (a busy or dying owner): records are only in its job events."""

    async def save(self, *, flush: bool = False) -> int:
        return 0


async def started(nc: Client, kind: type[JobOwner]) -> tuple[JobOwner, asyncio.Task[None]]:
    """An owner of `kind` on fresh streams, draining facts."""
    js = nc.jetstream()
    await ensure_streams(js)
    kv = await ensure_kv(js)
    owner = kind(js, JobArchive(js), min_age_s=3600, state_kv=kv[subjects.SOLVER_STATE_KV], nc=nc)
    await owner.bootstrap()
    return owner, asyncio.create_task(owner.run_facts())


@pytest.fixture
async def running(nc: Client) -> AsyncIterator[tuple[JobOwner, JobLedger]]:
    owner, task = await started(nc, SlowProjection)
    try:
        js = nc.jetstream()
        yield owner, JobLedger(js, await js.key_value(subjects.JOBS_KV), nc)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_a_read_after_a_waited_report_sees_the_fact(running: tuple[JobOwner, JobLedger]) -> None:
    _, ledger = running
    accepted = await ledger.report(JobAccepted(event_id="a-j1", job_id="j1", spec=spec(0)), wait_s=10.0)
    assert accepted.folded
    rec, _ = await ledger.get("j1")
    assert rec is not None and rec.state == "ACCEPTED"
    cancel = JobCancelRequested(event_id="c-j1", job_id="j1", reason="cancelled by ann", by="ann")
    assert (await ledger.report(cancel, wait_s=10.0)).folded
    rec, _ = await ledger.get("j1")
    assert rec is not None and rec.cancel_requested, "the hot view holds the cancel when the wait ends"


async def test_a_fact_the_owner_refuses_is_answered_unfolded_without_waiting_out(
    running: tuple[JobOwner, JobLedger],
) -> None:
    owner, ledger = running
    cancel = JobCancelRequested(event_id="c-none", job_id="j-none", reason="cancelled by ann", by="ann")
    # No such job: the owner refuses the cancel, and says so rather than leave the reporter to wait a minute.
    got = await asyncio.wait_for(ledger.report(cancel, wait_s=60.0), timeout=10.0)
    assert not got.folded and not got.duplicate
    assert owner.index.get("j-none") is None


async def test_the_fact_loop_stops_when_its_cancellation_comes_back_as_a_fetch_timeout(
    nc: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seen in this file's own teardown on Python 3.11: a stop that coincided with the loop's fetch timeout became a
    timeout, and the loop fetched again for ever."""
    from nats.js.client import JetStreamContext

    fetch = JetStreamContext.PullSubscription.fetch

    async def swallowing(self: JetStreamContext.PullSubscription, *args: object, **kwargs: object) -> object:
        try:
            return await fetch(self, *args, **kwargs)  # type: ignore[arg-type]
        except asyncio.CancelledError:
            raise TimeoutError from None

    monkeypatch.setattr(JetStreamContext.PullSubscription, "fetch", swallowing)
    _, task = await started(nc, JobOwner)
    await asyncio.sleep(0.3)  # inside a fetch
    task.cancel()
    done, _ = await asyncio.wait([task], timeout=10)
    monkeypatch.undo()  # the next fetch's cancellation gets through: the loop ends either way
    if not done:
        task.cancel()
        await asyncio.wait([task], timeout=10)
    assert done and task.cancelled(), "the loop went on fetching after it was stopped"


async def test_a_waiting_reporter_hears_its_outcome_before_the_owners_reactions_run(nc: Client) -> None:
    """The solver reacts to a commit (settling ended gangs, sending cancels: round trips of their own); a submission
    must not wait for the reactions to a batch it happens to share."""
    owner, task = await started(nc, JobOwner)
    release = asyncio.Event()

    async def slow_reaction(applied: Sequence[Applied]) -> None:
        await release.wait()

    owner.on_applied(slow_reaction)
    try:
        js = nc.jetstream()
        ledger = JobLedger(js, await js.key_value(subjects.JOBS_KV), nc)
        event = JobAccepted(event_id="a-j2", job_id="j2", spec=spec(0))
        got = await asyncio.wait_for(ledger.report(event, wait_s=30.0), timeout=10.0)
        assert got.folded
    finally:
        release.set()
        task.cancel()
        await asyncio.wait([task], timeout=10)
