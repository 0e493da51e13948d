"""The solver's memory in the `solver_state` KV bucket, on a real JetStream: what a restarted solver reads back."""

from __future__ import annotations

from nats.aio.client import Client
from oneplus_bus.streams import ensure_kv
from oneplus_contracts import Allocation, RankPlacement, subjects
from oneplus_placement_solver.memory import NOMINATIONS_KEY, USAGE_KEY, SolverMemory
from oneplus_queueing.fairshare import UsageHistory
from oneplus_queueing.model import CycleCarry

QUEUES = ("default", "research")
ALLOC = Allocation(ranks=[RankPlacement(rank=0, node="h100-0", gpus=[0, 1, 2, 3])])


async def _memory(nc: Client) -> SolverMemory:
    kv = (await ensure_kv(nc.jetstream()))[subjects.SOLVER_STATE_KV]
    return SolverMemory(kv)


async def test_usage_nominations_and_the_protected_job_written_by_one_solver_are_read_by_the_next(
    nc: Client,
) -> None:
    first = await _memory(nc)
    assert await first.load_usage(QUEUES) is None and await first.load_carry() == CycleCarry()
    usage = UsageHistory(half_life_s=3600.0, as_of=1000.0, usage={"research": 7200.0})
    usage.record_preemption(990.0, "victim", "preemptor", 4.0)
    await first.save_usage(usage, QUEUES)
    await first.save_carry(CycleCarry({"preemptor": ALLOC}, "big"))

    restarted = await _memory(nc)
    assert await restarted.load_usage(QUEUES) == usage
    assert await restarted.load_carry() == CycleCarry({"preemptor": ALLOC}, "big")
    assert await restarted.load_usage(("default",)) is None, "another queue tree starts a new history"


async def test_unchanged_nominations_and_frequent_usage_are_not_rewritten(nc: Client) -> None:
    mem = await _memory(nc)
    await mem.save_carry(CycleCarry({"p": ALLOC}, "p"))
    rev = (await mem.kv.get(NOMINATIONS_KEY)).revision
    await mem.save_carry(CycleCarry({"p": ALLOC}, "p"))
    assert (await mem.kv.get(NOMINATIONS_KEY)).revision == rev
    await mem.save_carry(CycleCarry({"p": ALLOC}, None))  # the protected job started: written
    assert (await mem.kv.get(NOMINATIONS_KEY)).revision > rev
    usage = UsageHistory(as_of=5.0)
    await mem.save_usage(usage, QUEUES)
    rev = (await mem.kv.get(USAGE_KEY)).revision
    usage.as_of = 6.0
    await mem.save_usage(usage, QUEUES)  # within the save interval: skipped
    assert (await mem.kv.get(USAGE_KEY)).revision == rev
    await mem.save_usage(usage, QUEUES, force=True)  # a preemption forces it
    assert (await mem.kv.get(USAGE_KEY)).revision > rev
    assert (await (await _memory(nc)).load_usage(QUEUES)) == usage


async def test_unreadable_stored_state_starts_afresh_instead_of_stopping_the_solver(nc: Client) -> None:
    mem = await _memory(nc)
    await mem.kv.put(USAGE_KEY, b'{"queues": ["default", "research"], "history": {"as_of": "soon"}}')
    await mem.kv.put(NOMINATIONS_KEY, b"not json")
    assert await mem.load_usage(QUEUES) is None
    assert await mem.load_carry() == CycleCarry()


async def test_nominations_stored_before_the_protected_job_was_kept_still_load(nc: Client) -> None:
    mem = await _memory(nc)
    await mem.kv.put(NOMINATIONS_KEY, b'{"nominations": {"p": ' + ALLOC.model_dump_json().encode() + b"}}")
    assert await mem.load_carry() == CycleCarry({"p": ALLOC}, None)
