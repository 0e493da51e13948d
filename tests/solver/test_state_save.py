"""The job owner's periodic state save (owner.py `save`): a transition's one durable write is its job event; records
are saved once per save however many transitions came between, a finished job's to the archive instead of the
bucket, then the job-stream sequence they reach. Readers (`hot_index`, `JobLedger.get`) and a restarted owner fold
the job stream after it, so nothing depends on a save having happened."""

from __future__ import annotations

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.errors import ServiceUnavailableError
from oneplus_bus import ledger as ledger_module
from oneplus_bus.ledger import JobLedger, hot_index, latest_items, projected_seq
from oneplus_bus.streams import ensure_kv, ensure_streams
from oneplus_contracts import (
    Allocation,
    JobAccepted,
    JobFinished,
    JobPlaced,
    JobRunning,
    RankPlacement,
    subjects,
)
from oneplus_placement_solver import owner as owner_module
from oneplus_placement_solver.owner import JobOwner
from oneplus_stores.archive import JobArchive
from test_cycle_store_ops import spec

KV_STREAM = f"KV_{subjects.JOBS_KV}"


async def owner_of(nc: Client, min_age_s: float = 3600) -> tuple[JetStreamContext, JobOwner]:
    js = nc.jetstream()
    await ensure_streams(js)
    kv = await ensure_kv(js)
    owner = JobOwner(js, JobArchive(js), min_age_s=min_age_s, state_kv=kv[subjects.SOLVER_STATE_KV])
    await owner.bootstrap()
    return js, owner


async def appends(js: JetStreamContext, stream: str) -> int:
    return int((await js.stream_info(stream)).state.last_seq or 0)


def alloc(gpu: int) -> Allocation:
    return Allocation(ranks=[RankPlacement(rank=0, node="n0", gpus=[gpu])])


async def running(owner: JobOwner, job_id: str, gpu: int) -> None:
    await owner.commit(JobAccepted(event_id=f"a-{job_id}", job_id=job_id, spec=spec(0, 1)))
    await owner.commit(JobPlaced(event_id=f"p-{job_id}", job_id=job_id, allocation=alloc(gpu), token=5))
    await owner.commit(JobRunning(event_id=f"r-{job_id}", job_id=job_id, node="n0", token=5))


def finished(job_id: str) -> JobFinished:
    return JobFinished(event_id=f"f-{job_id}", job_id=job_id, state="SUCCEEDED", reason="exit 0", token=5)


async def test_commits_write_only_events_and_a_save_writes_each_changed_record_once(nc: Client) -> None:
    js, owner = await owner_of(nc)
    kv0, events0 = await appends(js, KV_STREAM), await appends(js, subjects.JOBS_STREAM)
    await running(owner, "a", 0)
    assert await appends(js, subjects.JOBS_STREAM) == events0 + 3, "one append a transition"
    assert await appends(js, KV_STREAM) == kv0, "no record written by a commit"

    # Readers see every transition before any save: the saved records and the job stream after them.
    ledger = JobLedger(js, await js.key_value(subjects.JOBS_KV))
    got, seq = await ledger.get("a")
    assert got is not None and got.state == "RUNNING" and seq == owner.index.last_seq
    listed = (await hot_index(js)).get("a")
    assert listed is not None and listed.state == "RUNNING" and listed.seq == got.seq

    assert await owner.save() == 0, "not saved while it may still change (SAVE_SETTLED_S)"
    assert await projected_seq((await ensure_kv(js))[subjects.SOLVER_STATE_KV]) < got.seq - 2, "nor its events"
    assert await owner.save(flush=True) == 1
    assert await appends(js, KV_STREAM) == kv0 + 1, "three transitions, one saved record"
    assert dict(await latest_items(js, subjects.JOBS_KV))["a"] == got.model_dump_json().encode()
    assert await projected_seq((await ensure_kv(js))[subjects.SOLVER_STATE_KV]) == owner.index.last_seq
    assert await owner.save() == 0, "nothing changed since"

    # Finished: archived by the next save, its saved live record purged from the bucket.
    archived0 = await appends(js, subjects.ARCHIVE_STREAM)
    await owner.commit(finished("a"))
    assert await owner.save() == 1
    assert await appends(js, subjects.ARCHIVE_STREAM) == archived0 + 1
    assert "a" not in dict(await latest_items(js, subjects.JOBS_KV))
    done = await JobArchive(js).get("a")
    assert done is not None and done.state == "SUCCEEDED"
    assert (await ledger.get("a"))[0] == done, "read from the stream, it is what the archive holds"
    assert "a" in owner.index.finished, "kept in the owner's index until min_age_s"


async def test_a_job_that_ends_between_two_saves_is_written_once_to_the_archive(nc: Client) -> None:
    js, owner = await owner_of(nc)
    kv0, archived0 = await appends(js, KV_STREAM), await appends(js, subjects.ARCHIVE_STREAM)
    await running(owner, "b", 1)
    await owner.commit(finished("b"))
    assert await owner.save() == 1
    assert await appends(js, KV_STREAM) == kv0 and await appends(js, subjects.ARCHIVE_STREAM) == archived0 + 1


async def test_an_owner_that_dies_before_saving_loses_nothing_its_successor_replays_the_stream(nc: Client) -> None:
    js, owner = await owner_of(nc)
    await running(owner, "c", 2)
    await owner.save(flush=True)
    await running(owner, "d", 3)
    await owner.commit(finished("c"))
    want = {j: owner.index.get(j) for j in ("c", "d")}
    # Dies here: "d" was never saved, "c"'s end is not archived, the saved sequence is before both.
    _, again = await owner_of(nc)
    assert {j: again.index.get(j) for j in ("c", "d")} == want
    assert set(again.unprojected) >= {"c", "d"}, "replayed records are saved by the successor's first save"
    await again.save()
    done = await JobArchive(js).get("c")
    assert done is not None and done.state == "SUCCEEDED"
    assert "c" not in dict(await latest_items(js, subjects.JOBS_KV)), "its stale live record is purged"


async def test_expire_saves_then_forgets_finished_jobs_past_min_age(nc: Client) -> None:
    js, owner = await owner_of(nc, min_age_s=0)
    await running(owner, "e", 4)
    await owner.commit(finished("e"))
    gone = await owner.expire()
    assert [d.job_id for d in gone] == ["e"] and "e" not in owner.index
    done = await JobArchive(js).get("e")
    assert done is not None and done.state == "SUCCEEDED", "saved to the archive before it was forgotten"


async def test_a_live_record_is_saved_once_it_settles_and_the_saved_sequence_stops_before_unsaved_ones(
    nc: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    js, owner = await owner_of(nc)
    state = (await ensure_kv(js))[subjects.SOLVER_STATE_KV]
    await running(owner, "f", 5)
    monkeypatch.setattr(owner_module, "SAVE_SETTLED_S", 0.0)
    await owner.commit(JobAccepted(event_id="a-g", job_id="g", spec=spec(0, 1)))
    assert await owner.save() == 2
    assert await projected_seq(state) == owner.index.last_seq
    monkeypatch.setattr(owner_module, "SAVE_SETTLED_S", 3600.0)
    await owner.commit(JobFinished(event_id="c-g", job_id="g", state="CANCELLED", reason="cancelled"))
    await owner.commit(JobAccepted(event_id="a-h", job_id="h", spec=spec(0, 1)))
    h_seq = owner.index.last_seq
    assert await owner.save() == 1, "g's end archived at once; h, just accepted, waits"
    assert await projected_seq(state) == h_seq - 1, "every event before h's first is saved"
    listed = await hot_index(js)
    assert listed.get("h") is not None and listed.get("g") is None, "h read from the stream, g from nowhere hot"
    monkeypatch.setattr(owner_module, "SAVE_WITHIN_S", 0.0)
    assert await owner.save() == 1 and await projected_seq(state) == owner.index.last_seq


async def test_reading_the_hot_view_waits_out_a_stream_leader_election(
    nc: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A follower replica that starts while the job stream elects a leader (the multi-host run killed the stream
    leader's server) read 503 and exited: the read is made again instead."""
    js, owner = await owner_of(nc)
    await running(owner, "w", 6)
    real, calls = ledger_module.read_stream, []

    async def electing(*args: object, **kwargs: object) -> object:
        calls.append(1)
        if len(calls) == 1:
            raise ServiceUnavailableError
        return await real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ledger_module, "read_stream", electing)
    listed = (await hot_index(js)).get("w")
    assert len(calls) == 2 and listed is not None and listed.state == "RUNNING"


async def test_a_save_between_reading_the_records_and_the_saved_sequence_leaves_no_finished_job_holding(
    nc: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A follower replica listed a live record, the owner then archived the job, purged its key and saved a sequence
    past its end, and the follower read that sequence: it never folded the end and held the finished job's GPUs
    (the multi-host CI run: "holder ... does not fit the topology model: GPUs ... are already held")."""
    js, owner = await owner_of(nc)
    await running(owner, "z", 7)
    await owner.save(flush=True)  # its live record in the bucket
    await owner.commit(finished("z"))
    real = ledger_module.latest_values

    async def listed_then_saved(js_: JetStreamContext, bucket: str, *args: object, **kwargs: object) -> list[bytes]:
        out = await real(js_, bucket, *args, **kwargs)  # type: ignore[arg-type]
        if bucket == subjects.JOBS_KV:
            await owner.save(flush=True)  # archives z, purges its key, saves the sequence past its end
        return out

    monkeypatch.setattr(ledger_module, "latest_values", listed_then_saved)
    index = await hot_index(js)
    z = index.get("z")
    assert "z" not in index.holders and z is not None and z.state == "SUCCEEDED"
