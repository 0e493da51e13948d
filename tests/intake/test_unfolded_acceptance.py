"""A job is found right after its submission even when the job owner has not folded its acceptance yet (behind,
or down): show and cancel fall back on the stored `accepted` fact."""

from __future__ import annotations

from pathlib import Path

from intake_process import IntakeProcess, fresh_bus
from oneplus_contracts import JobSpec
from oneplus_testing import Servers

from oneplus.client import OnePlusClient


async def test_show_and_cancel_find_a_job_whose_acceptance_waits_for_the_owner(
    servers: Servers, tmp_path: Path
) -> None:
    await fresh_bus(servers.nats_url)
    # No owner runs beside this intake: the acceptance stays a fact.
    proc = await IntakeProcess(servers.nats_url, tmp_path, env={"ONEPLUS_ACCEPT_WAIT_S": "0.2"}).start()
    try:
        async with OnePlusClient.connect(servers.nats_url) as c:
            reply = await c.submit(JobSpec(name="early", resources={"gpus": 1}), msg_id="unfolded-1")  # type: ignore[arg-type]
            assert reply.ok and reply.job_id
            rec = await c.get_job(reply.job_id)
            assert (rec.job_id, rec.state, rec.spec.name) == (reply.job_id, "ACCEPTED", "early")
            done = await c.cancel(reply.job_id)
            assert done["cancel_requested"] is True
    finally:
        proc.stop()
