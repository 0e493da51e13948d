"""How OnePlusClient reads a reply of the job list (`oneplus.ops.job.list`): in one pass by pydantic, with a clear
error for a reply it cannot read."""

from __future__ import annotations

import json

import pytest
from oneplus_contracts import JobRecord, JobSpec, RankResources

from oneplus.client import PlatformError, read_job_page

SUBJECT = "oneplus.ops.job.list"


def record(job_id: str, user: str = "ann") -> JobRecord:
    spec = JobSpec(name="train", team="nlp", user=user, resources=RankResources(gpus=1))
    return JobRecord(job_id=job_id, spec=spec, state="RUNNING", submitted_ts=1e9, updated_ts=1e9)


def reply(result: object, ok: bool = True) -> bytes:
    return json.dumps({"ok": ok, "result": result}).encode()


def test_a_page_is_its_records_and_the_next_cursor() -> None:
    recs = [record("j-1"), record("j-2", user="zoë")]
    # As the intake sends it: each record as stored, spliced in.
    raw = b'{"ok":true,"result":{"jobs":[' + b",".join(r.model_dump_json().encode() for r in recs) + b'],"next":"c2"}}'
    assert read_job_page(SUBJECT, raw) == (recs, "c2")
    assert read_job_page(SUBJECT, reply({"jobs": [], "next": None})) == ([], None)
    # An intake from before paging answered with every job at once.
    assert read_job_page(SUBJECT, reply([r.model_dump(mode="json") for r in recs])) == (recs, None)


def test_a_record_stored_before_a_field_existed_gets_its_default() -> None:
    stored = record("j-old").model_dump(mode="json")
    del stored["warnings"], stored["infra_requeues"]
    (rec,), _ = read_job_page(SUBJECT, reply({"jobs": [stored], "next": None}))
    assert rec.warnings == [] and rec.infra_requeues == 0


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (json.dumps({"ok": False, "error": "state: 'DONE' is not a job state"}).encode(), "'DONE' is not a job state"),
        (json.dumps({"ok": False}).encode(), "did not say why"),
        (b"<html>502</html>", f"unreadable answer on {SUBJECT}: Invalid JSON"),
        (
            reply({"jobs": [{"job_id": "j-1"}], "next": None}),
            f"unreadable answer on {SUBJECT}: result.JobListPage.jobs.0.spec: Field required \\(and 4 more\\)",
        ),
        (reply({"jobs": "none", "next": None}), f"unreadable answer on {SUBJECT}"),
        (json.dumps({"ok": True}).encode(), f"unreadable answer on {SUBJECT}: no result"),
    ],
)
def test_a_reply_that_cannot_be_read_is_a_platform_error_that_says_why(data: bytes, message: str) -> None:
    with pytest.raises(PlatformError, match=message):
        read_job_page(SUBJECT, data)
