"""--dependency and --constraint through a real solver (NATS, Redis), with its loops off so the test drives cycles.

Job B `afterok:A` waits (reason Dependency) while A holds GPUs and is placed by the first cycle after A succeeds;
a job whose dependency can never hold is cancelled with DependencyNeverSatisfied; `--constraint=h100` jobs never
land on the A100 node even when it comes first; a constraint no node satisfies waits with BadConstraints.
"""

from __future__ import annotations

import asyncio
import time

from nats.aio.client import Client
from oneplus_contracts import JobAccepted, JobFinished, JobSpec, NodeRecord, subjects
from oneplus_jobformats.sbatch import parse_sbatch
from oneplus_placement_solver.app import Solver
from oneplus_testing import Servers
from oneplus_topology.presets import load_preset
from test_cycle_store_ops import solver_on_fresh_bus

A100 = "dgx_a100_8gpu_nv12_12nic"
H100 = "h100_sxm_8gpu_nvswitch_nv18"


def sbatch(*args: str, gpus: int = 1) -> JobSpec:
    script = f"#!/bin/bash\n#SBATCH --gpus={gpus}\n#SBATCH --job-name=t\nhostname\n"
    return parse_sbatch(script, list(args)).spec


async def add_mixed_nodes(nc: Client, solver: Solver) -> None:
    """`a0` (A100) first in node order, then `h0` (H100); the executor reports features from the GPU model."""
    kv = await nc.jetstream().key_value(subjects.TOPOLOGY_KV)
    for name, preset in (("a0", A100), ("h0", H100)):
        topo = load_preset(preset, name)
        topo = topo.model_copy(update={"leaf": "leaf-0", "features": [topo.gpu_model.lower()]})
        await kv.put(name, NodeRecord(topology=topo, last_heartbeat=time.time()).model_dump_json().encode())
    deadline = time.monotonic() + 10
    while len(solver.capacity.records) < 2:
        assert time.monotonic() < deadline, "the solver never saw the nodes"
        await asyncio.sleep(0.05)


async def accept(solver: Solver, job_id: str, spec: JobSpec) -> None:
    await solver.owner.commit(JobAccepted(event_id=f"acc-{job_id}", job_id=job_id, spec=spec))


async def succeed(solver: Solver, job_id: str) -> None:
    """What settle does when every node reported exit 0: the record first, then the release."""
    rec = solver.owner.index.get(job_id)
    assert rec is not None and rec.token is not None
    async with solver.transition:
        await solver.owner.commit(
            JobFinished(event_id=f"fin-{job_id}", job_id=job_id, state="SUCCEEDED", reason="done", token=rec.token)
        )
    await solver.release(job_id, rec.token, "done")


def state(solver: Solver, job_id: str) -> str:
    rec = solver.owner.index.get(job_id)
    assert rec is not None
    return rec.state


async def test_afterok_waits_for_its_job_then_is_placed(nc: Client, servers: Servers, cluster_name: str) -> None:
    async with solver_on_fresh_bus(nc, servers, f"{cluster_name}dep") as solver:
        await add_mixed_nodes(nc, solver)
        await accept(solver, "a", sbatch())
        assert await solver.schedule_once() == 1 and state(solver, "a") == "PLACED"
        await accept(solver, "b", sbatch("--dependency=afterok:a"))
        await accept(solver, "x", sbatch("--dependency=afterok:no-such-job"))
        assert await solver.schedule_once() == 0
        assert solver.decision is not None
        assert solver.decision.reasons["b"].code == "Dependency"
        assert "a is PLACED" in solver.decision.reasons["b"].message
        rows = {r["job_id"]: r for r in (await solver.queue_list({}, {}))["rows"]}
        assert rows["b"]["reason"] == "Dependency"
        explained = await solver.explain({"job_id": "b"}, {})
        assert explained["reason"] == "Dependency"
        # The never-satisfiable one is ended as Slurm does (kill_invalid_depend).
        x = solver.owner.index.get("x")
        assert x is not None and x.state == "CANCELLED"
        assert x.reason is not None and x.reason.startswith("DependencyNeverSatisfied")
        await succeed(solver, "a")
        assert await solver.schedule_once() == 1
        assert state(solver, "b") == "PLACED"


async def test_constraint_h100_never_lands_on_the_a100(nc: Client, servers: Servers, cluster_name: str) -> None:
    async with solver_on_fresh_bus(nc, servers, f"{cluster_name}con") as solver:
        await add_mixed_nodes(nc, solver)
        for i in range(3):
            await accept(solver, f"h{i}", sbatch("--constraint=h100", gpus=2))
        await accept(solver, "free", sbatch(gpus=2))
        await accept(solver, "v", sbatch("-C", "v100"))
        assert await solver.schedule_once() == 4
        for i in range(3):
            rec = solver.owner.index.get(f"h{i}")
            assert rec is not None and rec.allocation is not None and rec.allocation.nodes == ["h0"]
        assert solver.decision is not None and solver.decision.reasons["v"].code == "BadConstraints"
        # At most 2 GPUs of the H100 are left: a 4-GPU h100 job waits rather than take the A100's free GPUs.
        await accept(solver, "h3", sbatch("--constraint=h100", gpus=4))
        assert await solver.schedule_once() == 0
        assert state(solver, "h3") == "ACCEPTED"
