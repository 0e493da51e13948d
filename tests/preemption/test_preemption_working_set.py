"""The preemption service's working set on a real JetStream: live jobs only, whatever the history.

The service is built by `build_preemption(settings)` and run in this process. Victim choice reads live jobs, so a
finished job must leave its index at once, whether the service listed it from the hot view at start or folded its
end from the job-event stream; an index that kept them grew by a record's JSON for every job the cluster ever ran.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from nats.aio.client import Client
from oneplus_bus.settings import BusSettings
from oneplus_bus.streams import ensure_kv, ensure_streams
from oneplus_contracts import (
    Allocation,
    JobAccepted,
    JobEvent,
    JobFinished,
    JobPlaced,
    JobRecord,
    JobSpec,
    RankPlacement,
    apply_event,
    subjects,
)
from oneplus_preemption.app import Preemption, build_preemption
from oneplus_testing import Servers

SPEC = JobSpec(name="train", resources={"gpus": 2})  # type: ignore[arg-type]
ALLOC = Allocation(ranks=[RankPlacement(rank=0, node="n1", gpus=[0, 1])])


def lifecycle(job_id: str, *, ends: bool) -> list[JobEvent]:
    events: list[JobEvent] = [
        JobAccepted(job_id=job_id, spec=SPEC),
        JobPlaced(job_id=job_id, allocation=ALLOC, token=1),
    ]
    if ends:
        events.append(JobFinished(job_id=job_id, state="SUCCEEDED", reason="exit 0", token=1))
    return events


def folded(events: list[JobEvent], seq: int) -> JobRecord:
    rec: JobRecord | None = None
    for event in events:
        rec = apply_event(rec, event)
    assert rec is not None
    return rec.model_copy(update={"seq": seq})


async def publish(nc: Client, events: list[JobEvent]) -> int:
    seq = 0
    for event in events:
        ack = await nc.jetstream().publish(
            subjects.job_event(event.job_id, event.type), event.model_dump_json().encode(), stream=subjects.JOBS_STREAM
        )
        seq = int(ack.seq)
    return seq


async def until_folded(p: Preemption, seq: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while p.index.last_seq < seq:
        assert time.monotonic() < deadline, f"folded up to {p.index.last_seq}, wanted {seq}"
        await asyncio.sleep(0.02)


@pytest.fixture
async def preemption(nc: Client, servers: Servers) -> AsyncIterator[Preemption]:
    await ensure_streams(nc.jetstream())
    kv = (await ensure_kv(nc.jetstream()))[subjects.JOBS_KV]
    # The hot view at start: one job finished minutes ago (not yet archived), one still running.
    ended, live = lifecycle("j-ended", ends=True), lifecycle("j-live", ends=False)
    last = await publish(nc, ended + live)
    await kv.put("j-ended", folded(ended, last - 2).model_dump_json().encode())
    await kv.put("j-live", folded(live, last).model_dump_json().encode())
    svc, p = build_preemption(BusSettings(servers.nats_url, servers.redis_url))
    await svc.app.start()
    try:
        yield p
    finally:
        await svc.app.stop()


async def test_a_finished_job_in_the_hot_view_at_start_is_not_kept(preemption: Preemption) -> None:
    index = preemption.index
    assert "j-live" in index.jobs and "j-live" in index.holders
    assert "j-ended" not in index, "victim choice needs live jobs only: a finished one listed at start is dropped"
    assert not index.finished


async def test_jobs_that_end_after_start_leave_the_index_and_nothing_grows_with_them(
    preemption: Preemption, nc: Client
) -> None:
    for i in range(50):
        seq = await publish(nc, lifecycle(f"j-{i}", ends=True))
    await until_folded(preemption, seq)
    index = preemption.index
    assert len(index) == 1 and list(index.jobs) == ["j-live"]
    assert not index.finished and not index.pending and list(index.holders) == ["j-live"]
    assert set(preemption.capacity.held) == {"j-live"}, "an ended job's GPUs are free again in the capacity view"
