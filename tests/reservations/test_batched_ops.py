"""A cycle's reserves and a settle's releases go to the store in one round trip each, with the same verdicts as
one call per gang: each gang all or nothing on its own, a refusal never undoing another, a stale token freeing
nothing."""

from __future__ import annotations

from typing import Any

import pytest
from oneplus_contracts import Allocation, RankPlacement
from oneplus_reservations import Conflict, ReservationStore, Token, check_history


def alloc(node: str, *gpus: int) -> Allocation:
    return Allocation(ranks=[RankPlacement(rank=0, node=node, gpus=list(gpus))])


class CountingConnections:
    """How many times the store's client takes a connection from its pool: once per round trip it makes."""

    def __init__(self, store: ReservationStore) -> None:
        self.pool = store.r.connection_pool
        self.taken = 0
        self._get = self.pool.get_connection

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        self.taken += 1
        return await self._get(*args, **kwargs)


async def test_reserve_many_takes_each_gang_or_refuses_it_on_its_own(
    store: ReservationStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    await store.load_scripts()
    held = await store.reserve("held", alloc("n0", 6, 7))
    assert isinstance(held, Token)
    counting = CountingConnections(store)
    monkeypatch.setattr(counting.pool, "get_connection", counting.get_connection)
    out = await store.reserve_many(
        [
            ("a", alloc("n0", 0, 1)),
            ("b", alloc("n0", 1, 2)),  # shares GPU 1 with a, taken just before it in the same batch
            ("c", alloc("n0", 5, 6)),  # GPU 6 is held by an earlier gang
            ("d", alloc("n0", 3, 3)),  # names one GPU twice: refused before it reaches the store
            ("e", alloc("n0", 4)),
        ]
    )
    assert counting.taken == 1, "one pipeline for the batch, not a round trip per gang"
    a, b, c, d, e = out
    assert isinstance(a, Token) and isinstance(e, Token) and e > a > held
    assert isinstance(b, Conflict) and b.holder.startswith("a|")
    assert isinstance(c, Conflict) and c.holder.startswith("held|")
    assert isinstance(d, Conflict) and "twice" in d.reason
    assert {r.job_id for r in await store.all()} == {"held", "a", "e"}
    assert check_history(await store.history()) == []


async def test_reserve_many_refuses_every_gang_of_a_reset_store(store: ReservationStore) -> None:
    await store.r.delete(store.ks.epoch)  # what a reset leaves: no epoch marker
    out = await store.reserve_many([("a", alloc("n0", 0)), ("b", alloc("n0", 1))])
    assert all(isinstance(r, Conflict) and r.store_reset for r in out)
    assert await store.all() == []


async def test_release_many_frees_current_tokens_only(store: ReservationStore, monkeypatch: pytest.MonkeyPatch) -> None:
    a = await store.reserve("a", alloc("n0", 0))
    b = await store.reserve("b", alloc("n0", 1))
    assert isinstance(a, Token) and isinstance(b, Token)
    counting = CountingConnections(store)
    monkeypatch.setattr(counting.pool, "get_connection", counting.get_connection)
    freed = await store.release_many([("a", a, "finished"), ("b", b + 1, "a stale attempt"), ("gone", None, "x")])
    assert counting.taken == 1
    assert freed == [a, None, None]
    assert [r.job_id for r in await store.all()] == ["b"], "a stale token frees nothing"
    again = await store.reserve_many([("c", alloc("n0", 0)), ("d", alloc("n0", 1))])
    assert isinstance(again[0], Token), "a's GPU is free again"
    assert isinstance(again[1], Conflict) and again[1].holder.startswith("b|")
    assert check_history(await store.history()) == []
