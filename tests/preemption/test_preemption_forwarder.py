"""The preemption service as a thin compatibility consumer, on a real JetStream: an operator's request that names
victims reaches the job owner as `preempting` facts for the attempts they run now, read from the hot view; a victim
that holds no GPUs, a resize of a job that is not elastic, and a request without victims report nothing.

The service is built by `build_preemption(settings)` and run in this process; it keeps no working set.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from nats.aio.client import Client
from oneplus_bus.settings import BusSettings
from oneplus_bus.streams import ensure_kv, ensure_streams
from oneplus_contracts import (
    Allocation,
    ElasticRange,
    JobAccepted,
    JobEvent,
    JobFinished,
    JobPlaced,
    JobPreempting,
    JobRecord,
    JobSpec,
    PreemptionRequest,
    RankPlacement,
    apply_event,
    parse_job_event,
    subjects,
)
from oneplus_preemption.app import Preemption, build_preemption
from oneplus_testing import Servers

SPEC = JobSpec(name="train", resources={"gpus": 2})
ALLOC = Allocation(ranks=[RankPlacement(rank=0, node="n1", gpus=[0, 1])])


def record(job_id: str, *, token: int, ends: bool = False, spec: JobSpec = SPEC) -> JobRecord:
    events: list[JobEvent] = [
        JobAccepted(job_id=job_id, spec=spec),
        JobPlaced(job_id=job_id, allocation=ALLOC, token=token),
    ]
    if ends:
        events.append(JobFinished(job_id=job_id, state="SUCCEEDED", reason="exit 0", token=token))
    rec: JobRecord | None = None
    for event in events:
        rec = apply_event(rec, event)
    assert rec is not None
    return rec


def request(job_id: str, victims: list[str]) -> PreemptionRequest:
    return PreemptionRequest(
        request_id=f"prq-{job_id}", job_id=job_id, priority=100, gpus=2, reason="operator", victims=victims
    )


async def reported(nc: Client) -> list[JobPreempting]:
    """The `preempting` facts stored for the owner so far."""
    sub = await nc.jetstream().subscribe(subjects.job_fact("*", "preempting"), ordered_consumer=True)
    out: list[JobPreempting] = []
    try:
        while True:
            try:
                msg = await sub.next_msg(timeout=0.5)
            except TimeoutError:
                return out
            event = parse_job_event(msg.data)
            assert isinstance(event, JobPreempting)
            out.append(event)
    finally:
        await sub.unsubscribe()


@pytest.fixture
async def preemption(nc: Client, servers: Servers) -> AsyncIterator[Preemption]:
    await ensure_streams(nc.jetstream())
    kv = (await ensure_kv(nc.jetstream()))[subjects.JOBS_KV]
    elastic = SPEC.model_copy(update={"elastic": ElasticRange(min_ranks=1, max_ranks=2)})
    for rec in (
        record("j-live", token=7),
        record("j-ended", token=3, ends=True),
        record("j-elastic", token=2, spec=elastic),
    ):
        await kv.put(rec.job_id, rec.model_dump_json().encode())
    svc, p = build_preemption(BusSettings(servers.nats_url, servers.redis_url))
    await svc.app.start()
    try:
        yield p
    finally:
        await svc.app.stop()


async def test_named_victims_are_reported_preempting_for_their_current_attempt(
    preemption: Preemption, nc: Client
) -> None:
    got = await preemption.handle(request("j-urgent", ["j-live", "j-ended", "j-unknown"]))
    assert got == ["j-live"], "only the victim that holds GPUs now is reported"
    facts = await reported(nc)
    assert [(f.job_id, f.token, f.preemptor, f.reason) for f in facts] == [("j-live", 7, "j-urgent", "operator")]


async def test_a_resize_request_reports_only_an_elastic_job_itself(preemption: Preemption, nc: Client) -> None:
    assert await preemption.handle(request("j-live", ["j-live"])) == [], "a job that is not elastic is not resized"
    assert await preemption.handle(request("j-elastic", ["j-elastic"])) == ["j-elastic"]
    assert [(f.job_id, f.token) for f in await reported(nc)] == [("j-elastic", 2)]


async def test_a_request_without_victims_is_left_to_the_owners_cycle(preemption: Preemption, nc: Client) -> None:
    assert await preemption.handle(request("j-urgent", [])) == []
    assert await reported(nc) == []
