"""The job index knows which live attempt holds each GPU, so the owner can refuse a placement on a held one."""

from __future__ import annotations

from oneplus_contracts import Allocation, JobAccepted, JobFinished, JobPlaced, JobSpec, RankPlacement, apply_event
from oneplus_contracts.jobindex import GpuSlots, JobIndex


def alloc(node: str, *gpus: int, milli: int = 0, mig: tuple[str, ...] = ()) -> Allocation:
    return Allocation(ranks=[RankPlacement(rank=0, node=node, gpus=list(gpus), gpu_milli=milli, mig=list(mig))])


def test_whole_gpus_shares_and_mig_instances_conflict_as_the_store_counts_them() -> None:
    slots = GpuSlots()
    slots.hold("a", alloc("n0", 0, 1))
    assert slots.conflict("b", alloc("n0", 1, 2)) == "n0 GPU 1 is held by a"
    assert slots.conflict("b", alloc("n0", 2, 3)) is None
    assert slots.conflict("a", alloc("n0", 0, 1)) is None, "a job's own hold is no conflict (its next attempt)"
    assert slots.conflict("b", alloc("n0", 1), ended={"a"}) is None, "an attempt ended earlier in the batch"

    slots.hold("s1", alloc("n0", 4, milli=600))
    assert slots.conflict("s2", alloc("n0", 4, milli=400)) is None
    assert slots.conflict("s2", alloc("n0", 4, milli=500)) == "n0 GPU 4 has 400 milli-GPUs left, 500 asked"
    assert slots.conflict("w", alloc("n0", 4)) == "n0 GPU 4 is held by s1", "a whole GPU over a share"
    batch = GpuSlots()
    batch.hold("s2", alloc("n0", 4, milli=400))
    assert slots.conflict("s3", alloc("n0", 4, milli=1), batch) is not None, "shares of this batch count too"

    slots.hold("m", alloc("n1", mig=("MIG-1",)))
    assert slots.conflict("m2", alloc("n1", mig=("MIG-1",))) == "n1 GPU MIG-1 is held by m"
    assert slots.conflict("m2", alloc("n1", mig=("MIG-2",))) is None
    slots.release("a")
    assert slots.conflict("b", alloc("n0", 0, 1)) is None


def test_the_index_holds_slots_from_placed_until_the_attempt_ends() -> None:
    index = JobIndex()
    spec = JobSpec(name="x", resources={"gpus": 2})  # type: ignore[arg-type]
    rec = apply_event(None, JobAccepted(event_id="acc", job_id="x", spec=spec)).model_copy(update={"seq": 1})
    index.put(rec)
    assert index.slots.held == {}
    placed = JobPlaced(event_id="p", job_id="x", allocation=alloc("n0", 0, 1), token=7, attempt=1)
    rec = apply_event(rec, placed).model_copy(update={"seq": 2})
    index.put(rec)
    assert index.slots.conflict("y", alloc("n0", 1)) == "n0 GPU 1 is held by x"
    done = JobFinished(event_id="f", job_id="x", state="SUCCEEDED", reason="done")
    index.put(apply_event(rec, done).model_copy(update={"seq": 3}))
    assert index.slots.held == {} and index.slots.by_job == {}
