"""Ownership the server enforces: once a newer owner has fenced the streams, every write of the older one is refused
by NATS itself (not by the older one's clock or lease), it steps down cleanly, and nothing of it lands.

The older owner here has no guard at all (no lease, no clock): only the server's check stands between its writes and
the streams, as for an owner paused past its lease whose buffered publishes are flushed on resume.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import PubAck
from oneplus_bus.fencing import (
    EPOCH_HEADER,
    EXPECTED_SEQ_SUBJECT,
    FENCE_LANES,
    FENCED_STREAMS,
    JOBS_KV_STREAM,
    SOLVER_STATE_STREAM,
    Deposed,
    FencedPublisher,
    OwnerFence,
    fence_subject,
)
from oneplus_bus.ledger import latest_items, read_stream
from oneplus_bus.streams import ensure_kv, ensure_streams
from oneplus_contracts import JobAccepted, JobFinished, subjects
from oneplus_placement_solver.memory import SolverMemory
from oneplus_placement_solver.owner import JobOwner, NotOwner
from oneplus_queueing.model import CycleCarry
from oneplus_stores.archive import JobArchive
from test_cycle_store_ops import spec


async def last_seqs(js: JetStreamContext) -> dict[str, int]:
    return {s: int((await js.stream_info(s)).state.last_seq or 0) for s in FENCED_STREAMS}


async def owners(nc: Client) -> tuple[JetStreamContext, JobOwner, JobOwner]:
    js = nc.jetstream()
    await ensure_streams(js)
    kv = await ensure_kv(js)
    old = JobOwner(js, JobArchive(js), min_age_s=0, state_kv=kv[subjects.SOLVER_STATE_KV], nc=nc, me="old")
    new = JobOwner(js, JobArchive(js), min_age_s=0, state_kv=kv[subjects.SOLVER_STATE_KV], nc=nc, me="new")
    return js, old, new


async def test_a_deposed_owner_lands_no_write_and_steps_down(nc: Client) -> None:
    js, old, new = await owners(nc)
    await old.bootstrap(epoch=10)
    stepped_down: list[str] = []
    old.on_deposed = lambda: stepped_down.append("old")
    await old.commit(*[JobAccepted(event_id=f"a-{i}", job_id=f"f-{i}", spec=spec(0)) for i in range(3)])
    await old.commit(JobFinished(event_id="fin-0", job_id="f-0", state="SUCCEEDED", reason="done"))

    # A newer owner (lease revision 12) fences every stream, then reads them back: it sees all the old one landed.
    await new.bootstrap(epoch=12)
    assert sorted(new.index.pending) == ["f-1", "f-2"] and new.index.get("f-0") is not None
    before = await last_seqs(js)

    # The old owner, unaware (no guard), commits: the server refuses the job events; nothing is folded or written.
    with pytest.raises(NotOwner):
        await old.commit(JobFinished(event_id="fin-1", job_id="f-1", state="SUCCEEDED", reason="done"))
    assert stepped_down == ["old"], "a refused write makes the owner step down, once"
    assert old.index.get("f-1").state == "ACCEPTED"  # type: ignore[union-attr]
    assert old.fence.refused.labels(subjects.JOBS_STREAM)._value.get() == 1
    # And every later write of it is stopped before it is sent.
    with pytest.raises(NotOwner):
        await old.commit(JobFinished(event_id="fin-2", job_id="f-2", state="SUCCEEDED", reason="done"))
    with pytest.raises(NotOwner):
        await old.expire()
    assert await last_seqs(js) == before, "nothing of the deposed owner landed"

    # The new owner goes on, and its records are the stream's.
    rec = (await new.commit(JobFinished(event_id="fin-1n", job_id="f-1", state="SUCCEEDED", reason="done")))[0]
    assert rec is not None and rec.state == "SUCCEEDED"
    assert len(await new.expire()) == 2  # f-0 and f-1 archived by the owner in charge


async def test_each_fenced_stream_refuses_the_older_epoch(nc: Client) -> None:
    """Job events, jobs KV records, the archive and solver_state: a write of the older epoch is refused on each."""
    js, old, new = await owners(nc)
    await old.bootstrap(epoch=3)
    await old.commit(JobAccepted(event_id="a-x", job_id="x", spec=spec(0)))
    await new.bootstrap(epoch=4)
    for stream in FENCED_STREAMS:
        subject = {
            subjects.JOBS_STREAM: subjects.job_event("x", "finished"),
            JOBS_KV_STREAM: f"$KV.{subjects.JOBS_KV}.x",
            subjects.ARCHIVE_STREAM: f"{subjects.PREFIX}.archive.x.SUCCEEDED.t.u",
            SOLVER_STATE_STREAM: f"$KV.{subjects.SOLVER_STATE_KV}.jobs_projected_seq",
        }[stream]
        fence = OwnerFence(js, nc, "old")
        fence.epoch, fence.seqs = old.fence.epoch, dict(old.fence.seqs)  # the old owner's epoch, as it holds it
        with pytest.raises(Deposed):
            await fence.acks(stream, [await fence.publish(stream, subject, b"{}")])
        assert fence.refused.labels(stream)._value.get() == 1
    # The solver's carry and usage go through the same fence: refused, not saved, and the solver is told.
    memory = SolverMemory((await ensure_kv(js))[subjects.SOLVER_STATE_KV])
    memory.fence = OwnerFence(js, nc, "old")
    memory.fence.epoch, memory.fence.seqs = old.fence.epoch, dict(old.fence.seqs)
    told: list[bool] = []
    memory.fence.on_deposed = lambda: told.append(True)
    before = (await js.stream_info(SOLVER_STATE_STREAM)).state.last_seq
    await memory.save_carry(CycleCarry({}, "x"))
    assert memory.saved_carry is None and told == [True]
    assert (await js.stream_info(SOLVER_STATE_STREAM)).state.last_seq == before


async def test_an_owner_cannot_fence_below_a_newer_epoch_and_readers_skip_the_fences(nc: Client) -> None:
    js, old, new = await owners(nc)
    await new.bootstrap(epoch=7)
    with pytest.raises(Deposed):
        await old.fence.establish(5)
    # A fence message holds its owner and epoch; whole-bucket and whole-stream reads never see it as an entry.
    msg = await js.get_last_msg(subjects.JOBS_STREAM, fence_subject(subjects.JOBS_STREAM))
    assert json.loads(msg.data) == {"owner": "new", "epoch": 7}
    await new.commit(JobAccepted(event_id="a-y", job_id="y", spec=spec(0)))
    await new.save(flush=True)
    assert [k for k, _ in await latest_items(js, subjects.JOBS_KV)] == ["y"]
    events = await read_stream(js, subjects.JOBS_STREAM, 1)
    assert len(events) == 1 and all(h.get(EPOCH_HEADER) == "7" for _, _, h in events)
    # An owner without a lease fences one above the newest epoch.
    third = JobOwner(js, JobArchive(js), min_age_s=0, nc=nc, me="third")
    await third.bootstrap()
    assert third.fence.epoch == 8
    # The owner it fenced out is refused in turn.
    with pytest.raises(NotOwner):
        await new.commit(JobFinished(event_id="f-y", job_id="y", state="SUCCEEDED", reason="done"))


async def test_a_refused_publish_is_an_error_not_a_hang(nc: Client) -> None:
    """nats-py 2.16's publish_async never resolves a refused publish's future; FencedPublisher sets the error."""
    js = nc.jetstream()
    await ensure_streams(js)
    pub = FencedPublisher(nc)
    fut = await pub.publish(
        subjects.job_event("z", "accepted"), b"{}", {"Nats-Expected-Last-Subject-Sequence": "99"}, subjects.JOBS_STREAM
    )
    with pytest.raises(Exception, match="wrong last sequence"):
        await fut


async def test_a_commit_racing_the_takeovers_fence_waits_for_it_and_does_not_depose_the_owner(nc: Client) -> None:
    """The multi-host lab: a binding committed while the new owner's bootstrap was fencing the streams; the commit
    fenced at an epoch of its own (the old one + 1), met the lease's epoch and deposed the owner just taking over."""
    _, old, new = await owners(nc)
    await old.bootstrap(epoch=40)
    deposed: list[bool] = []
    new.fence.on_deposed = lambda: deposed.append(True)
    await asyncio.gather(new.fence.establish(50), new.fence.ensure())
    assert new.fence.epoch == 50 and not deposed and new.fence.established
    for stream in FENCED_STREAMS:
        assert (await new.fence.last(stream))[1] == 50


async def test_writes_take_the_fence_lanes_in_turn_with_one_in_flight_per_lane(nc: Client) -> None:
    """A replicated stream's leader refuses (10164) a write checking a fence subject another write in flight checks:
    each lane takes its next write only once its previous one is acknowledged, and all of a long batch lands."""
    _, old, _ = await owners(nc)
    await old.bootstrap(epoch=3)
    real = old.fence.publisher
    last: dict[str, asyncio.Future[PubAck]] = {}
    lanes: list[str] = []

    class Spy:
        async def publish(
            self, subject: str, data: bytes, headers: dict[str, str], stream: str
        ) -> asyncio.Future[PubAck]:
            lane = headers[EXPECTED_SEQ_SUBJECT]
            assert lane not in last or last[lane].done(), f"two writes in flight on {lane}"
            lanes.append(lane)
            last[lane] = await real.publish(subject, data, headers, stream)
            return last[lane]

    old.fence.publisher = Spy()  # type: ignore[assignment]
    stream = subjects.ARCHIVE_STREAM
    n = 2 * FENCE_LANES + 3
    futures = [
        await old.fence.publish(stream, f"{subjects.PREFIX}.archive.l{i}.SUCCEEDED.t.u", b"{}") for i in range(n)
    ]
    assert len(await old.fence.acks(stream, futures)) == n
    assert lanes[: 2 * FENCE_LANES] == [fence_subject(stream, i % FENCE_LANES) for i in range(2 * FENCE_LANES)]
