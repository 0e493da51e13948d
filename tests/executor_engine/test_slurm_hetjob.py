"""A heterogeneous batch job (Slurm hetjob) on the executor, without an engine: each container's `_HET_GROUP_<n>`
variables, and `srun --het-group=N` steps laid on that component's nodes (the public sample's allocation)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import pytest
from oneplus_contracts import JobSpec, LaunchRanks, RankPlacement
from oneplus_jobformats.sbatch import parse_sbatch
from oneplus_node_executor.runtime import slurm
from oneplus_node_executor.runtime.environment import rank_environment
from oneplus_node_executor.runtime.slurm import SrunError, StepServer, parse_srun
from oneplus_node_executor.runtime.slurm_het import het_groups
from oneplus_node_executor.runtime.slurm_tasks import NodeTasks
from test_slurm_steps_sharing import chunks, until
from test_slurm_steps_unit import FakeNodes

SAMPLE = Path(__file__).resolve().parents[1] / "jobformats" / "samples" / "public" / "lcls2_submit_slac_hetjob.sh"
A, B = "drp-srcf-cmp035", "drp-srcf-cmp036"  # the nodes the sample's components name (--nodelist)

GPU_SCRIPT = """#!/bin/sh
#SBATCH --job-name=rl --ntasks=1 --cpus-per-task=2
#SBATCH hetjob
#SBATCH --nodes=2 --ntasks-per-node=1 --gpus-per-node=8
srun --het-group=1 hostname
"""


def launches(spec: JobSpec, layout: list[tuple[str, list[int], int]]) -> list[LaunchRanks]:
    """One launch per node: (node, its ranks, GPUs per rank), nodes in the allocation's order (component 0's first)."""
    nodes = [n for n, _, _ in layout]
    return [
        LaunchRanks(
            job_id="job-het",
            node=node,
            token=1,
            spec=spec,
            ranks=[RankPlacement(rank=r, node=node, gpus=list(range(g)), gpu_milli=0 if g else 1) for r in ranks],
            world_size=spec.ranks,
            node_rank=i,
            nodes=nodes,
            master_addr=nodes[0],
            ranks_per_node=[len(r) for _, r, _ in layout],
        )
        for i, (node, ranks, g) in enumerate(layout)
    ]


def sample_launches() -> list[LaunchRanks]:
    spec = parse_sbatch(SAMPLE.read_text(), filename=SAMPLE.name, submit_dir="/home/me").spec
    return launches(spec, [(A, [0, 1, 2], 0), (B, [3], 0)])


def test_the_sample_is_one_job_of_two_components_each_with_its_own_nodes() -> None:
    spec = sample_launches()[0].spec
    assert spec.components is not None and [c.ranks for c in spec.components] == [3, 1]
    assert [c.nodelist for c in spec.components] == [[A], [B]]
    groups = het_groups(sample_launches()[0])
    assert [(g.nodes, g.ntasks) for g in groups] == [([A], 3), ([B], 1)]


def test_every_container_gets_each_components_variables_and_its_own_as_the_plain_ones() -> None:
    first, second = sample_launches()
    batch = rank_environment(first, None)[0]
    holder = rank_environment(second, None)[3]
    for env in (batch, holder):
        assert env["SLURM_HET_SIZE"] == "2"
        assert env["SLURM_JOB_ID_HET_GROUP_0"] == env["SLURM_JOB_ID_HET_GROUP_1"] == "job-het"
        assert (env["SLURM_JOB_NODELIST_HET_GROUP_0"], env["SLURM_JOB_NODELIST_HET_GROUP_1"]) == (A, B)
        assert (env["SLURM_JOB_NUM_NODES_HET_GROUP_0"], env["SLURM_JOB_NUM_NODES_HET_GROUP_1"]) == ("1", "1")
        assert (env["SLURM_NTASKS_HET_GROUP_0"], env["SLURM_NTASKS_HET_GROUP_1"]) == ("3", "1")
        assert env["SLURM_TASKS_PER_NODE_HET_GROUP_0"] == "3"
    # The batch script's plain variables are component 0's (as in Slurm); a holder's, its own component's.
    assert (batch["SLURM_JOB_NODELIST"], batch["SLURM_NTASKS"], batch["SLURM_NODEID"]) == (A, "3", "0")
    assert (holder["SLURM_JOB_NODELIST"], holder["SLURM_NTASKS"], holder["SLURM_NODEID"]) == (B, "1", "0")


def test_gpu_variables_follow_each_components_gpus() -> None:
    spec = parse_sbatch(GPU_SCRIPT, filename="rl.sh", submit_dir="").spec
    driver, t1, _ = launches(spec, [("cpu-0", [0], 0), ("gpu-0", [1], 8), ("gpu-1", [2], 8)])
    env = {**rank_environment(driver, None), **rank_environment(t1, None)}
    assert "SLURM_GPUS_ON_NODE" not in env[0] and env[0]["SLURM_CPUS_PER_TASK"] == "2"
    assert env[1]["SLURM_GPUS_ON_NODE"] == "8" and "SLURM_CPUS_PER_TASK" not in env[1]
    assert env[0]["SLURM_JOB_NODELIST_HET_GROUP_1"] == "gpu-0,gpu-1"
    assert env[0]["SLURM_CPUS_PER_TASK_HET_GROUP_0"] == "2" and "SLURM_CPUS_PER_TASK_HET_GROUP_1" not in env[0]
    assert env[1]["SLURM_JOB_NODELIST"] == "gpu-0,gpu-1" and env[1]["SLURM_NODEID"] == "0"
    assert env[0]["SLURM_NTASKS"] == "1" and env[1]["SLURM_NTASKS"] == "2"


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--het-group=2", "x"], r"--het-group=2: job job-het has no component 2 \(its components are 0-1"),
        (["--het-group", "0,3", "x"], r"--het-group=0,3: job job-het has no component 3"),
        (["--het-group=1-0", "x"], r"--het-group=1-0: the range 1-0 runs backwards"),
        (["--het-group=one", "x"], r"--het-group=one: expected a component number, a list or a range"),
        (["--het-group=0", "-n1", "a", ":", "--het-group=1", "b"], r"':' starts another component of a heterogeneous "
         r"step \(srun A : B\), which OnePlus does not run; start one srun per component"),
    ],
)  # fmt: skip
def test_a_het_group_the_job_does_not_have_is_refused_in_one_line(args: list[str], said: str) -> None:
    with pytest.raises(SrunError, match=said) as caught:
        parse_srun(args, job_id="job-het", components=2)
    assert str(caught.value).startswith("srun: error: ") and "\n" not in str(caught.value)


def test_het_group_forms_and_exclusive_for_a_step() -> None:
    assert parse_srun(["--het-group=0,1", "x"], components=2).het_group == (0, 1)
    assert parse_srun(["--het-group", "0-1", "x"], components=2).het_group == (0, 1)
    opts = parse_srun(["-n", "1", "--het-group=1", "--exclusive", "x"], components=2)
    assert opts.het_group == (1,) and opts.exact  # srun(1): a step's --exclusive implies --exact


def het_server(spool: Path, fake: FakeNodes) -> StepServer:
    runtime = SimpleNamespace(slurm_tasks=NodeTasks(None))  # the steps' record only
    # Named apart from the job's nodes, every node's share of a step goes through `fake` (as a peer's would).
    batch = sample_launches()[0].model_copy(update={"node": "batch-host"})
    return StepServer(runtime, batch, spool, fake.run, fake.release)  # type: ignore[arg-type]


async def test_srun_runs_on_its_component_and_the_groups_run_side_by_side(tmp_path: Path) -> None:
    spool = slurm.prepare_spool(tmp_path, "job-het", 1)
    fake = FakeNodes()
    server = het_server(spool, fake)

    def run(rid: str, *args: str) -> asyncio.Task[int]:
        return asyncio.create_task(server.step(list(args), "/", {}, slurm.SpoolAnswer(spool, rid)))

    # The sample's steps: three one-task --exclusive steps on component 0, one on component 1, all at once.
    steps = [run(str(i), "-n", "1", "--het-group=0", "--exclusive", "hold") for i in range(3)]
    steps.append(run("3", "-n", "1", "--het-group=1", "--exclusive", "hold"))
    await until(lambda: len(fake.steps) == 4)
    assert sorted(node for node, _ in fake.steps) == [A, A, A, B]
    assert not any("temporarily disabled" in chunks(spool, str(i), "e") for i in range(4))
    fake.let_go()
    assert await asyncio.wait_for(asyncio.gather(*steps), 5) == [0, 0, 0, 0]
    fake.steps.clear()
    assert await run("p", "echo", "plain") == 3  # no --het-group: component 0's three tasks (task 1 exits 3)
    assert [(node, [t.procid for t in s.tasks]) for node, s in fake.steps] == [(A, [0, 1, 2])]
    fake.steps.clear()
    assert await run("both", "--het-group=0,1", "echo", "both") == 3
    assert [(node, [t.procid for t in s.tasks]) for node, s in fake.steps] == [(A, [0, 1, 2]), (B, [3])]
    b_task = fake.steps[1][1].tasks[0].env
    assert (b_task["SLURM_NTASKS"], b_task["SLURM_NODEID"], b_task["SLURM_STEP_NODELIST"]) == ("4", "1", f"{A},{B}")
    assert await run("bad", "--het-group=2", "x") == 1
    assert chunks(spool, "bad", "e").startswith("srun: error: --het-group=2: job job-het has no component 2")
    assert all(g.shares.held == {} for g in server.groups)
