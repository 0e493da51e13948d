"""An MPIJob's first node starts the launcher only once every node has reported its workers running (issue 13)."""

from __future__ import annotations

import asyncio

from executor_fakes import NODE, executor, placed, spec
from oneplus_contracts import JobRunning, LaunchRanks
from oneplus_node_executor.runtime.simulated import SimulatedRuntime
from oneplus_testing import until


class WithLauncher(SimulatedRuntime):
    def __init__(self) -> None:
        super().__init__()
        self.launchers: list[tuple[str, dict[str, str]]] = []

    async def launch_launcher(self, cmd: LaunchRanks, env: dict[str, str]) -> None:
        self.launchers.append((cmd.job_id, env))


MPI = {"framework": "mpijob", "launcher": {"command": ["mpirun", "hostname"]}, "simulate": {"duration_s": 30}}


async def test_the_launcher_waits_for_the_other_nodes_workers_then_starts_once() -> None:
    rt = WithLauncher()
    ex, svc, store = executor(rt)
    cmd = await placed(svc, store, "j-mpi", spec(**MPI))
    cmd = cmd.model_copy(update={"nodes": [NODE, "node-b"], "world_size": 2, "ranks_per_node": [1, 1]})
    await ex.launch(cmd)
    await until(lambda: "running" in svc.ledger.types("j-mpi"))
    await asyncio.sleep(0.8)
    assert rt.launchers == [], "node-b has not reported its workers running"
    await svc.ledger.record(JobRunning(job_id="j-mpi", node="node-b", token=1))
    await until(lambda: bool(rt.launchers))
    await asyncio.sleep(0.6)
    assert len(rt.launchers) == 1
    job, env = rt.launchers[0]
    assert job == "j-mpi" and env["OMPI_MCA_orte_default_hostfile"] == "/etc/mpi/hostfile"
    assert env["K_MPI_JOB_ROLE"] == "launcher"
    await rt.close()


async def test_only_the_first_node_runs_a_launcher() -> None:
    rt = WithLauncher()
    ex, svc, store = executor(rt)
    cmd = await placed(svc, store, "j-mpi2", spec(**MPI))
    cmd = cmd.model_copy(update={"nodes": ["node-a0", NODE], "node_rank": 1, "world_size": 2})
    await ex.launch(cmd)
    await until(lambda: "running" in svc.ledger.types("j-mpi2"))
    await asyncio.sleep(0.8)
    assert rt.launchers == []
    await rt.close()


async def test_a_restarted_first_node_starts_a_launcher_that_never_started() -> None:
    rt = WithLauncher()
    ex, svc, store = executor(rt)
    cmd = await placed(svc, store, "j-re", spec(**MPI))
    await rt.launch(cmd, {})  # the workers started before the executor's restart; the launcher did not
    await svc.ledger.record(JobRunning(job_id="j-re", node=NODE, token=1))
    await ex.reconcile()
    assert ex.tokens == {"j-re": 1}
    await until(lambda: bool(rt.launchers))
    job, env = rt.launchers[0]
    assert job == "j-re" and env["OMPI_MCA_orte_default_hostfile"] == "/etc/mpi/hostfile"
    await rt.close()
