"""Facts sent straight to the job owner (issue 42): no append of their own, answered once their event is committed.

The executor's outbox holds a fact until the owner answers (`JobLedger.deliver`); the owner folds the requests that
wait in batches and answers each once its commit is durable. A resent fact is folded once; a fact about a job the
owner may not know yet (an earlier owner's facts still out) is asked for again, not refused; an owner killed with
facts unanswered leaves them to the next one, which answers the resends.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import pytest
from nats.aio.client import Client
from nats.js.kv import KeyValue
from oneplus_bus.ledger import JobLedger, NotDelivered, read_stream
from oneplus_bus.streams import ensure_kv, ensure_streams
from oneplus_contracts import (
    Allocation,
    JobAccepted,
    JobNodeFinished,
    JobPlaced,
    JobPreempting,
    JobRunning,
    JobStarting,
    RankPlacement,
    parse_job_event,
    subjects,
)
from oneplus_node_executor.outbox import Outbox, fact_sender
from oneplus_placement_solver.owner import JobOwner
from oneplus_stores.archive import JobArchive
from test_cycle_store_ops import spec


async def placed_jobs(owner: JobOwner, n: int) -> None:
    """`n` one-GPU jobs accepted and placed, eight a node (n0, n1, ...), with token 1 (the owner's own commits)."""
    for i in range(n):
        alloc = Allocation(ranks=[RankPlacement(rank=0, node=f"n{i // 8}", gpus=[i % 8], cpus=1, memory_mb=64)])
        await owner.commit(
            JobAccepted(event_id=f"a-{i}", job_id=f"d{i}", spec=spec(i, 1)),
            JobPlaced(event_id=f"p-{i}", job_id=f"d{i}", allocation=alloc, token=1),
        )


async def job_events(nc: Client, job_id: str) -> list[str]:
    rows = await read_stream(nc.jetstream(), subjects.JOBS_STREAM, 1)
    return [e.type for e in (parse_job_event(d) for _, d, _ in rows) if e.job_id == job_id]


async def facts_appended(nc: Client) -> int:
    return (await nc.jetstream().stream_info(subjects.FACTS_STREAM)).state.last_seq


@contextlib.asynccontextmanager
async def answering(owner: JobOwner) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(owner.run_reports())
    await asyncio.sleep(0.1)  # subscribed
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def fresh(nc: Client) -> tuple[JobLedger, dict[str, KeyValue]]:
    js = nc.jetstream()
    await ensure_streams(js)
    kv = await ensure_kv(js)
    return JobLedger(js, kv[subjects.JOBS_KV], nc), kv


def new_owner(nc: Client, kv: dict[str, KeyValue], me: str) -> JobOwner:
    js = nc.jetstream()
    return JobOwner(js, JobArchive(js), min_age_s=3600, state_kv=kv[subjects.SOLVER_STATE_KV], nc=nc, me=me)


async def test_a_direct_report_is_answered_once_its_event_is_committed_and_appends_no_fact(nc: Client) -> None:
    ledger, kv = await fresh(nc)
    owner = new_owner(nc, kv, "o1")
    await owner.bootstrap()
    await placed_jobs(owner, 1)
    before = await facts_appended(nc)
    async with answering(owner):
        got = await ledger.deliver(JobStarting(event_id="s-d0", job_id="d0", node="n0", token=1))
        assert got.folded and await job_events(nc, "d0") == ["accepted", "placed", "starting"]
        again = await ledger.deliver(JobStarting(event_id="s-d0", job_id="d0", node="n0", token=1))
        assert not again.folded, "a resent fact is folded once"
        stale = await ledger.deliver(JobRunning(event_id="r-d0-9", job_id="d0", node="n0", token=9))
        assert not stale.folded, "a fact of another attempt is refused, and answered"
    assert await job_events(nc, "d0") == ["accepted", "placed", "starting"]
    assert owner.index.get("d0").state == "STARTING"  # type: ignore[union-attr]
    assert await facts_appended(nc) == before, "no append to the facts stream"


async def test_reports_that_wait_are_folded_in_batches_not_one_commit_each(
    nc: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger, kv = await fresh(nc)
    owner = new_owner(nc, kv, "o1")
    await owner.bootstrap()
    await placed_jobs(owner, 100)
    commits = 0
    original = owner.commit

    async def counted(*a, **kw):  # type: ignore[no-untyped-def]
        nonlocal commits
        commits += 1
        return await original(*a, **kw)

    monkeypatch.setattr(owner, "commit", counted)
    async with answering(owner):
        facts = [JobStarting(event_id=f"s-d{i}", job_id=f"d{i}", node=f"n{i // 8}", token=1) for i in range(100)]
        got = await asyncio.gather(*(ledger.deliver(f) for f in facts))
    assert all(r.folded for r in got)
    assert commits <= 20, f"{commits} commits for 100 reports sent at once"
    assert all(owner.index.get(f"d{i}").state == "STARTING" for i in range(100))  # type: ignore[union-attr]


async def test_with_no_owner_or_an_owner_catching_up_the_fact_stays_with_the_reporter(nc: Client) -> None:
    ledger, kv = await fresh(nc)
    fact = JobStarting(event_id="s-x", job_id="x", node="n0", token=1)
    with pytest.raises(NotDelivered, match="no job owner answered"):
        await ledger.deliver(fact, timeout=1.0)
    owner = new_owner(nc, kv, "o1")
    await owner.bootstrap()
    owner.facts_back_at = time.time() + 60  # an earlier owner's facts are still out: `x` may be among them
    async with answering(owner):
        with pytest.raises(NotDelivered, match="asks again later"):
            await ledger.deliver(fact)
    assert owner.index.get("x") is None and owner.refused.labels("starting")._value.get() == 0


async def test_an_outbox_resends_to_the_next_owner_what_a_killed_one_left_unanswered(
    nc: Client, tmp_path: object
) -> None:
    ledger, kv = await fresh(nc)
    first = new_owner(nc, kv, "o1")
    await first.bootstrap()
    await placed_jobs(first, 2)
    box = Outbox(fact_sender(lambda: ledger, "direct"), None, max_backoff_s=0.2)
    async with answering(first):
        box.put(JobStarting(event_id="s-d0", job_id="d0", node="n0", token=1))
        assert await box.flush(5)
    # The owner dies; the nodes go on reporting, in order, while no owner answers.
    box.put(JobRunning(event_id="r-d0", job_id="d0", node="n0", token=1))
    box.put(JobNodeFinished(event_id="f-d0", job_id="d0", node="n0", token=1, exit_code=0, reason="exit 0"))
    box.put(JobStarting(event_id="s-d1", job_id="d1", node="n0", token=1))
    assert not await box.flush(1.0) and len(box.pending) == 3
    second = new_owner(nc, kv, "o2")
    await second.bootstrap()
    async with answering(second):
        assert await box.flush(10), "the next owner answered the resends"
    assert await job_events(nc, "d0") == ["accepted", "placed", "starting", "running", "node_finished"]
    assert await job_events(nc, "d1") == ["accepted", "placed", "starting"]
    await box.close()


async def test_a_direct_report_waits_for_the_stream_facts_stored_before_it(nc: Client) -> None:
    """Seen in the fenced chaos run: the preemption service stores `preempting` in the facts stream, then tells the
    node to stop; the node's `node_finished` (exit 143), sent straight to the owner, was folded first and the job
    FAILED instead of being requeued. A batch of direct reports now waits for the stream's earlier facts."""
    ledger, kv = await fresh(nc)
    owner = new_owner(nc, kv, "o1")
    await owner.bootstrap()
    await placed_jobs(owner, 1)
    await owner.commit(JobRunning(event_id="r-d0", job_id="d0", node="n0", token=1))
    assert await owner.drain_facts() == 0  # the facts consumer exists; the owner's stream loop is not running
    await ledger.report(JobPreempting(event_id="pre-d0", job_id="d0", token=1, reason="preempted for d9"))
    async with answering(owner):
        end = JobNodeFinished(event_id="f-d0", job_id="d0", node="n0", token=1, exit_code=143, reason="preempted")
        sent = asyncio.create_task(ledger.deliver(end))
        await asyncio.sleep(0.3)
        assert not sent.done(), "the node's end waits for the preemption stored before it"
        assert await owner.drain_facts() == 1
        assert (await sent).folded
    assert await job_events(nc, "d0") == ["accepted", "placed", "running", "preempting", "node_finished"]


def test_an_unknown_way_to_send_facts_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="ONEPLUS_EXECUTOR_FACTS must be one of direct, stream, not 'carrier'"):
        fact_sender(lambda: None, "carrier")  # type: ignore[arg-type, return-value]
