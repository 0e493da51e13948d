"""The solver's metrics after real cycles (in this process, loops off, real NATS and Redis): pending jobs by reason,
gangs placed (tightest or not), waits, cycle times, GPUs per node, leaf and NVLink domain, refused commits."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import redis.asyncio as aioredis
from nats.aio.client import Client
from oneplus_bus.settings import BusSettings
from oneplus_contracts import Allocation, JobAccepted, JobSpec, NodeRecord, subjects
from oneplus_placement_solver.app import Solver, SolverSettings, build_solver
from oneplus_placement_solver.metrics import SolverMetrics
from oneplus_reservations import Conflict, ReservationStore
from oneplus_testing import Servers, wipe_bus
from oneplus_topology.presets import load_preset
from prometheus_client import CollectorRegistry


def spec(name: str, gpus: int, ranks: int = 1, priority: int = 0) -> JobSpec:
    return JobSpec(
        name=name,
        ranks=ranks,
        priority=priority,
        resources={"gpus": gpus},
        simulate={"duration_s": 60},
    )


@asynccontextmanager
async def solver_with_nodes(nc: Client, servers: Servers, cluster: str, nodes: int) -> AsyncIterator[Solver]:
    await wipe_bus(nc)
    store = ReservationStore(aioredis.Redis.from_url(servers.redis_url), cluster)
    await store.wipe()
    svc, solver = build_solver(
        BusSettings(servers.nats_url, servers.redis_url, cluster=cluster), SolverSettings(), store, loops=False
    )
    await svc.app.start()
    try:
        kv = await nc.jetstream().key_value(subjects.TOPOLOGY_KV)
        for i in range(nodes):
            topo = load_preset("h100_sxm_8gpu_nvswitch_nv18", f"n{i}").model_copy(update={"leaf": "leaf-0"})
            await kv.put(f"n{i}", NodeRecord(topology=topo, last_heartbeat=time.time()).model_dump_json().encode())
        deadline = time.monotonic() + 10
        while len(solver.capacity.records) < nodes:
            assert time.monotonic() < deadline, "the solver never saw the nodes"
            await asyncio.sleep(0.05)
        yield solver
    finally:
        await svc.app.stop()
        await store.wipe()


def capacity_series(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    names = ("oneplus_node_gpus", "oneplus_leaf_gpus", "oneplus_nvlink_domain_gpus")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in registry.collect()
        if family.name in names
        for sample in family.samples
    }


def value(solver: Solver, name: str, **labels: str) -> float:
    got = solver.svc.metrics.get_sample_value(name, labels)
    return 0.0 if got is None else got


async def test_metrics_after_a_cycle(nc: Client, servers: Servers, cluster_name: str) -> None:
    async with solver_with_nodes(nc, servers, cluster_name, 2) as solver:
        await solver.owner.commit(
            *[JobAccepted(event_id=f"acc-{i}", job_id=f"s-{i}", spec=spec(f"s{i}", 4, priority=5)) for i in range(3)],
            JobAccepted(event_id="acc-big", job_id="big", spec=spec("big", 8, ranks=2)),
        )
        placed = await solver.schedule_once()
        assert placed == 3
        assert value(solver, "oneplus_gangs_placed_total", domain="node", tightest="true") == 3
        assert value(solver, "oneplus_job_submit_to_placed_seconds_count", queue="default") == 3
        assert value(solver, "oneplus_scheduling_cycle_seconds_count") == 1
        reason = solver.decision.reasons["big"].code if solver.decision else "?"
        assert value(solver, "oneplus_pending_jobs", queue="default", priority="0", reason=reason) == 1

        # The capacity gauges were set at the cycle's start (all free); a second later they follow the holds.
        assert value(solver, "oneplus_node_gpus", node="n1", leaf="leaf-0", state="free") == 8
        assert solver.metrics.capacity(solver.capacity.state(), time.monotonic() + 0.5) is False  # once a second
        assert solver.metrics.capacity(solver.capacity.state(), force=True)
        # Unchanged holds a second later: the walk over every node is skipped, the gauges stay as they are.
        assert solver.metrics.capacity(solver.capacity.state(), time.monotonic() + 2.0) is False
        by_node = {
            n: {
                st: value(solver, "oneplus_node_gpus", node=n, leaf="leaf-0", state=st)
                for st in ("allocated", "free", "fragmented", "unavailable")
            }
            for n in ("n0", "n1")
        }
        assert sorted(d["allocated"] for d in by_node.values()) == [4, 8]
        part = next(d for d in by_node.values() if d["allocated"] == 4)
        assert part == {"allocated": 4, "free": 4, "fragmented": 4, "unavailable": 0}
        assert value(solver, "oneplus_leaf_gpus", leaf="leaf-0", state="allocated") == 12
        assert value(solver, "oneplus_leaf_gpus", leaf="leaf-0", state="fragmented") == 4
        part_node = next(n for n, d in by_node.items() if d["allocated"] == 4)
        domain = {"node": part_node, "domain": f"{part_node}/nvl0"}
        assert value(solver, "oneplus_nvlink_domain_gpus", **domain, state="fragmented") == 4

        # A release changes the holds: the next second's pass recomputes.
        released = next(iter(solver.capacity.held))
        solver.capacity.release(released)
        assert solver.metrics.capacity(solver.capacity.state(), time.monotonic() + 4.0)
        assert value(solver, "oneplus_leaf_gpus", leaf="leaf-0", state="allocated") < 12
        # Only the released node was recomputed: every series equals a full recount of the same holds.
        fresh = CollectorRegistry()
        assert SolverMetrics(fresh).capacity(solver.capacity.state(), force=True)
        assert capacity_series(solver.svc.metrics) == capacity_series(fresh)

        # Two 8-GPU ranks: one node cannot hold them, one leaf can.
        assert solver.metrics.tightest_level(solver.capacity.state().layout, 2, 8) == "leaf"
        assert solver.metrics.tightest_level(solver.capacity.state().layout, 2, 16) == "cluster"


def test_the_pending_gauges_priority_label_is_a_bounded_band() -> None:
    from oneplus_placement_solver.metrics import priority_band

    bands = {priority_band(p) for p in (-5, 0, 1, 5, 99, 100, 999, 1000, 9999, 10000, 10**6)}
    assert bands == {"<0", "0", "1-99", "100-999", "1000-9999", "10000+"}
    assert (priority_band(5), priority_band(100), priority_band(10**6)) == ("1-99", "100-999", "10000+")


async def test_refused_commits_are_counted(nc: Client, servers: Servers, cluster_name: str) -> None:
    async with solver_with_nodes(nc, servers, cluster_name, 1) as solver:
        await solver.owner.commit(JobAccepted(event_id="acc-a", job_id="a", spec=spec("a", 4)))
        reserve_many = solver.store.reserve_many

        async def taken(gangs: list[tuple[str, Allocation]], *args: Any, **kwargs: Any) -> Any:
            return [Conflict("GPUs already held", holder="someone") for _ in gangs]

        solver.store.reserve_many = taken  # type: ignore[method-assign]
        try:
            assert await solver.schedule_once() == 0
        finally:
            solver.store.reserve_many = reserve_many  # type: ignore[method-assign]
        assert value(solver, "oneplus_reservation_conflicts_total", kind="taken") == 1
        assert await solver.schedule_once() == 1
        assert value(solver, "oneplus_pending_jobs", queue="default", priority="0", reason="None") == 0
