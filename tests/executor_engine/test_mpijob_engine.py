"""Kubeflow jobs on the real container engine (issue 13, item 2).

An MPIJob: the launcher starts once the workers run, reads its hostfile at /etc/mpi/hostfile, and the job ends with
it (the workers, which never end by themselves, are then stopped). A PyTorchJob's two replicas, run by two executors
(two node names on one engine): each prints what torchrun would read, and the master's name resolves in both.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import aiodocker
import pytest
from executor_engine_support import BUSYBOX, new_job_id
from oneplus_contracts import JobSpec, LaunchRanks, RankPlacement
from oneplus_node_executor.runtime.docker import DockerRuntime
from oneplus_node_executor.runtime.environment import launcher_environment, rank_environment

pytestmark = pytest.mark.asyncio


def spec(**kw: object) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": "kubeflow-engine",
            "resources": {"gpus": 1, "cpus": 0.2, "memory_mb": 64, "cpu_limit": 0.5, "memory_limit_mb": 64},
            "image": BUSYBOX,
            **kw,
        }
    )


def launch_of(job: JobSpec, job_id: str, node_of_rank: list[str], node: str, hosts: dict[str, str]) -> LaunchRanks:
    nodes = list(dict.fromkeys(node_of_rank))
    return LaunchRanks(
        job_id=job_id,
        node=node,
        token=1,
        spec=job,
        ranks=[
            RankPlacement(rank=r, node=n, gpus=[r], cpus=0.2, memory_mb=64)
            for r, n in enumerate(node_of_rank)
            if n == node
        ],
        world_size=len(node_of_rank),
        node_rank=nodes.index(node),
        nodes=nodes,
        master_addr=nodes[0],
        master_port=29533,
        ranks_per_node=[node_of_rank.count(n) for n in nodes],
        hosts=hosts,
    )


async def states(url: str, job_id: str) -> dict[str, dict[str, object]]:
    """Container name → its engine State, for the job's containers."""
    async with aiodocker.Docker(url=url) as docker:
        found = await docker.containers.list(all=True, filters=f'{{"label": ["oneplus.job={job_id}"]}}')
        out = {}
        for c in found:
            info = await c.show()
            out[str(info["Name"]).lstrip("/")] = info["State"]
        return out


@pytest.fixture
async def second_node(engine_url: str) -> AsyncIterator[DockerRuntime]:
    name = "test-" + uuid.uuid4().hex[:8]
    rt = DockerRuntime(engine_url, node=name)
    try:
        yield rt
    finally:
        for ranks in await rt.list_managed():
            await rt.remove(ranks.job_id)
        await rt.close()


async def test_an_mpijob_launcher_starts_after_its_workers_reads_its_hostfile_and_ends_the_job(
    runtime: DockerRuntime, node_name: str, engine_url: str
) -> None:
    job_id = new_job_id()
    job = spec(
        ranks=3,
        framework="mpijob",
        entrypoint=["sh", "-c"],
        command=['echo "worker $RANK ($K_MPI_JOB_ROLE) up"; exec sleep 300'],  # sshd -De: never ends by itself
        launcher={
            "entrypoint": ["sh", "-c"],
            "command": [
                'echo "role=$K_MPI_JOB_ROLE hostfile=$OMPI_MCA_orte_default_hostfile"'
                ' "slots=$OMPI_MCA_orte_set_default_slots";'
                " cat /etc/mpi/hostfile; busybox grep -w gpu-b /etc/hosts; exit 3"
            ],
            "slots_per_worker": 2,
        },
    )
    # Ranks 0 and 1 run here (the first node), rank 2 on gpu-b (not started: only its hostfile line matters).
    cmd = launch_of(job, job_id, [node_name, node_name, "gpu-b"], node_name, {"gpu-b": "10.9.0.2"})
    await runtime.launch(cmd, rank_environment(cmd, None))
    waiting = asyncio.create_task(runtime.wait(job_id))
    await asyncio.sleep(1.0)
    assert not waiting.done(), "the workers never end by themselves: the wait is for the launcher"
    workers = await states(engine_url, job_id)
    assert len(workers) == 2 and all(s["Running"] for s in workers.values())

    await runtime.launch_launcher(cmd, launcher_environment(cmd))
    await runtime.launch_launcher(cmd, launcher_environment(cmd))  # redelivered: nothing more starts
    ended = await asyncio.wait_for(waiting, 60)
    assert ended.exit_code == 3 and "launcher" in ended.reason, ended

    logs = await runtime.logs(job_id, None, follow=False)
    launcher_lines = [line.removeprefix("[launcher] ") for line in logs if line.startswith("[launcher] ")]
    assert launcher_lines[:3] == [
        "role=launcher hostfile=/etc/mpi/hostfile slots=2",
        f"{node_name} slots=4",
        "gpu-b slots=2",
    ], logs
    assert any("10.9.0.2" in line and "gpu-b" in line for line in launcher_lines), launcher_lines
    assert any(line == "[rank 0] worker 0 (worker) up" for line in logs), logs

    after = await states(engine_url, job_id)
    launcher = next(s for name, s in after.items() if "-launcher-" in name)
    ranks = [s for name, s in after.items() if "-launcher-" not in name]
    assert len(ranks) == 2 and not any(s["Running"] for s in after.values()), after  # the workers were stopped
    for worker in ranks:
        # Every worker was up before the launcher started, and stopped only after it ended.
        assert str(worker["StartedAt"]) <= str(launcher["StartedAt"])
        assert str(worker["FinishedAt"]) >= str(launcher["FinishedAt"])


async def test_a_pytorchjobs_two_replicas_get_what_torchrun_reads_and_resolve_the_master(
    runtime: DockerRuntime, second_node: DockerRuntime, node_name: str
) -> None:
    job_id = new_job_id()
    a, b = node_name, str(second_node.node)
    script = (
        'echo "PET_NNODES=$PET_NNODES PET_NODE_RANK=$PET_NODE_RANK PET_NPROC_PER_NODE=$PET_NPROC_PER_NODE'
        " PET_MASTER_ADDR=$PET_MASTER_ADDR PET_MASTER_PORT=$PET_MASTER_PORT RANK=$RANK WORLD_SIZE=$WORLD_SIZE"
        ' MASTER_ADDR=$MASTER_ADDR";'
        ' echo "master: $(busybox grep -w "$MASTER_ADDR" /etc/hosts)"'
    )
    job = spec(ranks=2, framework="pytorchjob", entrypoint=["sh", "-c"], command=[script])
    hosts = {a: "10.8.0.1", b: "10.8.0.2"}
    outputs = []
    for rt, node in ((runtime, a), (second_node, b)):
        cmd = launch_of(job, job_id, [a, b], node, hosts)
        await rt.launch(cmd, rank_environment(cmd, None))
    for rt in (runtime, second_node):
        ended = await asyncio.wait_for(rt.wait(job_id), 60)
        assert ended.exit_code == 0, ended
        outputs.append(await rt.logs(job_id, None, follow=False))
    first, second = ("\n".join(o) for o in outputs)
    for text, rank in ((first, 0), (second, 1)):
        assert (
            f"PET_NNODES=2 PET_NODE_RANK={rank} PET_NPROC_PER_NODE=auto PET_MASTER_ADDR={a} PET_MASTER_PORT=29533"
            f" RANK={rank} WORLD_SIZE=2 MASTER_ADDR={a}"
        ) in text, text
        assert "master: 10.8.0.1" in text and a in text.split("master: ", 1)[1], text
