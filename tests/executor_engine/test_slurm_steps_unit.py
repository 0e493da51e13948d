"""Slurm batch jobs without an engine: the allocation's environment, srun's options and layout, the shim's protocol."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from oneplus_contracts import LaunchRanks, RankPlacement
from oneplus_jobformats.sbatch import parse_sbatch
from oneplus_node_executor.runtime import slurm
from oneplus_node_executor.runtime.container_spec import container_body
from oneplus_node_executor.runtime.environment import rank_environment
from oneplus_node_executor.runtime.slurm import (
    Release,
    SrunError,
    SrunOptions,
    StepServer,
    parse_srun,
    plan_step,
    task_environment,
)
from oneplus_node_executor.runtime.slurm_tasks import (
    NodeStep,
    OutputChunk,
    StepProgress,
    StepSignal,
    TaskResult,
)

SCRIPT = "#!/bin/sh\n#SBATCH --job-name='two nodes'\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=2\n" + (
    "#SBATCH --cpus-per-task=3\n#SBATCH --partition=batch\nsrun hostname\n"
)


def batch_launch(node: str, node_rank: int, ranks: list[int], *, nodes: tuple[str, ...] = ("n0", "n1")) -> LaunchRanks:
    spec = parse_sbatch(SCRIPT, filename="two.sh", submit_dir="/home/me/run").spec
    return LaunchRanks(
        job_id="job-1",
        node=node,
        token=3,
        spec=spec,
        ranks=[RankPlacement(rank=r, node=node, gpus=[], cpus=3, memory_mb=64) for r in ranks],
        world_size=spec.ranks,
        node_rank=node_rank,
        nodes=list(nodes),
        master_addr="n0",
    )


def test_sbatch_records_a_batch_job_and_its_allocation() -> None:
    spec = parse_sbatch(SCRIPT, filename="two.sh", submit_dir="/home/me/run").spec
    assert spec.framework == "sbatch" and spec.ranks == 4
    assert spec.slurm is not None
    assert (spec.slurm.ntasks, spec.slurm.ntasks_per_node, spec.slurm.cpus_per_task) == (4, 2, 3)
    assert (spec.slurm.job_name, spec.slurm.submit_dir, spec.slurm.partition) == ("two nodes", "/home/me/run", "batch")


def test_batch_rank_gets_the_batch_environment_and_other_ranks_the_allocation() -> None:
    env = rank_environment(batch_launch("n0", 0, [0, 1]), None)
    batch, other = env[0], env[1]
    assert batch["SLURM_JOB_ID"] == "job-1" and batch["SLURM_JOB_NAME"] == "two nodes"
    assert (batch["SLURM_JOB_NODELIST"], batch["SLURM_NNODES"], batch["SLURM_JOB_NUM_NODES"]) == ("n0,n1", "2", "2")
    assert (batch["SLURM_NTASKS"], batch["SLURM_NTASKS_PER_NODE"], batch["SLURM_CPUS_PER_TASK"]) == ("4", "2", "3")
    assert (batch["SLURM_NODEID"], batch["SLURM_PROCID"], batch["SLURM_LOCALID"]) == ("0", "0", "0")
    assert (batch["SLURM_SUBMIT_DIR"], batch["SLURM_JOB_PARTITION"], batch["SLURMD_NODENAME"]) == (
        "/home/me/run",
        "batch",
        "n0",
    )
    assert batch["PATH"].startswith(slurm.CONTAINER_BIN + ":")
    assert "SLURM_PROCID" not in other and other["SLURM_NODEID"] == "0"
    second = rank_environment(batch_launch("n1", 1, [2, 3]), None)[2]
    assert (second["SLURM_NODEID"], second["SLURMD_NODENAME"]) == ("1", "n1")


def test_only_rank_zero_runs_the_script_the_others_hold_and_every_one_has_srun(tmp_path: Path) -> None:
    cmd = batch_launch("n0", 0, [0, 1])
    bodies = []
    for local, p in enumerate(cmd.ranks):
        body = container_body(
            cmd, p, {}, local_rank=local, gpu_node=False, network_mode="none", cpuset=None, nano_cpus=None
        )
        slurm.adjust_body(body, cmd, p, tmp_path if p.rank == 0 else None)
        bodies.append(body)
    assert bodies[0]["Cmd"] == cmd.spec.command and "srun hostname" in bodies[0]["Cmd"][2]
    assert bodies[1]["Cmd"] == slurm.holder_command() and bodies[1]["Entrypoint"] == [""]
    assert bodies[0]["HostConfig"]["Binds"] == [
        f"{slurm.SHIM_DIR}:{slurm.CONTAINER_BIN}:ro",
        f"{tmp_path}:{slurm.CONTAINER_SPOOL}:rw",
    ]
    assert bodies[1]["HostConfig"]["Binds"] == [f"{slurm.SHIM_DIR}:{slurm.CONTAINER_BIN}:ro"]
    assert os.access(slurm.SHIM_DIR / "srun", os.X_OK)


def test_srun_options() -> None:
    assert parse_srun(["hostname"]) == SrunOptions(None, None, None, False, ["hostname"])
    assert parse_srun(["-n", "4", "-N2", "-l", "sh", "-c", "echo -n x"]) == SrunOptions(
        4, 2, None, True, ["sh", "-c", "echo -n x"]
    )
    assert parse_srun(["--ntasks=3", "--nodes=1", "--ntasks-per-node=3", "--label", "--", "-x"]) == SrunOptions(
        3, 1, 3, True, ["-x"]
    )
    assert parse_srun(["-n4", "--mpi=pmix", "--export=ALL", "--overlap", "-K", "a.out"]).argv == ["a.out"]
    shared = parse_srun(["--exact", "--overlap", "-G", "a100:2", "--gpus-per-task=1", "--gres=gpu:h100:4", "x"])
    assert (shared.exact, shared.overlap) == (True, True)
    assert (shared.gpus.total, shared.gpus.per_task, shared.gpus.gres) == (2, 1, 4)
    assert parse_srun(["--gres=none", "--gpus-per-node=8", "x"]).gpus.per_node == 8
    assert not parse_srun(["--gres=none", "x"]).gpus.given


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--pty", "bash"], "unrecognized option '--pty'"),
        (["--het-group=1", "x"], "--het-group=1: this batch job is not a heterogeneous job .it has one component."),
        (["--het-group", "0", "x"], "--het-group: this batch job is not a heterogeneous job"),
        (["--gpus=two", "x"], "--gpus='two': expected .type:.number of GPUs"),
        (["-G", "a100:x", "x"], "-G='a100:x': expected .type:.number of GPUs"),
        (["--gres=nic:1", "x"], "--gres=nic:1: 'nic': OnePlus's srun knows gpu and none only"),
        (["--gres=gpu:a100:x", "x"], "--gres=gpu:a100:x: expected gpu.:type..:count."),
        (["--exact=1", "x"], "--exact takes no value"),
        (["-c", "all", "x"], "--cpus-per-task='all': expected a whole number of at least 1"),
        (["-n", "0", "x"], "expected a whole number of at least 1"),
        (["-n", "two", "x"], "expected a whole number"),
        (["-n"], "-n needs a value"),
        (["-l"], "no command to run"),
        (["--export=ALL,1BAD", "x"], "'1BAD' is not ALL, NONE, NAME or NAME=value"),
        (["--wait=soon", "x"], "expected a number of seconds"),
        (["-W"], "-W needs a value"),
        (["--distribution=cyclic", "x"], "in blocks only .cyclic is not supported"),
        (["-m", "cyclic:block", "x"], "in blocks only .cyclic is not supported"),
        (["--distribution=arbitrary", "x"], "in blocks only .arbitrary is not supported"),
        (["--distribution=plane=4", "x"], "in blocks only .plane=4 is not supported"),
        (["--distribution=sideways", "x"], "invalid distribution 'sideways'"),
        (["-w", "/etc/hosts", "x"], "a file of node names is not supported"),
        (["-w", "n[3-1]", "x"], "bad range"),
    ],
)
def test_bad_srun_options_are_refused_with_srun_s_words(args: list[str], said: str) -> None:
    with pytest.raises(SrunError, match=said) as caught:
        parse_srun(args)
    assert str(caught.value).startswith("srun: error: ")


def test_srun_options_of_real_launch_scripts_are_accepted() -> None:
    # --wait and -K: accepted (every task is waited for); --jobid naming this job; block-first distributions.
    for args in (
        ["--wait=60", "--kill-on-bad-exit=1", "--jobid", "job-1", "x"],
        ["-W", "60", "--jobid=job-1", "x"],
        ["-W0", "x"],
        ["--distribution=block:block", "x"],
        ["-m", "block", "x"],
        ["--distribution", "block:cyclic", "x"],
        ["--distribution=block:fcyclic:block,Pack", "x"],
        ["--distribution=*:block", "x"],
        ["--cpus-per-task=6", "--distribution=block:block", "--kill-on-bad-exit", "x"],
    ):
        assert parse_srun(args, job_id="job-1").argv == ["x"], args
    assert parse_srun(["--jobid", "job-1", "x"]).jobid == "job-1"


def test_srun_jobid_of_another_job_is_refused() -> None:
    with pytest.raises(SrunError, match=r"--jobid=job-9: this batch script.s job is job-1; a step runs only on its"):
        parse_srun(["--jobid", "job-9", "x"], job_id="job-1")


def test_srun_export_forms() -> None:
    every = parse_srun(["x"])
    assert (every.export_all, every.export_names, every.export_set) == (True, (), ())
    assert parse_srun(["--export=ALL", "x"]).export_all
    none = parse_srun(["--export=NONE", "x"])
    assert (none.export_all, none.export_names, none.export_set) == (False, (), ())
    some = parse_srun(["--export", "FOO,BAR=1=2", "x"])
    assert (some.export_all, some.export_names, some.export_set) == (False, ("FOO",), (("BAR", "1=2"),))
    more = parse_srun(["--export=ALL,NCCL_DEBUG=INFO", "x"])
    assert (more.export_all, more.export_set) == (True, (("NCCL_DEBUG", "INFO"),))


def test_srun_nodelist_places_the_step_on_the_named_nodes() -> None:
    nodes = ["node-0", "node-1", "node-2", "node-3"]
    one = plan_step(parse_srun(["--nodes=1", "--ntasks=1", "-w", "node-2", "x"]), nodes, 2, 8)
    assert [(t.node, t.nodeid, t.localid) for t in one] == [("node-2", 0, 0)]  # SLURM_NODEID: the step's node index
    # Bracket hostlists; the step's nodes in the allocation's order; the allocation's tasks per node on each.
    two = plan_step(parse_srun(["--nodelist=node-[3,1]", "x"]), nodes, 2, 8)
    assert [(t.node, t.nodeid) for t in two] == [("node-1", 0), ("node-1", 0), ("node-3", 1), ("node-3", 1)]
    glued = plan_step(parse_srun(["-wnode-0,node-1", "-n", "2", "x"]), nodes, 2, 8)
    assert [t.node for t in glued] == ["node-0", "node-1"]
    # -N past the list: the list's nodes and the allocation's next ones.
    grown = plan_step(parse_srun(["-N", "3", "-w", "node-2", "--ntasks-per-node=1", "x"]), nodes, 2, 8)
    assert [t.node for t in grown] == ["node-0", "node-1", "node-2"]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["-w", "node-7", "x"], "--nodelist names node-7, not in the job's allocation .node-0, node-1."),
        (["-w", "node-[0-1]", "-N", "1", "x"], "--nodelist names 2 nodes, more than -N/--nodes=1"),
        (["-w", "node-[0-1]", "-n", "1", "x"], "1 task.s. cannot run on 2 nodes"),
        (["-w", "node-1", "-n", "3", "x"], "3 tasks are more than the allocation: 1 node.s. x 2 task.s. per node"),
    ],
)
def test_srun_nodelist_past_the_allocation_is_refused(args: list[str], said: str) -> None:
    with pytest.raises(SrunError, match=said):
        plan_step(parse_srun(args), ["node-0", "node-1"], 2, 4)


def test_tasks_per_node_are_written_as_slurm_writes_them() -> None:
    assert slurm.tasks_per_node_text([8, 8]) == "8(x2)"
    assert slurm.tasks_per_node_text([2, 2, 1]) == "2(x2),1"
    assert slurm.tasks_per_node_text([1, 2, 2, 2, 1]) == "1,2(x3),1"
    assert slurm.tasks_per_node_text([4]) == "4"
    tasks = plan_step(parse_srun(["x"]), ["n0", "n1"], 2, 4)
    env = task_environment("job-1", 0, tasks, tasks[0])
    assert env["SLURM_TASKS_PER_NODE"] == env["SLURM_STEP_TASKS_PER_NODE"] == "2(x2)"


def test_a_batch_job_without_gpus_has_no_slurm_gpus_on_node() -> None:
    env = rank_environment(batch_launch("n0", 0, [0, 1]), None)
    assert "SLURM_GPUS_ON_NODE" not in env[0] and "SLURM_GPUS_ON_NODE" not in env[1]
    text = SCRIPT.replace("#SBATCH --partition=batch\n", "#SBATCH --partition=batch\n#SBATCH --gpus-per-node=2\n")
    spec = parse_sbatch(text, filename="g.sh", submit_dir="/home/me/run").spec
    cmd = batch_launch("n0", 0, [0, 1]).model_copy(update={"spec": spec})
    cmd = cmd.model_copy(
        update={"ranks": [RankPlacement(rank=r, node="n0", gpus=[r], cpus=3, memory_mb=64) for r in (0, 1)]}
    )
    assert rank_environment(cmd, None)[0]["SLURM_GPUS_ON_NODE"] == "2"


def test_step_layout_is_block_distributed_over_the_allocation() -> None:
    nodes = ["n0", "n1"]
    every = plan_step(parse_srun(["x"]), nodes, 2, 4)
    assert [(t.procid, t.node, t.nodeid, t.localid) for t in every] == [
        (0, "n0", 0, 0),
        (1, "n0", 0, 1),
        (2, "n1", 1, 0),
        (3, "n1", 1, 1),
    ]
    one_each = plan_step(parse_srun(["-n", "2", "x"]), nodes, 2, 4)
    assert [(t.node, t.localid) for t in one_each] == [("n0", 0), ("n1", 0)]
    assert [t.node for t in plan_step(parse_srun(["-n", "1", "x"]), nodes, 2, 4)] == ["n0"]
    assert len(plan_step(parse_srun(["-N", "1", "x"]), nodes, 2, 4)) == 2
    assert len(plan_step(parse_srun(["--ntasks-per-node=1", "x"]), nodes, 2, 4)) == 2
    uneven = plan_step(parse_srun(["-n", "3", "x"]), nodes, 2, 4)
    assert [t.node for t in uneven] == ["n0", "n0", "n1"]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["-n", "5", "x"], "5 tasks are more than the allocation: 2 node.s. x 2 task.s. per node"),
        (["-N", "3", "x"], "3 nodes asked for, the job's allocation has 2"),
        (["--ntasks-per-node=3", "x"], "--ntasks-per-node=3 is more than the allocation's 2"),
        (["-N", "2", "-n", "1", "x"], "1 task.s. cannot run on 2 nodes"),
        (["-n", "3", "--ntasks-per-node=1", "x"], "3 tasks do not fit 2 node.s. x 1 per node"),
    ],
)
def test_a_step_past_the_allocation_is_refused(args: list[str], said: str) -> None:
    with pytest.raises(SrunError, match=said):
        plan_step(parse_srun(args), ["n0", "n1"], 2, 4)


def test_each_task_gets_its_step_identity() -> None:
    tasks = plan_step(parse_srun(["-n", "3", "x"]), ["n0", "n1"], 2, 4)
    env = task_environment("job-1", 2, tasks, tasks[2])
    assert (env["SLURM_PROCID"], env["SLURM_LOCALID"], env["SLURM_NODEID"], env["SLURMD_NODENAME"]) == (
        "2",
        "0",
        "1",
        "n1",
    )
    assert (env["SLURM_STEP_ID"], env["SLURM_NTASKS"], env["SLURM_STEP_NUM_TASKS"]) == ("2", "3", "3")
    assert (env["SLURM_STEP_NODELIST"], env["SLURM_STEP_TASKS_PER_NODE"], env["SLURM_NNODES"]) == ("n0,n1", "2,1", "2")


# -- the shim and the step server, with the tasks run by a stand-in ------------------------------------------------


class FakeNodes:
    """Runs each node's share of a step by echoing who each task is; task 1 exits 3. A step whose command is `hold`
    runs until `let_go` (or a signal: its tasks then end by it); `started` records the steps in the order they
    began."""

    def __init__(self) -> None:
        self.steps: list[tuple[str, NodeStep]] = []
        self.released: list[str] = []
        self.signals: list[tuple[str, int | None, str]] = []
        self.state: dict[tuple[str, int], tuple[list[OutputChunk], list[TaskResult]]] = {}
        self.held: dict[tuple[str, int], asyncio.Event] = {}
        self.started = asyncio.Event()

    def let_go(self) -> None:
        for event in self.held.values():
            event.set()

    async def run(self, node: str, op: slurm.StepOp) -> StepProgress:
        if isinstance(op, NodeStep):
            self.steps.append((node, op))
            self.started.set()
            chunks = [
                OutputChunk(
                    procid=t.procid,
                    stream="out",
                    text=f"{t.env['SLURMD_NODENAME']} {t.env['SLURM_PROCID']} {' '.join(op.argv)}\n",
                )
                for t in op.tasks
            ] + [OutputChunk(procid=t.procid, stream="err", text="oops\n") for t in op.tasks if t.procid == 1]
            results = [TaskResult(procid=t.procid, exit_code=3 if t.procid == 1 else 0) for t in op.tasks]
            self.state[(node, op.step_id)] = (chunks, results)
            if op.argv[0] == "hold":
                self.held[(node, op.step_id)] = asyncio.Event()
            return StepProgress()
        if isinstance(op, StepSignal):
            self.signals.append((node, op.step_id, op.signal))
            hit = [k for k in self.held if k[0] == node and op.step_id in (None, k[1]) and not self.held[k].is_set()]
            for k in hit:
                chunks, results = self.state[k]
                self.state[k] = (chunks, [TaskResult(procid=r.procid, exit_code=143) for r in results])
                self.held[k].set()
            return StepProgress(signalled=len(hit))
        chunks, results = self.state[(node, op.step_id)]
        hold = self.held.get((node, op.step_id))
        done = hold is None or hold.is_set()
        return StepProgress(chunks=chunks[op.since :], next=len(chunks), done=done, results=results if done else [])

    async def release(self, node: str, rel: Release) -> None:
        self.released.append(node)


def pending(spool: Path) -> list[Path]:
    return sorted(spool.glob("*.req"))


async def run_shim(
    spool: Path, server: StepServer, *args: str, env: dict[str, str] | None = None
) -> tuple[int, str, str]:
    """The real shim (a POSIX sh) against the server's request handling, served until it has its answer."""
    shell = shutil.which("sh")
    assert shell is not None
    proc = await asyncio.create_subprocess_exec(
        shell,
        str(slurm.SHIM_DIR / "srun"),
        *args,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), slurm.SPOOL_ENV: str(spool), **(env or {})},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    communicate = asyncio.ensure_future(proc.communicate())
    while not communicate.done():
        for req in pending(spool):
            server._serve(req)
        server._collect_acks()
        await asyncio.sleep(0.02)
    out, err = communicate.result()
    server._collect_acks()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def server_for(spool: Path, fake: FakeNodes) -> StepServer:
    # The batch node is named apart from the job's nodes, so every node's tasks go through the stand-in.
    cmd = batch_launch("batch-host", 0, [0])
    return StepServer(None, cmd, spool, fake.run, fake.release)  # type: ignore[arg-type]


async def test_shim_round_trip_labels_output_and_exits_with_the_worst_task(tmp_path: Path) -> None:
    spool = slurm.prepare_spool(tmp_path, "job-1", 3)
    fake = FakeNodes()
    code, out, err = await run_shim(spool, server_for(spool, fake), "-l", "-n", "3", "echo", "a b")
    assert code == 3
    # Streamed as the nodes answer: lines of different nodes come in either order.
    assert sorted(out.splitlines()) == ["0: n0 0 echo a b", "1: n0 1 echo a b", "2: n1 2 echo a b"]
    assert err == "1: oops\nsrun: error: n0: task 1: Exited with exit code 3\n"  # srun's words for a failed task
    assert [(node, [t.procid for t in step.tasks]) for node, step in fake.steps] == [("n0", [0, 1]), ("n1", [2])]
    assert fake.steps[0][1].argv == ["echo", "a b"] and fake.steps[0][1].cwd
    assert list(spool.iterdir()) == []  # every file of the request is gone once the shim has read the answer
    # The next srun is the next step.
    code, out, _ = await run_shim(spool, server_for(spool, fake), "-n", "1", "true")
    assert code == 0 and out == "n0 0 true\n"


async def test_shim_hands_the_batch_shells_exported_variables_to_every_task(tmp_path: Path) -> None:
    spool = slurm.prepare_spool(tmp_path, "job-1", 3)
    fake = FakeNodes()
    big = "x" * 60_000  # environments can be tens of KB
    exported = {"NCCL_DEBUG": "INFO", "ODD": "a b\nc='d'\"$e", "BIG": big, "HOSTNAME": "batch", "SLURM_PROCID": "0"}
    code, _, _ = await run_shim(spool, server_for(spool, fake), "-n", "3", "true", env=exported)
    assert code == 3  # the stand-in's task 1 exits 3
    for _, step in fake.steps:
        assert step.env["NCCL_DEBUG"] == "INFO" and step.env["ODD"] == "a b\nc='d'\"$e" and step.env["BIG"] == big
        assert "HOSTNAME" not in step.env and "SLURM_PROCID" not in step.env  # the shell's own; the step's own
        assert all(t.env["SLURM_PROCID"] == str(t.procid) for t in step.tasks)
    assert list(spool.iterdir()) == []
    fake.steps.clear()
    await run_shim(spool, server_for(spool, fake), "--export=NONE", "true", env=exported)
    assert all(step.env == {} for _, step in fake.steps)
    fake.steps.clear()
    await run_shim(spool, server_for(spool, fake), "--export=NCCL_DEBUG,A=1", "true", env=exported)
    assert all(step.env == {"NCCL_DEBUG": "INFO", "A": "1"} for _, step in fake.steps)


def test_exported_variables_unchanged_since_the_batch_container_started_are_each_containers_own(
    tmp_path: Path,
) -> None:
    cmd = batch_launch("n0", 0, [0, 1])
    server = StepServer(None, cmd, tmp_path, FakeNodes().run, FakeNodes().release)  # type: ignore[arg-type]
    start = rank_environment(cmd, None, in_container=True)[0]
    exported = {**start, "MASTER_PORT": "6000", "WORLD_SIZE": "16", "PATH": "/venv/bin:" + start["PATH"], "FOO": "1"}
    passed = server.passed_environment(parse_srun(["x"]), exported)
    # What the script set or changed passes (as Slurm's --export=ALL); RANK, CUDA_VISIBLE_DEVICES, SLURM_NODEID...
    # as the batch container had them stay each task's container's own.
    assert passed == {"MASTER_PORT": "6000", "WORLD_SIZE": "16", "PATH": "/venv/bin:" + start["PATH"], "FOO": "1"}
    assert server.passed_environment(parse_srun(["--export=NONE", "x"]), exported) == {}


async def test_shim_refuses_an_unknown_option_on_stderr(tmp_path: Path) -> None:
    spool = slurm.prepare_spool(tmp_path, "job-1", 3)
    fake = FakeNodes()
    code, out, err = await run_shim(spool, server_for(spool, fake), "--pty", "bash")
    assert (code, out) == (1, "")
    assert err.startswith("srun: error: unrecognized option '--pty'")
    assert fake.steps == []


async def test_shim_refuses_more_tasks_than_the_allocation(tmp_path: Path) -> None:
    spool = slurm.prepare_spool(tmp_path, "job-1", 3)
    fake = FakeNodes()
    code, _, err = await run_shim(spool, server_for(spool, fake), "-n", "9", "hostname")
    assert code == 1 and "9 tasks are more than the allocation" in err
    assert fake.steps == []


async def test_srun_outside_a_batch_job_says_so(tmp_path: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        "sh",
        str(slurm.SHIM_DIR / "srun"),
        "hostname",
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), slurm.SPOOL_ENV: str(tmp_path / "none")},
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await proc.communicate()
    assert proc.returncode == 1 and b"srun runs in the batch script of a OnePlus sbatch job" in err


def test_spool_files_are_never_read_through_a_link(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("host file")
    spool = slurm.prepare_spool(tmp_path, "job-1", 3)
    (spool / "7.arg0").symlink_to(secret)
    with pytest.raises(OSError):
        slurm._read(spool / "7.arg0")
    (spool / "7.out").symlink_to(secret)
    slurm._write(spool / "7.out", "answer")
    assert secret.read_text() == "host file" and (spool / "7.out").read_text() == "answer"
    slurm.remove_spools(tmp_path, "job-1", 3)
    assert not spool.exists()


async def test_a_request_whose_environment_is_a_link_is_refused_and_one_without_runs(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("TOKEN=host secret")
    spool = slurm.prepare_spool(tmp_path, "job-1", 3)
    fake = FakeNodes()
    server = server_for(spool, fake)
    for rid in ("7", "8"):
        (spool / f"{rid}.arg0").write_text("true")
        (spool / f"{rid}.cwd").write_text("/\n")
    (spool / "7.env").symlink_to(secret)
    for rid in ("7", "8"):  # 8: a shim of before the environment was sent
        (spool / f"{rid}.req").write_text("1\nend\n")
        running = server._serve(spool / f"{rid}.req")
        if running is not None:
            await running
    assert (spool / "7.rc").read_text() == "1\n" and "the request could not be read" in (spool / "7.e0").read_text()
    assert (spool / "8.rc").read_text() == "3\n"  # ran (the stand-in's task 1 exits 3), with nothing exported
    assert [step.env for _, step in fake.steps] == [{}, {}]


def test_removing_one_job_s_spools_leaves_a_job_whose_id_it_prefixes(tmp_path: Path) -> None:
    mine = slurm.prepare_spool(tmp_path, "job-a", 1)
    (tmp_path / "job-a-t1.launch.json").write_text("{}")
    other = slurm.prepare_spool(tmp_path, "job-a-t5", 2)
    slurm.remove_spools(tmp_path, "job-a")
    assert not mine.exists() and not (tmp_path / "job-a-t1.launch.json").exists()
    assert other.exists()


async def test_a_node_without_the_container_runtime_answers_a_step_with_an_error() -> None:
    step = NodeStep(job_id="job-1", step_id=0, argv=["true"], tasks=[]).model_dump(mode="json")
    reply = await slurm.serve_node_step(object(), {**step, "team": "stamped"})
    assert reply.done
    assert reply.results == [] and reply.error is not None and "cannot run step tasks" in reply.error
    assert await slurm.serve_release(object(), {"job_id": "job-1", "team": "stamped"}) == {"released": 0}
    assert slurm.resume_step_server(object(), "job-1", 1, lambda: None) is None  # type: ignore[arg-type,return-value]


async def test_a_step_taken_by_an_executor_that_then_stopped_fails_and_is_not_run_again(tmp_path: Path) -> None:
    spool = slurm.prepare_spool(tmp_path, "job-1", 3)
    fake = FakeNodes()
    # What the shim and a stopped executor left: a request, taken (its step under way), never answered.
    (spool / "41.arg0").write_text("hostname")
    (spool / "41.cwd").write_text("/\n")
    (spool / "41.taken").write_text("1\nend\n")
    server = server_for(spool, fake)
    server._answer_interrupted()
    assert (spool / "41.rc").read_text() == "1\n"
    assert "executor restarted while this step ran" in (spool / "41.e0").read_text()
    assert not (spool / "41.taken").exists() and fake.steps == []
    # A request served normally leaves no taken marker behind.
    code, out, _ = await run_shim(spool, server, "-n", "1", "true")
    assert (code, out) == (0, "n0 0 true\n")
    assert not list(spool.glob("*.taken"))


# -- scontrol: the hostlist idiom of launch scripts ----------------------------------------------------------------
def scontrol(*args: str, nodelist: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    if nodelist is not None:
        env["SLURM_JOB_NODELIST"] = nodelist
    return subprocess.run(
        ["sh", str(slurm.SHIM_DIR / "scontrol"), *args], env=env, capture_output=True, text=True, check=False
    )


def test_scontrol_show_hostnames_expands_slurm_hostlists() -> None:
    got = scontrol("show", "hostnames", "gpu-[01-03,07],h100-0,rack[1-2]-n[0-1]")
    assert got.returncode == 0, got.stderr
    assert got.stdout.split() == [
        "gpu-01", "gpu-02", "gpu-03", "gpu-07", "h100-0", "rack1-n0", "rack1-n1", "rack2-n0", "rack2-n1",
    ]  # fmt: skip
    first = scontrol("show", "hostnames", nodelist="h100-0,h100-1")
    assert first.stdout.splitlines()[0] == "h100-0", "the job's own nodelist when none is given"


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("show", "jobs"), "only 'scontrol show hostnames"),
        (("update", "JobId=1"), "only 'scontrol show hostnames"),
        (("show", "hostnames", "a[3-1]"), "bad range 3-1"),
        (("show", "hostnames", "a[1-2"), "unbalanced brackets"),
        (("show", "hostnames", "a[x]"), "bad range x"),
        (("show", "hostnames"), "SLURM_JOB_NODELIST is not set"),
    ],
)
def test_scontrol_refuses_what_it_does_not_do_in_one_line(args: tuple[str, ...], said: str) -> None:
    got = scontrol(*args)
    assert got.returncode == 1 and said in got.stderr and got.stderr.count("\n") == 1, got.stderr
