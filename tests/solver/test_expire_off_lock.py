"""Saving finished jobs to the archive does not hold the job owner's commit lock while it writes.

A pass moves every job that finished in an expire interval. Archived and purged under the lock, one round trip a job,
250 jobs (50 a second, 5 s apart) held every commit, and so every submission's reply, for 75-140 ms each pass.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from nats.aio.client import Client
from oneplus_bus.fencing import OwnerFence
from oneplus_bus.ledger import latest_items
from oneplus_bus.streams import ensure_kv, ensure_streams
from oneplus_contracts import JobAccepted, JobFinished, subjects
from oneplus_contracts.jobindex import FinishedJob
from oneplus_placement_solver.owner import JobOwner
from oneplus_stores.archive import JobArchive
from test_cycle_store_ops import spec


class WatchedArchive(JobArchive):
    """The archive, doing what the test asks while its writes are under way."""

    def __init__(self, *args: object, during: object = None, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.during = during
        self.batches: list[list[str]] = []

    async def put_finished(self, done: Sequence[FinishedJob], fence: OwnerFence | None = None) -> None:
        self.batches.append([d.job_id for d in done])
        if done and self.during is not None:
            await self.during()  # type: ignore[operator]
        await super().put_finished(done, fence)


async def test_a_commit_goes_on_while_finished_jobs_are_archived_and_they_stay_findable(nc: Client) -> None:
    js = nc.jetstream()
    await ensure_streams(js)
    kv = await ensure_kv(js)
    archive = WatchedArchive(js)
    owner = JobOwner(js, archive, min_age_s=0, state_kv=kv[subjects.SOLVER_STATE_KV])
    await owner.bootstrap()
    ids = [f"exp-{i}" for i in range(300)]
    await owner.commit(*[JobAccepted(event_id=f"a-{j}", job_id=j, spec=spec(0)) for j in ids])
    await owner.commit(*[JobFinished(event_id=f"f-{j}", job_id=j, state="SUCCEEDED", reason="done") for j in ids])
    seen: dict[str, object] = {}

    async def while_archiving() -> None:
        # Under the old pass this waited for the lock the pass held: a submission's reply waited the whole pass.
        (rec,) = await asyncio.wait_for(
            owner.commit(JobAccepted(event_id="a-late", job_id="late-1", spec=spec(1))), timeout=5
        )
        seen["committed"] = rec
        seen["still_indexed"] = all(j in owner.index for j in ids)

    archive.during = while_archiving
    gone = await owner.expire()
    assert seen["committed"] is not None, "the commit during the pass applied"
    assert seen["still_indexed"], "a job being archived is still in the index (a dependency on it finds it)"
    assert sorted(d.job_id for d in gone) == sorted(ids)
    assert archive.batches == [ids]
    assert not any(j in owner.index for j in ids) and list(owner.index.pending) == ["late-1"]
    for j in (ids[0], ids[-1]):
        got = await archive.get(j)
        assert got is not None and got.state == "SUCCEEDED"
    # Never in the bucket of live records; the job committed during the pass is saved by the next save.
    keys = {k for k, _ in await latest_items(js, subjects.JOBS_KV)}  # kv.keys() can miss one under load
    assert keys == set()
    await owner.save(flush=True)
    assert {k for k, _ in await latest_items(js, subjects.JOBS_KV)} == {"late-1"}
    # The sequence saved covers the pass: a restarted owner replays only what came after it.
    again = JobOwner(js, JobArchive(js), min_age_s=0, state_kv=kv[subjects.SOLVER_STATE_KV])
    await again.bootstrap()
    assert list(again.index.pending) == ["late-1"] and not any(j in again.index for j in ids)
