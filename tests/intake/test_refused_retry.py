"""A retry that admission would refuse now, of a job its first try already created, is answered as that job: no
`rejected` event under the id of a job that exists.

Seen in the multi-host lab: the intake's followed copy had not seen the job yet, admission refused the retry while a
node was cut off, and the job stream held `rejected` after the job's `accepted` (its replay no longer applied)."""

from __future__ import annotations

import pytest
from nats.aio.client import Client
from oneplus_bus.ledger import read_stream
from oneplus_bus.settings import BusSettings
from oneplus_bus.tenancy import Caller
from oneplus_contracts import JobAccepted, JobSpec, apply_event, parse_job_event, subjects
from oneplus_intake.app import build_intake
from oneplus_intake.submissions import CANNOT_RUN, DUPLICATE, job_id_for
from oneplus_testing import Servers


async def test_a_refused_retry_of_a_recorded_job_is_its_duplicate_not_a_rejection(
    nc: Client, servers: Servers, monkeypatch: pytest.MonkeyPatch
) -> None:
    svc, service = build_intake(BusSettings(servers.nats_url, servers.redis_url))
    await svc.app.start()
    try:
        intake = service.intake
        spec = JobSpec(name="retried", resources={"gpus": 1}, queue="no-such-queue")  # type: ignore[arg-type]
        job_id = job_id_for("retry-after-commit")
        # The first try was committed by the owner: its record is in the hot view's bucket...
        rec = apply_event(None, JobAccepted(event_id=f"accepted-{job_id}", job_id=job_id, spec=spec))
        await (await nc.jetstream().key_value(subjects.JOBS_KV)).put(job_id, rec.model_dump_json().encode())

        async def not_seen_yet(job: str) -> None:  # ...which this intake's followed copy has not caught up with
            return None

        monkeypatch.setattr(intake, "earlier", not_seen_yet)
        out = await intake.accept(
            spec, submission_id="retry-after-commit", source="test", warnings=[], caller=Caller(None)
        )
        assert (out.status, out.reply.ok, out.reply.duplicate, out.reply.job_id) == (DUPLICATE, True, True, job_id)
        events = [parse_job_event(d) for _, d, _ in await read_stream(nc.jetstream(), subjects.JOBS_STREAM, 1)]
        assert [e.type for e in events if e.job_id == job_id] == [], "no rejected event for a job that exists"

        # A job nobody created is still refused in one line, with its `rejected` event.
        out = await intake.accept(spec, submission_id="never-seen", source="test", warnings=[], caller=Caller(None))
        assert out.status == CANNOT_RUN and not out.reply.ok and "no-such-queue" in (out.reply.error or "")
        events = [parse_job_event(d) for _, d, _ in await read_stream(nc.jetstream(), subjects.JOBS_STREAM, 1)]
        assert [e.type for e in events] == ["rejected"]
    finally:
        await svc.app.stop()
