"""A fleet's nodes check their launches' leases together: the checks made in one turn of the loop (a burst's
launches) share one round trip to the store, and each gets the verdict a call of its own would have given."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis
from oneplus_contracts import Allocation, RankPlacement
from oneplus_node_executor.fleet import FleetStore
from oneplus_reservations import ReservationStore, Token
from oneplus_testing import Servers


def alloc(node: str, gpu: int) -> Allocation:
    return Allocation(ranks=[RankPlacement(rank=0, node=node, gpus=[gpu])])


@pytest.fixture
async def fleet_store(store: ReservationStore, servers: Servers) -> AsyncIterator[FleetStore]:
    """The fleet's store over the same keys as `store` (what a solver reserved in)."""
    fs = FleetStore(aioredis.Redis.from_url(servers.redis_url), store.ks.cluster)
    try:
        yield fs
    finally:
        await fs.close()


async def test_lease_checks_of_one_turn_share_a_round_trip(
    store: ReservationStore, fleet_store: FleetStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    tokens = [await store.reserve(f"j{i}", alloc(f"n{i}", 0)) for i in range(3)]
    assert all(isinstance(t, Token) for t in tokens)
    batches: list[list[tuple[str, int]]] = []
    renew_many = fleet_store.renew_many

    async def counted(held: list[tuple[str, int]], lease_s: float) -> Any:
        batches.append(list(held))
        return await renew_many(held, lease_s)

    monkeypatch.setattr(fleet_store, "renew_many", counted)
    got = await asyncio.gather(
        fleet_store.renew_status("j0", tokens[0], 30.0),
        fleet_store.renew_status("j1", tokens[1] + 1, 30.0),  # a newer attempt's token: not this one's
        fleet_store.renew_status("j2", tokens[2], 30.0),
        fleet_store.renew_status("j2", tokens[2], 30.0),  # the same check twice: one answer for both
        fleet_store.renew_status("nobody", 7, 30.0),
    )
    assert got == ["ok", "stale", "ok", "ok", "gone"]
    assert len(batches) == 1 and len(batches[0]) == 4
    # The same verdicts one call at a time (what a node of its own does).
    alone = [await store.renew_status(j, t, 30.0) for j, t in (("j0", tokens[0]), ("j1", tokens[1] + 1))]
    assert alone == ["ok", "stale"]
    # A later turn's check is a batch of its own.
    assert await fleet_store.renew_status("j0", tokens[0], 30.0) == "ok"
    assert len(batches) == 2


async def test_a_store_error_reaches_every_check_of_the_batch(
    fleet_store: FleetStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def down(held: list[tuple[str, int]], lease_s: float) -> Any:
        raise ConnectionError("redis is down")

    monkeypatch.setattr(fleet_store, "renew_many", down)
    got = await asyncio.gather(
        fleet_store.renew_status("a", 1, 30.0), fleet_store.renew_status("b", 2, 30.0), return_exceptions=True
    )
    assert [type(e) for e in got] == [ConnectionError, ConnectionError]
