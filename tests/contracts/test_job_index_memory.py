"""The job working set's memory: live records drop pydantic's fields-set bookkeeping (half their memory, same
content); finished ones are kept as their JSON until they leave the hot view (under a quarter)."""

from __future__ import annotations

import tracemalloc

from oneplus_contracts import Allocation, JobRecord, JobSpec, RankPlacement
from oneplus_contracts.jobindex import JobIndex
from oneplus_contracts.slim import slim


def record(job_id: str = "j-1", state: str = "PLACED") -> JobRecord:
    spec = JobSpec(name="train", resources={"gpus": 4}, simulate={"duration_s": 60})  # type: ignore[arg-type]
    alloc = Allocation(ranks=[RankPlacement(rank=0, node="n1", gpus=[0, 1, 2, 3])])
    rec = JobRecord(
        job_id=job_id,
        spec=spec,
        state=state,  # type: ignore[arg-type]
        seq=3,
        submitted_ts=1.0,
        updated_ts=2.0,
        finished_ts=2.0 if state == "SUCCEEDED" else None,
        allocation=alloc,
        token=7,
    )
    return JobRecord.model_validate_json(rec.model_dump_json())  # as the owner and informers get it: from JSON


def fields_sets(rec: JobRecord) -> list[set[str]]:
    assert rec.allocation is not None
    return [
        rec.model_fields_set,
        rec.spec.model_fields_set,
        rec.spec.resources.model_fields_set,
        rec.allocation.model_fields_set,
        rec.allocation.ranks[0].model_fields_set,
    ]


def held(make: object) -> int:
    """Bytes still allocated after `make()` (its result kept alive until measured)."""
    tracemalloc.start()
    try:
        kept = make()  # type: ignore[operator]
        size = tracemalloc.get_traced_memory()[0]
        del kept
        return size
    finally:
        tracemalloc.stop()


def test_a_live_record_put_in_the_index_keeps_its_content_and_drops_its_fields_sets() -> None:
    rec = record()
    before = rec.model_dump_json()
    assert all(fields_sets(rec)), "parsed from JSON, every model names the fields it was given"
    index = JobIndex()
    index.put(rec)
    kept = index.get("j-1")
    assert kept is not None and kept.model_dump_json() == before
    assert not any(fields_sets(kept))
    # Folding goes on as before: a copy with an update dumps what it should.
    moved = kept.model_copy(update={"state": "RUNNING", "seq": 4})
    index.put(moved)
    assert index.get("j-1") == moved and moved.model_dump()["state"] == "RUNNING"
    assert moved.spec is kept.spec and not moved.model_fields_set


def test_slim_live_records_take_at_most_six_tenths_of_the_memory() -> None:
    def records(slimmed: bool) -> list[JobRecord]:
        recs = [record(f"j-{i}") for i in range(2000)]
        for r in recs if slimmed else ():
            slim(r)
        return recs

    full, slimmed = held(lambda: records(False)), held(lambda: records(True))
    assert slimmed <= 0.6 * full, (full, slimmed)


def test_a_finished_job_is_kept_as_json_found_as_before_and_expired_whole() -> None:
    index = JobIndex()
    index.put(record("j-1"))
    done = record("j-1", "SUCCEEDED").model_copy(update={"seq": 9})
    index.put(done)
    assert "j-1" in index and len(index) == 1
    assert "j-1" not in index.jobs and "j-1" not in index.holders and "j-1" not in index.pending
    assert index.get("j-1") == done and index.last_seq == 9
    assert list(index) == [done]
    assert index.expire(now=3.0, min_age_s=10.0) == []
    assert index.expire(now=20.0, min_age_s=10.0) == [done]
    assert "j-1" not in index and index.get("j-1") is None


def test_an_index_that_keeps_no_finished_job_drops_it_at_once() -> None:
    index = JobIndex(keep_finished=False)
    index.put(record("j-1"))
    index.put(record("j-1", "SUCCEEDED"))
    assert "j-1" not in index and index.get("j-1") is None and index.expire(now=99.0, min_age_s=0.0) == []
    listed = JobIndex.of([record("j-1", "SUCCEEDED"), record("j-2")], keep_finished=False)  # an informer's relist
    assert "j-1" not in listed and not listed.finished and list(listed.jobs) == ["j-2"]


def test_finished_jobs_take_under_a_quarter_of_the_memory_of_live_ones() -> None:
    def index_of(state: str) -> JobIndex:
        index = JobIndex()
        for i in range(2000):
            index.put(record(f"j-{i}", state))
        return index

    live, finished = held(lambda: index_of("RUNNING")), held(lambda: index_of("SUCCEEDED"))
    assert finished <= 0.25 * live, (live, finished)


def test_a_finished_job_leaves_with_what_the_archive_files_it_under_and_nothing_parsed(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    index = JobIndex()
    done = record("j-1", "SUCCEEDED").model_copy(update={"seq": 9})
    done = done.model_copy(update={"spec": done.spec.model_copy(update={"team": "vision", "user": "ana"})})
    index.put(done)
    # A late event of the finished job changes its record, not when it left the live set.
    index.put(done.model_copy(update={"seq": 10, "updated_ts": 50.0, "finished_ts": 50.0}))
    parsed: list[object] = []
    real = JobRecord.model_validate_json
    monkeypatch.setattr(JobRecord, "model_validate_json", lambda data: parsed.append(data) or real(data))
    assert [d.seq for d in index.expire_finished(now=12.5, min_age_s=10.0)] == [10]  # 10.5 s after the first finish
    assert parsed == [], "expiring keeps the JSON as it is: a burst of expired jobs is no burst of parsed records"
    assert "j-1" not in index


def test_expired_jobs_carry_their_archive_fields_and_json() -> None:
    index = JobIndex()
    rec = record("j-2", "FAILED").model_copy(update={"seq": 4})
    index.put(rec)
    (gone,) = index.expire_finished(now=30.0, min_age_s=10.0)
    assert (gone.job_id, gone.seq, gone.state, gone.team, gone.user, gone.ts) == (
        "j-2",
        4,
        "FAILED",
        rec.spec.team,
        rec.spec.user,
        rec.updated_ts,
    )
    assert JobRecord.model_validate_json(gone.data) == rec


def test_due_finished_jobs_stay_until_forgotten_and_one_kept_anew_meanwhile_stays() -> None:
    index = JobIndex()
    for job_id in ("j-1", "j-2"):
        index.put(record(job_id, "SUCCEEDED").model_copy(update={"seq": 3}))
    due = index.due_finished(now=30.0, min_age_s=10.0)
    assert [d.job_id for d in due] == ["j-1", "j-2"]
    assert "j-1" in index and "j-2" in index, "due, not gone: the owner archives them before they leave"
    # A late record of j-2 while they are archived: the archived copy is out of date, so j-2 waits for the next pass.
    index.put(record("j-2", "SUCCEEDED").model_copy(update={"seq": 7}))
    assert [d.job_id for d in index.forget_finished(due)] == ["j-1"]
    assert "j-1" not in index and index.get("j-2") is not None and index.get("j-2").seq == 7  # type: ignore[union-attr]
    assert [d.seq for d in index.due_finished(now=30.0, min_age_s=10.0)] == [7]
