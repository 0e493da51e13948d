"""Taking the lead is all or nothing: a replica that got the owner lease but failed to rebuild the working set (the
bus mid-failover) must try again next beat, not hold the lease as an owner that folds no fact.

Seen in the multi-host chaos run: after every service restarted, the new lease holder's bootstrap met
`ServiceUnavailableError`; it stayed `leading` with no fact loop, the other replica followed it, and every submission
after that waited in the facts stream for ever.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

import pytest
import redis.asyncio as aioredis
from nats.aio.client import Client
from nats.js.errors import ServiceUnavailableError
from oneplus_bus.settings import BusSettings
from oneplus_placement_solver.app import Solver, SolverSettings, build_solver
from oneplus_placement_solver.owner import NotOwner
from oneplus_reservations import ReservationStore
from oneplus_testing import Servers, wipe_bus


@pytest.fixture
async def replicas(nc: Client, servers: Servers, cluster_name: str) -> AsyncIterator[AsyncExitStack]:
    await wipe_bus(nc)
    async with AsyncExitStack() as stack:
        yield stack
    await ReservationStore(aioredis.Redis.from_url(servers.redis_url), cluster_name).wipe()


async def started(stack: AsyncExitStack, servers: Servers, cluster: str, replica: str) -> Solver:
    store = ReservationStore(aioredis.Redis.from_url(servers.redis_url), cluster)
    svc, solver = build_solver(
        BusSettings(servers.nats_url, servers.redis_url, cluster=cluster),
        SolverSettings(replica=replica),
        store,
        loops=False,
    )
    await svc.app.start()
    stack.push_async_callback(svc.app.stop)
    return solver


def failing_once(solver: Solver, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Make the owner's next bootstrap fail as it does while the jobs stream has no leader."""
    calls: list[int] = []
    real = solver.owner.bootstrap

    async def bootstrap(epoch: int | None = None) -> int:
        calls.append(1)
        if len(calls) == 1:
            raise ServiceUnavailableError()
        return await real(epoch)

    monkeypatch.setattr(solver.owner, "bootstrap", bootstrap)
    return calls


async def test_a_lead_whose_rebuild_failed_is_taken_again_next_beat(
    replicas: AsyncExitStack, servers: Servers, cluster_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = await started(replicas, servers, cluster_name, "a")
    b = await started(replicas, servers, cluster_name, "b")
    assert a.leading and not b.leading and b.owner.following
    await a.svc.app.stop()  # a clean stop hands the lease over
    calls = failing_once(b, monkeypatch)

    with pytest.raises(ServiceUnavailableError):
        await b.beat()
    assert b.lease.holder == "b", "the lease was taken"
    assert not b.leading, "a lead whose working set was not rebuilt is not a lead"

    await b.beat()
    assert b.leading and len(calls) == 2, "the next beat takes the lead again"


async def test_a_replica_whose_take_failed_follows_the_one_that_took_the_lease(
    replicas: AsyncExitStack, servers: Servers, cluster_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = await started(replicas, servers, cluster_name, "a")
    b = await started(replicas, servers, cluster_name, "b")
    await a.svc.app.stop()
    failing_once(b, monkeypatch)
    with pytest.raises(ServiceUnavailableError):
        await b.beat()
    assert not b.leading and not b.owner.following

    await b.lease.release()  # b's lease lapses; a third replica takes it
    c = await started(replicas, servers, cluster_name, "c")
    assert c.leading

    await b.beat()
    assert not b.leading and b.owner.following, "neither owning nor following: b would place on a stale index"


async def test_an_owner_loop_ends_once_its_replica_no_longer_leads(
    replicas: AsyncExitStack, servers: Servers, cluster_name: str
) -> None:
    """A deposed owner's loops stop at their first refused write instead of being restarted every second (its fact
    loop kept taking the facts its successor waited for); while the replica still leads, a refusal is retried."""
    solver = await started(replicas, servers, cluster_name, "r1")
    runs: list[bool] = []

    async def refused() -> None:
        runs.append(solver.ctx.leading)
        raise NotOwner("solver r1 does not hold the owner lease (held by r2)")

    loop = solver.membership._while_leading(refused)
    assert loop.__name__ == "refused"
    solver.ctx.leading = True
    with pytest.raises(NotOwner):
        await loop()  # still leading: the guard restarts it
    solver.ctx.leading = False
    await loop()  # deposed: it ends
    assert runs == [True, False]
