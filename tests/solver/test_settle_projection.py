"""The record of a gang's last node end is not written to the hot view on its own when the reaction settles the
attempt at once (the solver): the settling commit writes the record it ends as. Nothing is lost if the settle never
comes: the deferred record goes out with the next commit, and no sequence is saved as projected before it does, so a
new owner replays the event from the job stream."""

from __future__ import annotations

from nats.aio.client import Client
from nats.js import JetStreamContext
from oneplus_bus.ledger import projected_seq
from oneplus_bus.streams import ensure_kv, ensure_streams
from oneplus_contracts import (
    Allocation,
    JobAccepted,
    JobFinished,
    JobNodeFinished,
    JobPlaced,
    JobRecord,
    JobRunning,
    RankPlacement,
    subjects,
)
from oneplus_placement_solver.owner import Applied, JobOwner
from oneplus_stores.archive import JobArchive
from test_cycle_store_ops import spec

KV_STREAM = f"KV_{subjects.JOBS_KV}"


async def owner_of(nc: Client, settles: bool) -> tuple[JetStreamContext, JobOwner]:
    js = nc.jetstream()
    await ensure_streams(js)
    kv = await ensure_kv(js)
    owner = JobOwner(js, JobArchive(js), min_age_s=3600, state_kv=kv[subjects.SOLVER_STATE_KV])
    owner.settled_by_reaction = True
    if settles:

        async def settle(applied: list[Applied]) -> None:  # what the solver's controller does on the last node's end
            for a in applied:
                if a.event.type == "node_finished":
                    await owner.commit(
                        JobFinished(event_id=f"f-{a.record.job_id}", job_id=a.record.job_id, state="SUCCEEDED",
                                    reason="all ranks exited 0", token=a.record.token)
                    )  # fmt: skip

        owner.on_applied(settle)
    await owner.bootstrap()
    return js, owner


async def running(owner: JobOwner, job_id: str) -> None:
    # A GPU of its own: an attempt whose end is not settled still holds its GPU, and the owner refuses to place another.
    alloc = Allocation(ranks=[RankPlacement(rank=0, node="n0", gpus=[sum(map(ord, job_id)) % 8])])
    await owner.commit(
        JobAccepted(event_id=f"a-{job_id}", job_id=job_id, spec=spec(0, 1)),
        JobPlaced(event_id=f"p-{job_id}", job_id=job_id, allocation=alloc, token=5),
        JobRunning(event_id=f"r-{job_id}", job_id=job_id, node="n0", token=5),
    )


def ended(job_id: str) -> JobNodeFinished:
    return JobNodeFinished(event_id=f"n-{job_id}", job_id=job_id, node="n0", token=5, exit_code=0, reason="exited 0")


async def kv_appends(js: JetStreamContext) -> int:
    return int((await js.stream_info(KV_STREAM)).state.last_seq or 0)


async def hot(js: JetStreamContext, job_id: str) -> JobRecord:
    kv = await js.key_value(subjects.JOBS_KV)
    return JobRecord.model_validate_json((await kv.get(job_id)).value or b"")


async def test_the_last_nodes_end_and_the_attempts_end_write_the_record_once(nc: Client) -> None:
    js, owner = await owner_of(nc, settles=True)
    await running(owner, "s")
    before = await kv_appends(js)
    await owner.commit(ended("s"))
    assert await kv_appends(js) == before + 1, "one hot-view write for the node's end and the attempt's"
    rec = await hot(js, "s")
    assert rec.state == "SUCCEEDED" and rec.nodes_done == {"n0": 0}
    assert not owner.unprojected


async def test_a_settle_that_never_comes_leaves_the_record_to_the_next_commit_and_the_sequence_unsaved(
    nc: Client,
) -> None:
    js, owner = await owner_of(nc, settles=False)
    await running(owner, "u")
    await owner.commit(ended("u"))
    assert (await hot(js, "u")).nodes_done == {}, "not written on its own"
    assert "u" in owner.unprojected
    await owner.expire()  # saves the projected sequence: only after writing what is left
    assert (await hot(js, "u")).nodes_done == {"n0": 0} and not owner.unprojected
    assert await projected_seq((await ensure_kv(js))[subjects.SOLVER_STATE_KV]) == owner.index.last_seq

    # An owner that dies before writing it: the next one replays the event (the sequence was not saved past it).
    await running(owner, "v")
    await owner.commit(ended("v"))
    assert "v" in owner.unprojected
    _, again = await owner_of(nc, settles=False)
    assert again.index.get("v").nodes_done == {"n0": 0}  # type: ignore[union-attr]
