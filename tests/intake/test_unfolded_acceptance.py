"""A job is found right after its submission even when the job owner has not folded its acceptance yet (behind,
or down): with no owner to answer, the acceptance is kept as a fact, and show and cancel fall back on it. With one,
the acceptance goes straight to it and is committed before the submission is answered."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest
from intake_process import IntakeProcess, fresh_bus
from oneplus_bus.ledger import JobLedger, read_stream
from oneplus_contracts import JobSpec, parse_job_event, subjects
from oneplus_placement_solver.owner import JobOwner
from oneplus_stores.archive import JobArchive
from oneplus_testing import Servers

from oneplus.client import OnePlusClient, PlatformError


@pytest.fixture
async def ownerless(servers: Servers, tmp_path: Path) -> AsyncIterator[OnePlusClient]:
    """A client of an intake with no job owner beside it: every acceptance stays a fact."""
    await fresh_bus(servers.nats_url)
    proc = await IntakeProcess(servers.nats_url, tmp_path, env={"ONEPLUS_ACCEPT_WAIT_S": "0.2"}).start()
    try:
        async with OnePlusClient.connect(servers.nats_url) as c:
            yield c
    finally:
        proc.stop()


async def test_show_and_cancel_find_a_job_whose_acceptance_waits_for_the_owner(ownerless: OnePlusClient) -> None:
    c = ownerless
    reply = await c.submit(JobSpec(name="early", resources={"gpus": 1}), msg_id="unfolded-1")  # type: ignore[arg-type]
    assert reply.ok and reply.job_id
    rec = await c.get_job(reply.job_id)
    assert (rec.job_id, rec.state, rec.spec.name) == (reply.job_id, "ACCEPTED", "early")
    done = await c.cancel(reply.job_id)
    assert done["cancel_requested"] is True


async def test_a_wildcard_id_names_no_job_and_never_matches_another(ownerless: OnePlusClient) -> None:
    """`*` or `>` in an id would turn the fact lookup into a filter matching some other job's acceptance."""
    c = ownerless
    reply = await c.submit(JobSpec(name="real", resources={"gpus": 1}), msg_id="wild-1")  # type: ignore[arg-type]
    assert reply.ok
    for bad in ("*", ">", "j-*", f"{reply.job_id}.x"):
        with pytest.raises(PlatformError, match="no job"):
            await c.get_job(bad)
        with pytest.raises(PlatformError, match="no job"):
            await c.cancel(bad)


async def test_a_retry_before_the_owner_recorded_the_first_is_answered_duplicate(ownerless: OnePlusClient) -> None:
    """The record is not there to find (no owner folds the acceptance); the facts stream's message id still knows."""
    c = ownerless
    job = JobSpec(name="retried", resources={"gpus": 1})  # type: ignore[arg-type]
    first = await c.submit(job, msg_id="retry-1")
    again = await c.submit(job, msg_id="retry-1")
    other = await c.submit(job, msg_id="retry-2")
    assert first.ok and not first.duplicate
    assert again.ok and again.duplicate and again.job_id == first.job_id
    assert other.ok and not other.duplicate and other.job_id != first.job_id


async def test_with_an_owner_answering_an_acceptance_is_committed_before_the_reply_and_appends_no_fact(
    servers: Servers, tmp_path: Path
) -> None:
    """The intake sends `accepted` straight to the owner (issue 42): the reply comes once the job's event is committed
    and its record is in the hot view, and the facts stream holds nothing of it; a retry is answered duplicate."""
    await fresh_bus(servers.nats_url)
    nc = await nats.connect(servers.nats_url)
    proc = await IntakeProcess(servers.nats_url, tmp_path, env={"ONEPLUS_ACCEPT_WAIT_S": "5"}).start()
    js = nc.jetstream()
    owner = JobOwner(js, JobArchive(js), min_age_s=3600, nc=nc, me="owner")
    await owner.bootstrap()
    answering = asyncio.create_task(owner.run_reports())
    try:
        async with OnePlusClient.connect(servers.nats_url) as c:
            facts = (await js.stream_info(subjects.FACTS_STREAM)).state.last_seq
            job = JobSpec(name="direct", resources={"gpus": 1})  # type: ignore[arg-type]
            first = await c.submit(job, msg_id="direct-1")
            assert first.ok and not first.duplicate and first.job_id
            rec, _ = await JobLedger(js, await js.key_value(subjects.JOBS_KV)).get(first.job_id)
            assert rec is not None and rec.state == "ACCEPTED"
            again = await c.submit(job, msg_id="direct-1")
            assert again.ok and again.duplicate and again.job_id == first.job_id
            assert (await js.stream_info(subjects.FACTS_STREAM)).state.last_seq == facts, "no fact appended"
            rows = await read_stream(js, subjects.JOBS_STREAM, 1)
            assert [parse_job_event(d).type for _, d, _ in rows] == ["accepted"], "one event, the retry refused"
    finally:
        answering.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await answering
        proc.stop()
        await nc.close()
