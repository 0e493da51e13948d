"""A scheduling cycle's cost follows pending jobs, holders and nodes, never the history: counted, not timed.

The solver runs in this process against real NATS and Redis, with its loops off so the test drives each cycle.
The same cycle (same nodes, same pending gangs) is run on a platform with no finished job and on one with 5,000
finished jobs that went through the job owner; the NATS messages and Redis commands it sends must be equal.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import redis.asyncio as aioredis
from nats.aio.client import Client
from oneplus_bus.settings import BusSettings
from oneplus_contracts import JobAccepted, JobFinished, JobSpec, NodeRecord, subjects
from oneplus_placement_solver.app import Solver, SolverSettings, build_solver
from oneplus_reservations import ReservationStore
from oneplus_testing import Servers, wipe_bus
from oneplus_topology.presets import load_preset

HISTORY = 5000
PENDING = 6


def spec(i: int, gpus: int = 4) -> JobSpec:
    return JobSpec(name=f"j{i}", resources={"gpus": gpus}, simulate={"duration_s": 60})  # type: ignore[arg-type]


@asynccontextmanager
async def solver_on_fresh_bus(nc: Client, servers: Servers, cluster: str) -> AsyncIterator[Solver]:
    await wipe_bus(nc)
    store = ReservationStore(aioredis.Redis.from_url(servers.redis_url), cluster)
    await store.wipe()
    svc, solver = build_solver(
        BusSettings(servers.nats_url, servers.redis_url, cluster=cluster), SolverSettings(), store, loops=False
    )
    await svc.app.start()
    try:
        yield solver
    finally:
        await svc.app.stop()
        await store.wipe()


async def add_nodes(nc: Client, solver: Solver, n: int) -> None:
    kv = await nc.jetstream().key_value(subjects.TOPOLOGY_KV)
    for i in range(n):
        topo = load_preset("h100_sxm_8gpu_nvswitch_nv18", f"n{i}").model_copy(update={"leaf": "leaf-0"})
        await kv.put(f"n{i}", NodeRecord(topology=topo, last_heartbeat=time.time()).model_dump_json().encode())
    await wait_for_nodes(solver, n)


async def wait_for_nodes(solver: Solver, n: int) -> None:
    deadline = time.monotonic() + 10
    while len(solver.capacity.records) < n:  # the solver's topology watch delivers them
        assert time.monotonic() < deadline, "the solver never saw the nodes"
        await _yield()


async def _yield() -> None:
    import asyncio

    await asyncio.sleep(0.05)


async def add_history(solver: Solver, n: int) -> None:
    """Finished jobs made the way the platform makes them: accepted, then finished, folded by the owner."""
    batch = 500
    for start in range(0, n, batch):
        ids = [f"old-{i}" for i in range(start, min(n, start + batch))]
        await solver.owner.commit(*[JobAccepted(event_id=f"acc-{j}", job_id=j, spec=spec(0)) for j in ids])
        await solver.owner.commit(
            *[JobFinished(event_id=f"fin-{j}", job_id=j, state="SUCCEEDED", reason="done") for j in ids]
        )


async def measured_cycle(nc: Client, servers: Servers, solver: Solver) -> tuple[int, int, int]:
    """(NATS messages, Redis commands, gangs placed) of one cycle over PENDING waiting gangs, counted at the client."""
    await solver.owner.commit(
        *[JobAccepted(event_id=f"acc-new-{i}", job_id=f"new-{i}", spec=spec(i)) for i in range(PENDING)]
    )
    solver.memory.saved_usage_at = time.monotonic()  # no periodic fair-share save inside the measured cycle
    redis_client = solver.store.r
    sent = 0
    execute = redis_client.execute_command

    async def counted(*args: object, **kwargs: object) -> object:
        nonlocal sent
        sent += 1
        return await execute(*args, **kwargs)

    make_pipeline = redis_client.pipeline

    def counted_pipeline(*args: Any, **kwargs: Any) -> Any:
        # A cycle's reserves go in one pipeline (reserve_many): count the commands it sends, not just plain calls.
        pipe = make_pipeline(*args, **kwargs)
        run = pipe.execute

        async def execute(*a: Any, **kw: Any) -> Any:
            nonlocal sent
            sent += len(pipe.command_stack)
            return await run(*a, **kw)

        pipe.execute = execute
        return pipe

    redis_client.execute_command = counted  # type: ignore[method-assign]
    redis_client.pipeline = counted_pipeline  # type: ignore[method-assign]
    try:
        nc_stats = solver.svc.nc.stats
        msgs_before = nc_stats["out_msgs"]
        placed = await solver.schedule_once()
        msgs = nc_stats["out_msgs"] - msgs_before
        cmds = sent
    finally:
        redis_client.execute_command = execute  # type: ignore[method-assign]
        redis_client.pipeline = make_pipeline  # type: ignore[method-assign]
    return msgs, cmds, placed


async def test_a_cycle_costs_the_same_with_0_and_5000_finished_jobs(
    nc: Client, servers: Servers, cluster_name: str
) -> None:
    counts = {}
    for history in (0, HISTORY):
        async with solver_on_fresh_bus(nc, servers, f"{cluster_name}h{history}") as solver:
            await add_history(solver, history)
            assert len(solver.owner.index.pending) == 0 and len(solver.owner.index.holders) == 0
            await add_nodes(nc, solver, 2)
            counts[history] = await measured_cycle(nc, servers, solver)
            if history:
                # The finished jobs are in the hot view (younger than MinJobAge) but not in what a cycle reads.
                assert len(solver.owner.index) == HISTORY + PENDING
    assert counts[0][2] == 4, counts  # 2 nodes × 8 GPUs hold four 4-GPU gangs; two wait
    assert counts[0] == counts[HISTORY], f"store operations of one cycle: {counts}"
