"""A `placement: cp-sat` queue in the live solver: the joint plan is committed through Redis like any placement.

The hand-checked window of tests/queueing/test_batch_policy.py on real NATS and Redis: eight 2-GPU jobs submitted
before eight 6-GPU jobs, eight empty 8-GPU nodes. Best fit one by one would place 52 GPUs; the plan places 64.
"""

from __future__ import annotations

from nats.aio.client import Client
from oneplus_contracts import JobAccepted
from oneplus_queueing.config import load_queue_config
from oneplus_testing import Servers
from test_cycle_store_ops import add_nodes, solver_on_fresh_bus, spec


async def test_the_live_solver_places_a_cp_sat_queue_jointly_and_reserves_every_planned_gpu(
    nc: Client, servers: Servers, cluster_name: str
) -> None:
    async with solver_on_fresh_bus(nc, servers, cluster_name) as solver:
        solver.config = load_queue_config(
            "queues: [{name: default, placement: cp-sat}]\njob_size: {weight: 0}\nbatch: {time_limit_s: 2.0}\n"
        )
        await add_nodes(nc, solver, 8)
        sizes = [2] * 8 + [6] * 8
        await solver.owner.commit(
            *[JobAccepted(event_id=f"a-b{i:02d}", job_id=f"b{i:02d}", spec=spec(i, g)) for i, g in enumerate(sizes)]
        )
        assert await solver.schedule_once() == 16
        decision = solver.decision
        assert decision is not None and decision.stats.batch_solves == 1
        held = await solver.store.all()
        assert sum(len(r.gpus) for res in held for r in res.allocation.ranks) == 64, "every GPU reserved in Redis"
        nodes = [solver.owner.index.get(f"b{i:02d}").allocation.ranks[0].node for i in range(16)]
        assert sorted(nodes) == sorted([f"n{i}" for i in range(8)] * 2), "a 2-GPU and a 6-GPU job on every node"
