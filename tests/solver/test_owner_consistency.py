"""The job owner's records never lag the stream it publishes to, whatever the bus cuts off.

CI's chaos run found a replay of the job stream that disagreed with the records: the stream held a `node_finished`
after a requeue the owner's index never had. A commit whose acknowledgements were cut off (NATS killed) may have
stored its events; and a crash mid-projection may leave some of the last commit's records out of the hot view.
"""

from __future__ import annotations

import time

import pytest
from nats.aio.client import Client
from oneplus_bus import fencing
from oneplus_bus.ledger import latest_items, read_stream
from oneplus_bus.streams import ensure_kv, ensure_streams
from oneplus_contracts import (
    Allocation,
    JobAccepted,
    JobFinished,
    JobPlaced,
    JobRequeued,
    RankPlacement,
    apply_event,
    parse_job_event,
    subjects,
)
from oneplus_placement_solver.owner import JobOwner
from oneplus_stores.archive import JobArchive
from test_cycle_store_ops import spec


async def new_owner(nc: Client) -> JobOwner:
    js = nc.jetstream()
    await ensure_streams(js)
    kv = await ensure_kv(js)
    owner = JobOwner(js, JobArchive(js), min_age_s=3600, state_kv=kv[subjects.SOLVER_STATE_KV])
    await owner.bootstrap()
    return owner


def cancelled(job_id: str) -> JobFinished:
    return JobFinished(event_id=f"c-{job_id}", job_id=job_id, state="CANCELLED", reason="cancelled by test")


async def test_a_restart_replays_the_records_of_the_last_commit_that_never_reached_the_hot_view(nc: Client) -> None:
    owner = await new_owner(nc)
    await owner.commit(*[JobAccepted(event_id=f"a-{j}", job_id=j, spec=spec(0)) for j in ("a", "b")])
    await owner.expire()  # saves the projected sequence, as each expire tick does
    before = owner.index.get("a")
    await owner.commit(cancelled("a"), cancelled("b"))
    # A crash in the save of that commit's records: b's landed, a's did not.
    kv = await nc.jetstream().key_value(subjects.JOBS_KV)
    await kv.put("a", before.model_dump_json().encode())

    again = await new_owner(nc)
    assert again.index.get("a").state == "CANCELLED", "replayed from the last wholly projected sequence"
    assert again.index.get("b").state == "CANCELLED"
    assert "a" not in again.index.pending
    await again.save(flush=True)
    archived = await JobArchive(nc.jetstream()).get("a")
    assert archived is not None and archived.state == "CANCELLED", "and saved by the successor"
    assert "a" not in dict(await latest_items(nc.jetstream(), subjects.JOBS_KV)), "its stale live record purged"


async def test_a_commit_whose_acks_were_cut_off_is_caught_up_before_the_next_fold(
    nc: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    owner = await new_owner(nc)
    await owner.commit(JobAccepted(event_id="a-x", job_id="x", spec=spec(0)))
    real = fencing.wait_acks  # the owner's writes wait for their acks through its fence
    calls = 0

    async def cut_off(futures):  # type: ignore[no-untyped-def]
        nonlocal calls
        calls += 1
        got = await real(futures)  # stored by the server...
        if calls == 1:
            raise TimeoutError("nats: timeout")  # ...but the acknowledgement never came back
        return got

    monkeypatch.setattr(fencing, "wait_acks", cut_off)
    with pytest.raises(TimeoutError):
        await owner.commit(cancelled("x"))
    assert owner.index.get("x").state == "ACCEPTED" and owner.stale
    # The next commit folds the stored event first: the index never decides on a state the stream has left.
    await owner.commit(JobAccepted(event_id="a-y", job_id="y", spec=spec(1)))
    assert owner.index.get("x").state == "CANCELLED" and not owner.stale
    # The fact redelivered after the failed commit is refused, not published a second time.
    assert await owner.commit(cancelled("x")) == [None]
    events = [parse_job_event(d) for _, d, _ in await read_stream(nc.jetstream(), subjects.JOBS_STREAM, 1)]
    assert [(e.job_id, e.type) for e in events] == [("x", "accepted"), ("x", "finished"), ("y", "accepted")]


async def test_a_commit_cut_off_between_two_publishes_is_caught_up_before_the_next_fold(nc: Client) -> None:
    # CI's chaos run: the stream held a preemption's `requeued` the owner never folded, then reconcile's second
    # `requeued` of the same attempt, which a replay refuses. The bus dropped while a batch was being published:
    # the first event was sent (and stored once nats-py reconnected), the second publish raised.
    owner = await new_owner(nc)
    await owner.commit(*[JobAccepted(event_id=f"a-{j}", job_id=j, spec=spec(0)) for j in ("p", "q")])
    real = owner.fence.publisher  # the owner's writes go out through its fence's publisher
    sent = 0

    class DroppedMidBatch:
        async def publish(self, *args: object, **kw: object) -> object:
            nonlocal sent
            sent += 1
            if sent == 2:
                raise ConnectionError("nats: connection closed")
            return await real.publish(*args, **kw)  # type: ignore[arg-type]

    owner.fence.publisher = DroppedMidBatch()  # type: ignore[assignment]
    with pytest.raises(ConnectionError):
        await owner.commit(cancelled("p"), cancelled("q"))
    owner.fence.publisher = real
    # p's `finished` went out before the second publish failed: it is in the stream, and the index never folded it.
    assert owner.index.get("p").state == "ACCEPTED" and owner.stale
    await owner.commit(JobAccepted(event_id="a-r", job_id="r", spec=spec(1)))
    assert owner.index.get("p").state == "CANCELLED" and not owner.stale, "folded from the stream first"
    assert await owner.commit(cancelled("p")) == [None], "the redelivered fact is refused, not published twice"
    await owner.commit(cancelled("q"))
    events = [parse_job_event(d) for _, d, _ in await read_stream(nc.jetstream(), subjects.JOBS_STREAM, 1)]
    assert [(e.job_id, e.type) for e in events] == [
        ("p", "accepted"),
        ("q", "accepted"),
        ("p", "finished"),
        ("r", "accepted"),
        ("q", "finished"),
    ]


async def test_an_event_the_stream_already_holds_is_not_folded_twice(nc: Client) -> None:
    # CI's chaos run: a release lost to a Redis restart left a requeued attempt's reservation; reconcile took it for
    # a placement never recorded and committed `placed` again under the old event id. JetStream dropped it as a
    # duplicate, the owner folded it anyway, and its later `requeued` was one the stream's replay refuses.
    owner = await new_owner(nc)
    alloc = Allocation(ranks=[RankPlacement(rank=0, node="n0", gpus=[0, 1])])
    placed = JobPlaced(event_id="p-d-5", job_id="d", allocation=alloc, token=5)
    await owner.commit(JobAccepted(event_id="a-d", job_id="d", spec=spec(0)), placed)
    await owner.commit(JobRequeued(event_id="rq-d-5", job_id="d", reason="preempted", token=5))
    assert await owner.commit(placed) == [None], "the stream already holds it: not folded again"
    rec = owner.index.get("d")
    assert rec.state == "ACCEPTED" and rec.ended_token == 5
    # Nor is what follows it in the same batch folded on top of it.
    follow = JobFinished(event_id="c-d", job_id="d", state="CANCELLED", reason="cancelled by test")
    out = await owner.commit(placed, follow)
    assert out[0] is None and out[1] is not None and out[1].state == "CANCELLED" and out[1].token is None
    events = [parse_job_event(d) for _, d, _ in await read_stream(nc.jetstream(), subjects.JOBS_STREAM, 1)]
    replayed = None
    for e in events:
        if e.job_id == "d":
            replayed = apply_event(replayed, e)
    assert replayed is not None
    assert replayed.model_dump(exclude={"seq", "traceparent"}) == owner.index.get("d").model_dump(
        exclude={"seq", "traceparent"}
    )


async def test_an_acceptance_of_a_job_that_finished_and_left_the_index_does_not_run_it_again(nc: Client) -> None:
    # The multi-host run: an intake's retried `accepted` reached an owner whose index no longer held the finished job
    # (archived, or a successor that listed none). JetStream dropped it as a duplicate, the owner folded it anyway and
    # placed the job again: the stream held a second placed..finished after `finished`.
    owner = await new_owner(nc)
    accepted = JobAccepted(event_id="accepted-e", job_id="e", spec=spec(0))
    await owner.commit(accepted)
    await owner.commit(cancelled("e"))
    owner.min_age_s = 0
    await owner.expire(now=time.time() + 1)
    assert owner.index.get("e") is None, "archived and forgotten"
    js = nc.jetstream()

    assert await owner.commit(accepted) == [None], "the stream holds it: refused, not a new job"
    assert owner.index.get("e") is None
    successor = await new_owner(nc)  # lists no live record for e: it is in the archive
    assert await successor.commit(accepted) == [None]
    assert successor.index.get("e") is None and not successor.stale
    events = [parse_job_event(d) for _, d, _ in await read_stream(js, subjects.JOBS_STREAM, 1)]
    assert [e.type for e in events if e.job_id == "e"] == ["accepted", "finished"], "nothing appended"
    archived = await JobArchive(js).get("e")
    assert archived is not None and archived.state == "CANCELLED"


async def test_a_duplicate_past_the_index_makes_the_owner_catch_up_from_the_stream(nc: Client) -> None:
    # The other reading of a duplicate for a job the index lacks: the index missed the event (past its last sequence).
    owner = await new_owner(nc)
    accepted = JobAccepted(event_id="accepted-f", job_id="f", spec=spec(0))
    landed = await owner.fence.publish(
        subjects.JOBS_STREAM, subjects.job_event("f", "accepted"), accepted.model_dump_json().encode(),
        {"Nats-Msg-Id": accepted.event_id},
    )  # fmt: skip
    await owner.fence.acks(subjects.JOBS_STREAM, [landed])
    assert await owner.commit(accepted) == [None]
    assert owner.stale, "the stream holds what the index lacks"
    await owner.commit(cancelled("g"))  # any next commit folds the stream first
    rec = owner.index.get("f")
    assert rec is not None and rec.state == "ACCEPTED" and not owner.stale
