"""The intake's copy of the hot view (hotview.py), on a real JetStream: the saved records and the job stream after them
read once, then the stream followed; a read sees every event the stream held when it began; an archived job leaves
the copy; the filter agrees with the archive's."""

from __future__ import annotations

import asyncio
import time

import pytest
from nats.aio.client import Client
from oneplus_bus.ledger import PROJECTED_SEQ_KEY, JobLedger
from oneplus_bus.streams import ensure_kv, ensure_streams
from oneplus_contracts import (
    JobAccepted,
    JobCancelRequested,
    JobEvent,
    JobFinished,
    JobRecord,
    JobSpec,
    RankResources,
    apply_event,
    subjects,
)
from oneplus_intake import hotview
from oneplus_intake.hotview import HotView
from oneplus_stores.archive import JobArchive, JobRow


def record(
    job_id: str, *, state: str = "RUNNING", user: str = "alice", team: str = "nlp", ts: float = 1e9
) -> JobRecord:
    spec = JobSpec(name=job_id, team=team, user=user, resources=RankResources(gpus=1))
    finished = ts + 50 if state in ("SUCCEEDED", "FAILED", "CANCELLED") else None
    return JobRecord(job_id=job_id, state=state, spec=spec, submitted_ts=ts, updated_ts=ts + 60, finished_ts=finished)


async def test_the_copy_folds_the_job_stream_after_the_saved_records_and_drops_archived_jobs(nc: Client) -> None:
    js = nc.jetstream()
    await ensure_streams(js)
    kvs = await ensure_kv(js)
    ledger = JobLedger(js, kvs[subjects.JOBS_KV])
    spec = JobSpec(name="x", resources=RankResources(gpus=1))
    # j-a's record as the owner last saved it, and the projected sequence; j-b accepted after that save.
    await ledger.publish(JobAccepted(job_id="j-a", spec=spec))
    saved = apply_event(None, JobAccepted(job_id="j-a", spec=spec)).model_copy(update={"seq": 1})
    await kvs[subjects.JOBS_KV].put("j-a", saved.model_dump_json().encode())
    await kvs[subjects.SOLVER_STATE_KV].put(PROJECTED_SEQ_KEY, b"1")
    await ledger.publish(JobAccepted(job_id="j-b", spec=spec))
    hot = HotView(js)
    await hot.start()
    try:
        assert set(hot.rows) == {"j-a", "j-b"}, "the saved record and the stream after the save"
        await ledger.publish(JobCancelRequested(job_id="j-b"))
        await ledger.publish(JobFinished(job_id="j-b", state="CANCELLED", reason="cancelled by user"))
        await hot.synced()
        assert hot.rows["j-b"].state == "CANCELLED", "a read right after an event sees it"
        rec_b = hot.record("j-b")
        assert rec_b is not None and rec_b == (await ledger.get("j-b"))[0], "the copy folds as the ledger reads"

        # Moved to the archive: the copy drops it, even when the archive is read before the job's last event.
        await JobArchive(js).put(rec_b)
        deadline = time.monotonic() + 5
        while "j-b" in hot.rows:
            assert time.monotonic() < deadline, "the archived job never left the copy"
            await asyncio.sleep(0.01)
        await ledger.publish(JobFinished(job_id="j-a", state="CANCELLED", reason="cancelled by user"))
        done_a = (await ledger.get("j-a"))[0]
        assert done_a is not None and done_a.state == "CANCELLED"
        await JobArchive(js).put(done_a)
        await hot.synced()
        deadline = time.monotonic() + 5
        while "j-a" in hot.rows:
            assert time.monotonic() < deadline, "the job archived with its last event never left the copy"
            await asyncio.sleep(0.01)

        # A finished job the copy holds after it was archived unseen (archived while the copy was listing).
        await ledger.publish(JobAccepted(job_id="j-d", spec=spec))
        await ledger.publish(JobFinished(job_id="j-d", state="FAILED", reason="bad"))
        await hot.synced()
        assert await hot.sweep(now=2e9) == 0, "not archived yet: the owner may still be about to archive it"
        done_d = hot.record("j-d")
        assert done_d is not None
        await JobArchive(js).put(done_d.model_copy(update={"seq": done_d.seq + 1000}))  # arrives ahead of a fold
        assert await hot.sweep(now=2e9) == 1 and "j-d" not in hot.rows
    finally:
        await hot.stop()


def test_the_job_lists_filter_on_stored_records() -> None:
    """JobRow.matches, which the hot view and the archive both filter with, read from the stored JSON."""
    recs = [
        record("live"),
        record("done-early", state="SUCCEEDED", ts=1000.0),
        record("done-late", state="FAILED", ts=5000.0),
        record("bob", user="bob"),
        record("other-team", team="vision"),
    ]
    cases = [
        ({"states": None, "since": None, "user": None, "team": None}, {r.job_id for r in recs}),
        ({"states": frozenset({"RUNNING"}), "since": None, "user": None, "team": "nlp"}, {"live", "bob"}),
        # done-early ended at 1,050 (before `since`), done-late at 5,050.
        ({"states": frozenset({"SUCCEEDED", "FAILED"}), "since": 3000.0, "user": None, "team": None}, {"done-late"}),
        ({"states": None, "since": 3000.0, "user": "bob", "team": None}, {"bob"}),
        ({"states": None, "since": 1050.0, "user": None, "team": None}, {r.job_id for r in recs}),
    ]
    for query, expected in cases:
        rows = [JobRow.of(r.model_dump_json().encode()) for r in recs]
        assert {r.job_id for r in rows if r.matches(**query)} == expected, query  # type: ignore[arg-type]
    # A finished job without finished_ts ended when it was last updated.
    no_finish = record("old", state="CANCELLED", ts=1000.0).model_copy(update={"finished_ts": None})
    row = JobRow.of(no_finish.model_dump_json().encode())
    assert row.ended_ts == 1060.0 and row.matches(since=1060.0) and not row.matches(since=1060.5)
    assert row.record() == no_finish


async def test_events_are_folded_when_read_and_a_job_archived_unread_is_never_folded(
    nc: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    js = nc.jetstream()
    await ensure_streams(js)
    kvs = await ensure_kv(js)
    ledger = JobLedger(js, kvs[subjects.JOBS_KV])
    spec = JobSpec(name="x", resources=RankResources(gpus=1))
    folded: list[str] = []
    real = hotview.parse_job_event

    def counted(data: bytes) -> JobEvent:
        event = real(data)
        folded.append(f"{event.job_id}.{event.type}")
        return event

    monkeypatch.setattr(hotview, "parse_job_event", counted)
    hot = HotView(js)
    await hot.start()
    try:
        await ledger.publish(JobAccepted(job_id="j-q", spec=spec))
        await ledger.publish(JobCancelRequested(job_id="j-q"))
        await ledger.publish(JobFinished(job_id="j-q", state="CANCELLED", reason="cancelled by user"))
        await hot.synced()
        assert folded == ["j-q.accepted"], "a new job's row at once, its later events left unread"
        done = (await ledger.get("j-q"))[0]
        assert done is not None
        await JobArchive(js).put(done)
        deadline = time.monotonic() + 5
        while "j-q" in hot._rows:
            assert time.monotonic() < deadline, "the archived job never left the copy"
            await asyncio.sleep(0.01)
        assert folded == ["j-q.accepted"] and "j-q" not in hot.rows, "left for the archive, never folded"

        await ledger.publish(JobAccepted(job_id="j-r", spec=spec))
        await ledger.publish(JobCancelRequested(job_id="j-r"))
        await hot.synced()
        rec = hot.record("j-r")
        assert rec is not None and rec.cancel_requested and rec == (await ledger.get("j-r"))[0], "folded on read"
    finally:
        await hot.stop()
