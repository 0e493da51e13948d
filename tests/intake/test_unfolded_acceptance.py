"""A job is found right after its submission even when the job owner has not folded its acceptance yet (behind,
or down): show and cancel fall back on the stored `accepted` fact."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from intake_process import IntakeProcess, fresh_bus
from oneplus_contracts import JobSpec
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
