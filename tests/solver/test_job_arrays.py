"""Job arrays through a real solver (NATS, Redis), loops off so the test drives the owner and the cycles.

One accepted fact for the array becomes one job per task in one commit; `%N` holds the cycle to N running tasks;
`queue` shows the pending tasks as one row; a cancel of the array's id ends every task still live, a cancel of one
task only that one; `afterok:<array>` waits for every task, `afterok:<task>` for that one, `aftercorr` for the task
of the same id.
"""

from __future__ import annotations

import time

from nats.aio.client import Client
from oneplus_contracts import JobAccepted, JobCancelRequested, JobSpec
from oneplus_jobformats.sbatch import parse_sbatch
from oneplus_placement_solver.app import Solver
from oneplus_testing import Servers
from test_cycle_store_ops import add_nodes, solver_on_fresh_bus
from test_dependency_constraint import succeed


def sweep(*args: str) -> JobSpec:
    script = "#!/bin/bash\n#SBATCH --gpus=1\n#SBATCH -J sweep\n#SBATCH -o out-%A_%a.log\necho $SLURM_ARRAY_TASK_ID\n"
    return parse_sbatch(script, list(args)).spec


async def report(solver: Solver, *events: JobAccepted | JobCancelRequested) -> None:
    """As the intake does: a fact each, folded by the owner."""
    for event in events:
        await solver.svc.ledger.report(event)
    await solver.owner.drain_facts()


def states(solver: Solver, prefix: str) -> dict[str, str]:
    idx = solver.owner.index
    return {j: s for j in list(idx.jobs) + list(idx.finished) if j.startswith(prefix) and (s := idx.state_of(j))}


async def test_one_fact_makes_every_task_and_the_throttle_holds(
    nc: Client, servers: Servers, cluster_name: str
) -> None:
    async with solver_on_fresh_bus(nc, servers, f"{cluster_name}arr") as solver:
        await add_nodes(nc, solver, 2)  # 16 GPUs
        await report(solver, JobAccepted(event_id="acc-arr", job_id="arr", spec=sweep("--array=0-99%5")))
        tasks = states(solver, "arr_")
        assert len(tasks) == 100 and set(tasks.values()) == {"ACCEPTED"}
        rec = solver.owner.index.get("arr_7")
        assert rec is not None and rec.spec.array_task is not None and rec.spec.array is None
        assert (rec.spec.array_task.task_id, rec.spec.array_task.count, rec.spec.array_task.max_running) == (7, 100, 5)
        assert rec.spec.labels["slurm/output"] == "out-arr_7.log"
        # 16 free GPUs, but %5: five tasks run, the others wait with Slurm's reason.
        assert await solver.schedule_once() == 5
        assert solver.decision is not None
        assert solver.decision.reasons["arr_99"].code == "JobArrayTaskLimit"
        assert "%5" in solver.decision.reasons["arr_99"].message
        assert await solver.schedule_once() == 0  # still five holding
        rows = (await solver.queue_list({}, {}))["rows"]
        pending = [r for r in rows if r["st"] == "PD"]
        assert [r["job_id"] for r in pending] == ["arr_[5-99%5]"]
        assert pending[0]["reason"] == "JobArrayTaskLimit"
        assert len(rows) == 6  # five running tasks, one row for the 95 pending
        # One ends: one more starts.
        await succeed(solver, "arr_0")
        assert await solver.schedule_once() == 1


async def test_cancel_the_array_or_one_task(nc: Client, servers: Servers, cluster_name: str) -> None:
    async with solver_on_fresh_bus(nc, servers, f"{cluster_name}arc") as solver:
        await add_nodes(nc, solver, 1)
        await report(solver, JobAccepted(event_id="acc-c", job_id="c", spec=sweep("--array=1,3,5-9:2")))
        assert sorted(states(solver, "c_")) == ["c_1", "c_3", "c_5", "c_7", "c_9"]
        await report(solver, JobCancelRequested(event_id="cancel-c_3", job_id="c_3"))
        await solver.owner.drain_facts()
        got = states(solver, "c_")
        assert got["c_3"] == "CANCELLED" and got["c_1"] == "ACCEPTED"
        await report(solver, JobCancelRequested(event_id="cancel-c", job_id="c"))
        assert set(states(solver, "c_").values()) == {"CANCELLED"}
        assert "c" not in solver.owner.index  # the array's id is no job of its own


async def test_dependencies_on_an_array_and_on_its_tasks(nc: Client, servers: Servers, cluster_name: str) -> None:
    async with solver_on_fresh_bus(nc, servers, f"{cluster_name}ard") as solver:
        await add_nodes(nc, solver, 1)  # 8 GPUs
        await report(solver, JobAccepted(event_id="acc-a", job_id="a", spec=sweep("--array=0-1")))
        await report(
            solver,
            JobAccepted(event_id="acc-all", job_id="all", spec=sweep("--dependency=afterok:a")),
            JobAccepted(event_id="acc-one", job_id="one", spec=sweep("--dependency=afterok:a_1")),
            JobAccepted(event_id="acc-b", job_id="b", spec=sweep("--array=0-1", "--dependency=aftercorr:a")),
        )
        b0 = solver.owner.index.get("b_0")
        assert b0 is not None and [(d.type, d.job_ids) for d in b0.spec.dependencies] == [("afterok", ["a_0"])]
        assert await solver.schedule_once() == 2  # a_0 and a_1; the others wait for them
        assert solver.decision is not None
        assert solver.decision.reasons["all"].code == "Dependency"
        assert solver.decision.reasons["b_1"].code == "Dependency"
        await succeed(solver, "a_1")
        assert await solver.schedule_once() == 2  # one (afterok:a_1) and b_1 (aftercorr: a_1)
        assert states(solver, "one") == {"one": "PLACED"} and states(solver, "b_1")["b_1"] == "PLACED"
        assert states(solver, "all")["all"] == "ACCEPTED"  # a_0 still runs
        await succeed(solver, "a_0")
        assert await solver.schedule_once() == 2  # all (every task of a succeeded) and b_0
        assert states(solver, "all")["all"] == "PLACED" and states(solver, "b_0")["b_0"] == "PLACED"


async def test_a_dependency_on_an_array_reads_its_archived_tasks(
    nc: Client, servers: Servers, cluster_name: str
) -> None:
    """A task already moved to the archive still counts: read before the cycle, its final state stands for it."""
    async with solver_on_fresh_bus(nc, servers, f"{cluster_name}arc") as solver:
        await add_nodes(nc, solver, 1)
        await report(solver, JobAccepted(event_id="acc-a", job_id="a", spec=sweep("--array=0-1")))
        assert await solver.schedule_once() == 2  # a_0 and a_1
        await succeed(solver, "a_0")
        assert [f.job_id for f in await solver.owner.expire(now=time.time() + 3600)] == ["a_0"]
        assert solver.owner.index.get("a_0") is None and "a" in solver.owner.index.arrays  # a_1 still held
        await report(solver, JobAccepted(event_id="acc-all", job_id="all", spec=sweep("--dependency=afterok:a")))
        assert await solver.schedule_once() == 0
        assert solver.decision is not None and solver.decision.reasons["all"].code == "Dependency"  # a_1 runs
        await succeed(solver, "a_1")
        assert await solver.schedule_once() == 1  # a_0 read from the archive as SUCCEEDED, a_1 from the working set
        assert states(solver, "all")["all"] == "PLACED"
