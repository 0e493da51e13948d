"""A heterogeneous job through a real solver (NATS, Redis; the test drives cycles): its components are placed in one
decision, each by its own shape and constraint, or not at all."""

from __future__ import annotations

from nats.aio.client import Client
from oneplus_jobformats.sbatch import parse_sbatch
from oneplus_testing import Servers
from test_cycle_store_ops import solver_on_fresh_bus
from test_nodes_kinds_solver import accept, add_demo_nodes, job, nodes_of

# Component 0: one CPU-only task (the driver); component 1: two H100 nodes of 8 GPUs.
HET = """#!/bin/sh
#SBATCH --job-name=rl --ntasks=1
#SBATCH hetjob
#SBATCH --nodes={nodes} --ntasks-per-node=1 --gpus-per-node=8 -C h100
srun --het-group=1 hostname
"""


async def test_components_are_placed_in_one_decision_each_by_its_shape(
    nc: Client, servers: Servers, cluster_name: str
) -> None:
    async with solver_on_fresh_bus(nc, servers, f"{cluster_name}het") as solver:
        await add_demo_nodes(nc, solver)
        await accept(solver, "het", parse_sbatch(HET.format(nodes=2), submit_dir="").spec)
        assert await solver.schedule_once() == 1
        driver, *trainers = nodes_of(solver, "het")
        assert sorted(trainers) == ["h100-0", "h100-1"] and driver not in trainers
        rec = solver.owner.index.get("het")
        assert rec is not None and rec.allocation is not None
        assert [len(r.gpus) for r in rec.allocation.ranks[1:]] == [8, 8]
        # The H100s are held by the job: another H100 gang waits.
        await accept(solver, "after", job("after", 1, 8, ["H100"]))
        assert await solver.schedule_once() == 0


async def test_a_component_that_cannot_fit_holds_nothing_and_is_explained(
    nc: Client, servers: Servers, cluster_name: str
) -> None:
    async with solver_on_fresh_bus(nc, servers, f"{cluster_name}hetno") as solver:
        await add_demo_nodes(nc, solver)
        await accept(solver, "het", parse_sbatch(HET.format(nodes=3), submit_dir="").spec)  # 3 H100 nodes: 2 exist
        assert await solver.schedule_once() == 0
        rec = solver.owner.index.get("het")
        assert rec is not None and rec.state == "ACCEPTED" and rec.allocation is None
        why = await solver.explain({"job_id": "het"}, {})
        assert "component 1" in why["message"], why["message"]
        # Nothing was held for component 0: every node still takes a whole-node job.
        for name in ("h100-0", "h100-1", "a100-0", "l40s-0"):
            await accept(solver, f"fill-{name}", job(f"fill-{name}", 1, 8, nodelist=[name], priority=10))
        assert await solver.schedule_once() == 4
