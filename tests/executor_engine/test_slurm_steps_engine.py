"""A two-node Slurm batch job on the real engine: the script runs once, `srun` runs its tasks on both nodes.

Two executor nodes on the one engine (their containers told apart by the node label); the batch node's step server
reaches the other node's runtime directly, where the service uses the executors' NATS request subjects.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from oneplus_contracts import LaunchRanks, RankPlacement, subjects
from oneplus_jobformats.sbatch import parse_sbatch
from oneplus_node_executor.runtime import slurm
from oneplus_node_executor.runtime.base import RanksExit
from oneplus_node_executor.runtime.docker import DockerRuntime
from oneplus_node_executor.runtime.environment import rank_environment

pytestmark = pytest.mark.engine

BATCH = """#!/bin/sh
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --mem=64M
echo "batch on $SLURMD_NODENAME procid=$SLURM_PROCID nnodes=$SLURM_NNODES ntasks=$SLURM_NTASKS"
echo "master $(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1) of $(scontrol show hostnames | wc -l)"
srun sh -c 'echo task $SLURMD_NODENAME $SLURM_PROCID step=$SLURM_STEP_ID of $SLURM_STEP_NUM_TASKS'
echo "srun exit $?"
srun -l sh -c 'echo labelled; exit $SLURM_PROCID'
echo "srun exit $?"
srun --pty sh
echo "srun exit $?"
srun -n 3 sh -c 'echo never'
echo "srun exit $?"
export MY_VAR="hello world" MASTER_PORT=6000
last=$(scontrol show hostnames | tail -n 1)
srun --jobid "$SLURM_JOB_ID" -W 60 -w "$last" sh -c 'echo on $SLURMD_NODENAME $SLURM_NODEID $MY_VAR $MASTER_PORT $RANK'
echo "srun exit $?"
srun --jobid other-job sh -c 'echo never'
echo "srun exit $?"
echo "batch done"
"""


@pytest.fixture
async def two_nodes(engine_url: str, tmp_path: Path) -> AsyncIterator[dict[str, DockerRuntime]]:
    stem = "slurm-" + uuid.uuid4().hex[:6]
    names = [f"{stem}-a", f"{stem}-b"]
    # A spool folder per node, as the default (ONEPLUS_SLURM_SPOOL_ROOT/<node>) gives.
    runtimes = {n: DockerRuntime(engine_url, node=n, slurm_spool_root=tmp_path / "spool" / n) for n in names}
    try:
        yield runtimes
    finally:
        for rt in runtimes.values():
            for ranks in await rt.list_managed():
                await rt.remove(ranks.job_id)
            await rt.close()


def node_launch(spec_script: str, job_id: str, nodes: list[str], node_rank: int) -> LaunchRanks:
    spec = parse_sbatch(spec_script, filename="steps.sh", submit_dir="/home/me").spec
    node = nodes[node_rank]
    return LaunchRanks(
        job_id=job_id,
        node=node,
        token=1,
        spec=spec,
        ranks=[RankPlacement(rank=node_rank, node=node, gpus=[], cpus=1, memory_mb=64)],
        world_size=len(nodes),
        node_rank=node_rank,
        nodes=nodes,
        master_addr=nodes[0],
    )


async def serve_steps_until_the_end(
    runtimes: dict[str, DockerRuntime], batch_cmd: LaunchRanks, spool: Path
) -> list[RanksExit]:
    """The batch node's step server, with the peers' tasks run in-process, until every node's ranks ended."""

    async def transport(node: str, op: slurm.StepOp) -> slurm.StepProgress:
        return await slurm.serve_op(runtimes[node].slurm_tasks, op)

    async def release(node: str, rel: slurm.Release) -> None:
        await slurm.release_holders(runtimes[node], rel.job_id)

    batch = runtimes[batch_cmd.node]
    server = asyncio.create_task(slurm.StepServer(batch, batch_cmd, spool, transport, release).run())
    ends = await asyncio.wait_for(asyncio.gather(*(rt.wait(batch_cmd.job_id) for rt in runtimes.values())), 90)
    await asyncio.wait_for(server, 10)
    return list(ends)


async def test_batch_script_runs_once_and_srun_runs_a_task_per_node(two_nodes: dict[str, DockerRuntime]) -> None:
    nodes = list(two_nodes)
    job_id = "job-" + uuid.uuid4().hex[:10]
    cmds = [node_launch(BATCH, job_id, nodes, i) for i in range(2)]
    for cmd in reversed(cmds):  # the holders first, as a launch that reaches node b before node a would
        await two_nodes[cmd.node].launch(cmd, rank_environment(cmd, None))

    batch = two_nodes[nodes[0]]
    spool = slurm.spool_dir(batch.slurm_spool_root, job_id, 1)
    ends = await serve_steps_until_the_end(two_nodes, cmds[0], spool)
    lines = await batch.logs(job_id, 0, follow=False)
    a, b = nodes
    # stdout and stderr are two pipes: the engine's log keeps each one's order, not their interleaving.
    errors = [line for line in lines if line.startswith("srun: error:")]
    assert [line for line in lines if not line.startswith("srun: error:")] == [
        f"batch on {a} procid=0 nnodes=2 ntasks=2",
        f"master {a} of 2",  # the launch scripts' MASTER_ADDR idiom, with the busybox image's awk
        *sorted([f"task {a} 0 step=0 of 2", f"task {b} 1 step=0 of 2"], key=lines.index),  # as they came
        "srun exit 0",
        *sorted(["0: labelled", "1: labelled"], key=lines.index),
        "srun exit 1",  # the worst task's status
        "srun exit 1",  # --pty
        "srun exit 1",  # -n 3
        # The exported variables reach the task (--export=ALL); RANK is its own container's; -w placed it.
        f"on {b} 0 hello world 6000 1",
        "srun exit 0",
        "srun exit 1",  # --jobid other-job
        "batch done",
    ]
    assert errors == [
        f"srun: error: {b}: task 1: Exited with exit code 1",  # srun's words for the failed task
        "srun: error: unrecognized option '--pty' (OnePlus's srun takes -n, -N, --ntasks-per-node, -w, -l, --export, "
        "--gpus, --exact and --overlap; see docs/submitting.md)",
        "srun: error: 3 tasks are more than the allocation: 2 node(s) x 1 task(s) per node",
        f"srun: error: --jobid=other-job: this batch script's job is {job_id}; a step runs only on its own job's "
        "allocation in OnePlus",
    ]
    # The batch script's end is the job's: the holders were released and exit 0 on both nodes.
    assert [(e.exit_code, e.per_rank) for e in ends] == [(0, {0: 0}), (0, {1: 0})]
    assert list(spool.iterdir()) == []


async def test_a_failing_batch_script_fails_its_node_and_releases_the_other(
    two_nodes: dict[str, DockerRuntime],
) -> None:
    nodes = list(two_nodes)
    job_id = "job-" + uuid.uuid4().hex[:10]
    script = "#!/bin/sh\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\nsrun true && exit 7\n"
    cmds = [node_launch(script, job_id, nodes, i) for i in range(2)]
    for cmd in cmds:
        await two_nodes[cmd.node].launch(cmd, rank_environment(cmd, None))

    batch = two_nodes[nodes[0]]
    spool = slurm.spool_dir(batch.slurm_spool_root, job_id, 1)
    ends = await serve_steps_until_the_end(two_nodes, cmds[0], spool)
    assert [e.exit_code for e in ends] == [7, 0]


class LoopbackNats:
    """The executors' request subjects, answered in-process by each node's handlers as the ops adapter answers."""

    def __init__(self, runtimes: dict[str, DockerRuntime]) -> None:
        self.runtimes = runtimes
        self.asked: list[str] = []

    async def request(self, subject: str, payload: bytes = b"", timeout: float = 0.5) -> SimpleNamespace:
        self.asked.append(subject)
        body = {**json.loads(payload), "team": "stamped-by-the-server"}
        for node, rt in self.runtimes.items():
            if subject == subjects.slurm_step(node):
                result: object = (await slurm.serve_node_step(rt, body)).model_dump(mode="json")
                break
            if subject == subjects.slurm_release(node):
                result = await slurm.serve_release(rt, body)
                break
        else:
            raise AssertionError(f"no node answers {subject}")
        return SimpleNamespace(data=json.dumps({"ok": True, "result": result}).encode())


async def test_a_restarted_executor_serves_srun_again_over_the_request_subjects(
    two_nodes: dict[str, DockerRuntime],
) -> None:
    nodes = list(two_nodes)
    job_id = "job-" + uuid.uuid4().hex[:10]
    script = (
        "#!/bin/sh\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n"
        "sleep 2\nsrun sh -c 'echo $SLURMD_NODENAME $SLURM_PROCID'\necho \"srun exit $?\"\n"
    )
    cmds = [node_launch(script, job_id, nodes, i) for i in range(2)]
    for cmd in cmds:
        await two_nodes[cmd.node].launch(cmd, rank_environment(cmd, None))
    batch = two_nodes[nodes[0]]
    bus = LoopbackNats(two_nodes)
    first = slurm.start_step_server(batch, cmds[0], lambda: bus)
    assert first is not None
    assert slurm.start_step_server(batch, cmds[0], lambda: bus) is None  # one server per attempt
    first.cancel()  # the executor stops before the script's srun: nothing is released
    with contextlib.suppress(asyncio.CancelledError):
        await first
    assert bus.asked == []
    again = slurm.resume_step_server(batch, job_id, 1, lambda: bus)  # the restarted executor adopts the ranks
    assert again is not None
    assert slurm.resume_step_server(two_nodes[nodes[1]], job_id, 1, lambda: bus) is None  # not the batch node
    ends = await asyncio.wait_for(asyncio.gather(*(two_nodes[n].wait(job_id) for n in nodes)), 90)
    await asyncio.wait_for(again, 10)
    a, b = nodes
    logged = await batch.logs(job_id, 0, follow=False)
    assert sorted(logged[:2]) == [f"{a} 0", f"{b} 1"] and logged[2:] == ["srun exit 0"]
    assert [e.exit_code for e in ends] == [0, 0]
    # The step's share on b started, its output and end asked for (as many times as it took), then the release.
    assert set(bus.asked[:-1]) == {subjects.slurm_step(b)} and bus.asked[-1] == subjects.slurm_release(b)
    await batch.remove(job_id)
    assert list(batch.slurm_spool_root.iterdir()) == []  # the spool and the kept launch go with the job


async def test_two_ranks_per_node_the_script_once_and_each_task_in_its_own_rank_s_container(
    two_nodes: dict[str, DockerRuntime],
) -> None:
    nodes = list(two_nodes)
    job_id = "job-" + uuid.uuid4().hex[:10]
    script = (
        "#!/bin/sh\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=2\n#SBATCH --mem=64M\necho batch $SLURM_NTASKS\n"
        "srun sh -c 'echo task $SLURM_PROCID local $SLURM_LOCALID on $SLURMD_NODENAME in rank $RANK'\n"
    )
    cmds = []
    for i, node in enumerate(nodes):
        cmd = node_launch(script, job_id, nodes, i)
        cmd.ranks = [RankPlacement(rank=2 * i + j, node=node, gpus=[], cpus=1, memory_mb=64) for j in range(2)]
        cmd.world_size = 4
        cmds.append(cmd)
        await two_nodes[node].launch(cmd, rank_environment(cmd, None))
    bus = LoopbackNats(two_nodes)
    batch = two_nodes[nodes[0]]
    server = slurm.start_step_server(batch, cmds[0], lambda: bus)
    assert server is not None
    ends = await asyncio.wait_for(asyncio.gather(*(two_nodes[n].wait(job_id) for n in nodes)), 90)
    await asyncio.wait_for(server, 10)
    a, b = nodes
    logged = await batch.logs(job_id, 0, follow=False)
    assert logged[0] == "batch 4"
    assert sorted(logged[1:]) == [  # streamed as the tasks print: in any order
        f"task 0 local 0 on {a} in rank 0",
        f"task 1 local 1 on {a} in rank 1",
        f"task 2 local 0 on {b} in rank 2",
        f"task 3 local 1 on {b} in rank 3",
    ]
    assert await batch.logs(job_id, 1, follow=False) == []  # the other rank of the batch node held, ran no script
    assert [(e.exit_code, e.per_rank) for e in ends] == [(0, {0: 0, 1: 0}), (0, {2: 0, 3: 0})]


SIGNALLED = """#!/bin/sh
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --mem=64M
trap 'echo "batch shell: USR1"' USR1
last=$(scontrol show hostnames | tail -n 1)
srun -N1 -w "$last" sh -c 'trap "echo task: USR1; exit 0" USR1; trap "echo TERM > /tmp/got-term; exit 0" TERM; \
echo ready; while :; do sleep 0.1; done' &
pid=$!
wait $pid
rc=$?
while [ $rc -gt 128 ] && kill -0 $pid 2>/dev/null; do wait $pid; rc=$?; done
echo "step exit $rc"
"""


async def until_logged(rt: DockerRuntime, job_id: str, line: str, timeout_s: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while line not in await rt.logs(job_id, 0, follow=False):
        assert asyncio.get_running_loop().time() < deadline, f"{line!r} never logged"
        await asyncio.sleep(0.2)


async def test_the_checkpoint_signal_reaches_the_tasks_of_running_steps_and_the_batch_shell(
    two_nodes: dict[str, DockerRuntime],
) -> None:
    nodes = list(two_nodes)
    job_id = "job-" + uuid.uuid4().hex[:10]
    cmds = [node_launch(SIGNALLED, job_id, nodes, i) for i in range(2)]
    for cmd in cmds:
        await two_nodes[cmd.node].launch(cmd, rank_environment(cmd, None))
    batch = two_nodes[nodes[0]]
    server = asyncio.create_task(
        serve_steps_until_the_end(two_nodes, cmds[0], slurm.spool_dir(batch.slurm_spool_root, job_id, 1))
    )
    await until_logged(batch, job_id, "ready")  # streamed while the step runs
    # Preemption's checkpoint signal (and --signal's) goes to every node's executor: each signals what runs there.
    for rt in two_nodes.values():
        await rt.signal(job_id, "SIGUSR1")
    ends = await asyncio.wait_for(server, 60)
    lines = await batch.logs(job_id, 0, follow=False)
    assert {"batch shell: USR1", "task: USR1", "step exit 0"} <= set(lines), lines
    assert [e.exit_code for e in ends] == [0, 0]
    assert ends[0].reason.endswith("srun steps: 0 exit 0"), ends[0].reason


async def test_cancelling_the_job_sends_sigterm_to_the_running_step_tasks_first(
    two_nodes: dict[str, DockerRuntime],
) -> None:
    nodes = list(two_nodes)
    job_id = "job-" + uuid.uuid4().hex[:10]
    cmds = [node_launch(SIGNALLED, job_id, nodes, i) for i in range(2)]
    for cmd in cmds:
        await two_nodes[cmd.node].launch(cmd, rank_environment(cmd, None))
    batch = two_nodes[nodes[0]]
    server = asyncio.create_task(
        serve_steps_until_the_end(two_nodes, cmds[0], slurm.spool_dir(batch.slurm_spool_root, job_id, 1))
    )
    await until_logged(batch, job_id, "ready")
    task_node = two_nodes[nodes[1]]
    await asyncio.gather(*(rt.stop(job_id, grace_s=5.0, reason="cancelled") for rt in (task_node, batch)))
    await asyncio.wait_for(server, 60)
    # The task's TERM trap ran (the holder around it then stopped): its file is in the container.
    holder = (await task_node._current(job_id))[0]
    async with task_node._engine("reading a file") as docker:
        tar = await docker.containers.container(holder.id).get_archive("/tmp/got-term")
    member = tar.extractfile(tar.getmembers()[0])
    assert member is not None and member.read() == b"TERM\n"
