"""Issue 44 through a real solver (NATS, Redis; loops off, the test drives cycles) on the demo cluster's models.

`--nodes=2` takes two distinct nodes; a gang naming no model waits rather than span an A100 and an L40S; `jobs
explain` offers only victims on GPUs the gang may use and says each clause once.
"""

from __future__ import annotations

import asyncio
import time

from nats.aio.client import Client
from oneplus_contracts import JobAccepted, JobSpec, NodeRecord, subjects
from oneplus_jobformats.sbatch import parse_sbatch
from oneplus_placement_solver.app import Solver
from oneplus_testing import Servers
from oneplus_topology.presets import load_preset
from test_cycle_store_ops import solver_on_fresh_bus

NODES = (
    ("h100-0", "h100_sxm_8gpu_nvswitch_nv18", "leaf-0"),
    ("h100-1", "h100_sxm_8gpu_nvswitch_nv18", "leaf-0"),
    ("a100-0", "dgx_a100_8gpu_nv12_12nic", "leaf-1"),
    ("l40s-0", "l40s_8gpu_pcie_node_sys", "leaf-1"),
)


async def add_demo_nodes(nc: Client, solver: Solver) -> None:
    kv = await nc.jetstream().key_value(subjects.TOPOLOGY_KV)
    for name, preset, leaf in NODES:
        topo = load_preset(preset, name).model_copy(update={"leaf": leaf, "spine": "spine-0"})
        await kv.put(name, NodeRecord(topology=topo, last_heartbeat=time.time()).model_dump_json().encode())
    deadline = time.monotonic() + 10
    while len(solver.capacity.records) < len(NODES):
        assert time.monotonic() < deadline, "the solver never saw the nodes"
        await asyncio.sleep(0.05)


def job(name: str, ranks: int, gpus: int, models: list[str] | None = None, priority: int = 0, **kw: object) -> JobSpec:
    resources: dict[str, object] = {"gpus": gpus}
    if models:
        resources["gpu_models"] = models
    return JobSpec.model_validate({"name": name, "ranks": ranks, "priority": priority, "resources": resources, **kw})


async def accept(solver: Solver, job_id: str, spec: JobSpec) -> None:
    await solver.owner.commit(JobAccepted(event_id=f"acc-{job_id}", job_id=job_id, spec=spec))


def nodes_of(solver: Solver, job_id: str) -> list[str]:
    rec = solver.owner.index.get(job_id)
    assert rec is not None and rec.allocation is not None, f"{job_id} is not placed"
    return [r.node for r in rec.allocation.ranks]


async def test_sbatch_nodes_two_takes_two_distinct_nodes(nc: Client, servers: Servers, cluster_name: str) -> None:
    script = "#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --gpus-per-node=4\n#SBATCH --ntasks-per-node=1\nsrun hostname\n"
    async with solver_on_fresh_bus(nc, servers, f"{cluster_name}n2") as solver:
        await add_demo_nodes(nc, solver)
        await accept(solver, "two", parse_sbatch(script).spec)
        assert await solver.schedule_once() == 1
        got = nodes_of(solver, "two")
        assert len(set(got)) == 2, f"both ranks on {got}"


async def test_a_gang_waits_for_one_model_and_explain_names_only_useful_victims(
    nc: Client, servers: Servers, cluster_name: str
) -> None:
    async with solver_on_fresh_bus(nc, servers, f"{cluster_name}kind") as solver:
        await add_demo_nodes(nc, solver)
        await accept(solver, "hold-a", job("hold-a", 1, 8, ["H100"], priority=100))
        await accept(solver, "hold-b", job("hold-b", 1, 8, ["H100"], priority=100))
        assert await solver.schedule_once() == 2
        # The H100s are busy: a 2x8 gang naming no model does not take the A100 board and the L40S box.
        await accept(solver, "any", job("any", 2, 8, preemptible=False))
        assert await solver.schedule_once() == 0
        why = await solver.explain({"job_id": "any"}, {})
        assert why["reason"] == "Topology" and "waits for one GPU model" in why["message"], why["message"]
        solver_rec = solver.owner.index.get("any")
        assert solver_rec is not None and solver_rec.state == "ACCEPTED"
        # Low-priority jobs on the A100 and the L40S, and a gang that needs H100s.
        await accept(solver, "low-a100", job("low-a100", 1, 2, ["A100"]))
        await accept(solver, "low-l40s", job("low-l40s", 1, 2, ["L40S"]))
        await accept(solver, "want", job("want", 2, 8, ["H100"], priority=900, preemptible=False))
        await solver.schedule_once()
        assert nodes_of(solver, "low-a100") == ["a100-0"] and nodes_of(solver, "low-l40s") == ["l40s-0"]
        why = await solver.explain({"job_id": "want"}, {})
        assert sorted(why["preempt_to_fit"]) == ["hold-a", "hold-b"], why["message"]
        assert "low-a100" not in why["message"] and "low-l40s" not in why["message"]
        assert "needs 16 GPUs on H100; 0 of those are free" in why["message"], why["message"]
        clauses = why["message"].split(": ", 1)[1].split("; ")
        assert len(clauses) == len(set(clauses)), why["message"]
