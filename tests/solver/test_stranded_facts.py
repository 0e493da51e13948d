"""A fact about a job whose acceptance an earlier owner fetched and never acknowledged waits for it, not refused.

Seen in `python -m oneplus.chaos --profile fenced`: the owner was SIGSTOPped holding a job's `accepted` fact; the
replica that took the lead folded the job's `cancel_requested` first, refused it as about an unknown job, and once
the acceptance came back the job ran its whole 600 s, its cancel lost.
"""

from __future__ import annotations

import asyncio
import time

from nats.aio.client import Client
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from oneplus_bus.ledger import JobLedger
from oneplus_bus.streams import ensure_kv, ensure_streams
from oneplus_contracts import JobAccepted, JobCancelRequested, subjects
from oneplus_placement_solver import owner as owner_module
from oneplus_placement_solver.owner import JobOwner
from oneplus_stores.archive import JobArchive
from test_cycle_store_ops import spec


async def test_a_cancel_waits_for_the_acceptance_an_earlier_owner_held(nc: Client) -> None:
    js = nc.jetstream()
    await ensure_streams(js)
    kv = await ensure_kv(js)
    ledger = JobLedger(js, kv[subjects.JOBS_KV])
    # The earlier owner fetched the job's acceptance and froze before acknowledging it.
    await ledger.report(JobAccepted(event_id="a-s", job_id="s", spec=spec(0)))
    config = ConsumerConfig(
        durable_name=owner_module.FACTS_CONSUMER,
        deliver_policy=DeliverPolicy.ALL,
        ack_policy=AckPolicy.EXPLICIT,
        ack_wait=owner_module.FACTS_ACK_WAIT_S,
        max_ack_pending=owner_module.FACT_BATCH * 4,
        filter_subject=subjects.JOB_FACTS_ALL,
    )
    frozen = await js.pull_subscribe(
        subjects.JOB_FACTS_ALL, durable=owner_module.FACTS_CONSUMER, stream=subjects.FACTS_STREAM, config=config
    )
    (stranded,) = await frozen.fetch(1, timeout=5)
    await ledger.report(JobCancelRequested(event_id="c-s", job_id="s", reason="cancelled by sre"))

    owner = JobOwner(js, JobArchive(js), min_age_s=3600, state_kv=kv[subjects.SOLVER_STATE_KV], nc=nc, me="new")
    await owner.bootstrap()
    assert not owner.facts_caught_up(time.time()), "an earlier owner's fact is out"
    assert await owner.drain_facts() == 0, "the cancel is held back, not refused"
    assert owner.index.get("s") is None
    assert owner.refused.labels("cancel_requested")._value.get() == 0

    await stranded.nak()  # the earlier owner, resumed and deposed, gives its facts back
    deadline = asyncio.get_running_loop().time() + 10
    while (rec := owner.index.get("s")) is None or not rec.cancel_requested:
        assert asyncio.get_running_loop().time() < deadline, "the cancel was lost"
        await owner.drain_facts()
        await asyncio.sleep(0.3)
    assert rec.cancel_requested and owner.refused.labels("cancel_requested")._value.get() == 0
