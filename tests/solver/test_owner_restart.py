"""A restarted job owner resumes after the last sequence it projected, even once every job has been archived.

Reads are counted: with the hot view empty, the replay must not walk the job stream from its first event.
"""

from __future__ import annotations

from nats.aio.client import Client
from oneplus_bus.streams import ensure_kv, ensure_streams
from oneplus_contracts import JobAccepted, JobFinished, subjects
from oneplus_placement_solver.owner import JobOwner
from oneplus_stores.archive import JobArchive
from test_cycle_store_ops import spec


async def test_an_owner_restarted_after_its_jobs_were_archived_replays_nothing(nc: Client) -> None:
    js = nc.jetstream()
    await ensure_streams(js)
    kv = await ensure_kv(js)
    owner = JobOwner(js, JobArchive(js), min_age_s=0, state_kv=kv[subjects.SOLVER_STATE_KV])
    await owner.bootstrap()
    ids = [f"arch-{i}" for i in range(40)]
    await owner.commit(*[JobAccepted(event_id=f"a-{j}", job_id=j, spec=spec(0)) for j in ids])
    await owner.commit(*[JobFinished(event_id=f"f-{j}", job_id=j, state="SUCCEEDED", reason="done") for j in ids])
    assert len(await owner.expire()) == len(ids)
    last = (await js.stream_info(subjects.JOBS_STREAM)).state.last_seq

    again = JobOwner(js, JobArchive(js), min_age_s=0, state_kv=kv[subjects.SOLVER_STATE_KV])
    assert await again.bootstrap() == 0, "nothing to replay: every event is archived"
    assert len(again.index) == 0 and again.index.last_seq == last
    # A job after the restart folds as usual, and a second restart replays exactly it.
    await again.commit(JobAccepted(event_id="a-new", job_id="new-1", spec=spec(1)))
    third = JobOwner(js, JobArchive(js), min_age_s=0, state_kv=kv[subjects.SOLVER_STATE_KV])
    await third.bootstrap()
    assert list(third.index.pending) == ["new-1"]
