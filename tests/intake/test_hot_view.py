"""The intake's copy of the hot view (hotview.py), on a real JetStream bucket: listed once, then followed; a read sees
every write the bucket held when it began; a purged key leaves the copy; the filter agrees with the archive's."""

from __future__ import annotations

import asyncio
import time

from nats.aio.client import Client
from oneplus_bus.streams import ensure_kv, ensure_streams
from oneplus_contracts import JobRecord, JobSpec, RankResources, subjects
from oneplus_intake.hotview import SYNC_WAIT_S, HotView
from oneplus_stores.archive import JobArchive, JobRow


def record(
    job_id: str, *, state: str = "RUNNING", user: str = "alice", team: str = "nlp", ts: float = 1e9
) -> JobRecord:
    spec = JobSpec(name=job_id, team=team, user=user, resources=RankResources(gpus=1))
    finished = ts + 50 if state in ("SUCCEEDED", "FAILED", "CANCELLED") else None
    return JobRecord(job_id=job_id, state=state, spec=spec, submitted_ts=ts, updated_ts=ts + 60, finished_ts=finished)


async def test_the_copy_follows_puts_and_purges_and_a_read_sees_what_was_written_before_it(nc: Client) -> None:
    js = nc.jetstream()
    await ensure_streams(js)
    await ensure_kv(js)
    kv = await js.key_value(subjects.JOBS_KV)
    await kv.put("j-a", record("j-a").model_dump_json().encode())
    hot = HotView(js)
    await hot.start()
    try:
        assert set(hot.rows) == {"j-a"}, "listed at start"
        await kv.put("j-b", record("j-b", state="SUCCEEDED").model_dump_json().encode())
        await hot.synced()
        assert hot.rows["j-b"].state == "SUCCEEDED", "a read right after a write sees it"
        # Moved to the archive as the job owner does: archived, then its key purged (which leaves nothing to follow).
        await JobArchive(js).put(record("j-b", state="SUCCEEDED"))
        await js.purge_stream(f"KV_{subjects.JOBS_KV}", subject=f"$KV.{subjects.JOBS_KV}.j-b")
        await kv.put("j-c", record("j-c").model_dump_json().encode())
        await hot.synced()
        deadline = time.monotonic() + 5
        while "j-b" in hot.rows:
            assert time.monotonic() < deadline, "the archived job never left the copy"
            await asyncio.sleep(0.01)
        assert set(hot.rows) == {"j-a", "j-c"}
        assert hot.rows["j-c"].record() == record("j-c")

        # A key purged without the copy seeing its archiving (archived while the copy was listing): the sweep finds it.
        await kv.put("j-d", record("j-d", state="FAILED").model_dump_json().encode())
        await hot.synced()
        await js.purge_stream(f"KV_{subjects.JOBS_KV}", subject=f"$KV.{subjects.JOBS_KV}.j-d")
        assert await hot.sweep(now=1e9) == 0, "not stale yet: the owner may still be about to archive it"
        assert await hot.sweep(now=2e9) == 1 and "j-d" not in hot.rows
        assert "j-a" in hot.rows, "a live job is never swept"

        # The newest message purged (its job archived): that sequence never comes; one wait, then none.
        await js.purge_stream(f"KV_{subjects.JOBS_KV}", subject=f"$KV.{subjects.JOBS_KV}.j-c")
        t0 = time.monotonic()
        await hot.synced()
        assert time.monotonic() - t0 <= SYNC_WAIT_S + 0.2
        t0 = time.monotonic()
        await hot.synced()
        assert time.monotonic() - t0 < SYNC_WAIT_S / 2, "not waited for twice"
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
