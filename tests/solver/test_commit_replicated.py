"""The commit rule with Redis replicas (REDIS_WAIT_REPLICAS), on the solver: a gang commit no replica acknowledged
in time is released again and never recorded placed; the cycle counts it (`oneplus_reservation_conflicts{kind=
"not_replicated"}`) and stops placing; reconcile does not record placed for a leftover reservation either while the
replicas do not hold it. Against the embedded Redis, which has no replica: every WAIT runs out.
(tests/reservations/test_sentinel_failover.py runs the rule with real replicas and sentinels.)"""

from __future__ import annotations

import redis.asyncio as aioredis
from nats.aio.client import Client
from oneplus_bus.settings import BusSettings
from oneplus_contracts import Allocation, JobAccepted, RankPlacement
from oneplus_placement_solver.app import SolverSettings, build_solver
from oneplus_reservations import ReservationStore
from oneplus_testing import Servers, wipe_bus
from test_cycle_store_ops import add_nodes, spec


def conflicts(registry: object, kind: str) -> float:
    return registry.get_sample_value("oneplus_reservation_conflicts_total", {"kind": kind}) or 0.0  # type: ignore[attr-defined]


async def test_a_commit_no_replica_acknowledged_is_released_and_never_placed(
    nc: Client, servers: Servers, cluster_name: str
) -> None:
    await wipe_bus(nc)
    store = ReservationStore(
        aioredis.Redis.from_url(servers.redis_url), cluster_name, wait_replicas=1, wait_timeout_ms=50
    )
    await store.wipe()
    svc, solver = build_solver(
        BusSettings(servers.nats_url, servers.redis_url, cluster=cluster_name), SolverSettings(), store, loops=False
    )
    await svc.app.start()
    try:
        await add_nodes(nc, solver, 1)
        await solver.owner.commit(*[JobAccepted(event_id=f"acc-{i}", job_id=f"j{i}", spec=spec(i)) for i in range(2)])
        assert await solver.schedule_once() == 0
        assert conflicts(svc.metrics, "not_replicated") == 1  # the first refusal ends the cycle's placing
        assert await store.all() == [] and await store.held_slots() == {}
        assert {r.job_id for r in solver.owner.index.pending.values()} == {"j0", "j1"}
        assert solver.capacity.held == {}

        # A reservation left behind (a release lost in a failover): reconcile waits for the replicas to hold it.
        held = Allocation(ranks=[RankPlacement(rank=0, node="n0", gpus=[0, 1, 2, 3])])
        store.wait_replicas = 0
        token = await store.reserve("j0", held)
        assert isinstance(token, int)
        store.wait_replicas = 1
        assert await store.replicated() is False
        await solver.reconcile()
        assert solver.owner.index.get("j0").state == "ACCEPTED"  # type: ignore[union-attr]

        # Without the rule (one Redis, no replica: the embedded default) the same cycle places both.
        store.wait_replicas = 0
        await solver.reconcile()
        assert solver.owner.index.get("j0").state != "ACCEPTED"  # type: ignore[union-attr]
        assert await solver.schedule_once() == 1
    finally:
        await svc.app.stop()
        await store.wipe()
