"""MIG instances are held in Redis under their own keys: two on one GPU go to two jobs, one twice is a conflict."""

from __future__ import annotations

from oneplus_contracts import Allocation, RankPlacement
from oneplus_reservations import Conflict, ReservationStore, check_history

A = "MIG-0c4e8f6d-2a5b-5d3e-9f1c-7b2a4d6e8f01"
B = "MIG-1d5f9a7e-3b6c-5e4f-a02d-8c3b5e7f9a12"


def mig(*uuids: str) -> Allocation:
    return Allocation(ranks=[RankPlacement(rank=i, node="a100-0", gpus=[], mig=[u]) for i, u in enumerate(uuids)])


async def test_instances_of_one_gpu_are_held_apart(store: ReservationStore) -> None:
    t1 = await store.reserve("j1", mig(A))
    t2 = await store.reserve("j2", mig(B))
    assert isinstance(t1, int) and isinstance(t2, int)
    assert await store.held_slots() == {store.ks.mig("a100-0", A): f"j1|{t1}", store.ks.mig("a100-0", B): f"j2|{t2}"}
    again = await store.reserve("j3", mig(B, A))
    assert isinstance(again, Conflict) and again.key in {store.ks.mig("a100-0", A), store.ks.mig("a100-0", B)}
    assert await store.get("j3") is None
    assert await store.release("j1", t1)
    assert set(await store.held_slots()) == {store.ks.mig("a100-0", B)}
    assert check_history(await store.history()) == []
