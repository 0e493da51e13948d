"""A public heterogeneous batch script on the real engine: its two het groups run side by side.

The script is slac-lcls/lcls2 `psdaq/psdaq/slurm/submit_slac.sh` (tests/jobformats/samples/public/
lcls2_submit_slac_hetjob.sh, BSD-3-Clause, source in that folder's README): component 0 is three tasks on
drp-srcf-cmp035, component 1 one task on drp-srcf-cmp036 (`#SBATCH hetjob`); the script starts three one-task steps on
component 0 (`srun -n 1 --het-group=0 --exclusive`, sleeping 5, 10 and 15 s) and one on component 1 (15 s), all in the
background, then `wait`s. It runs here as published except where the busybox test image forces a change (`ADAPTED`):
no bash. Two executor nodes named as the script names them share the one engine.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from oneplus_contracts import LaunchRanks, RankPlacement
from oneplus_jobformats.sbatch import parse_sbatch
from oneplus_node_executor.runtime import slurm
from oneplus_node_executor.runtime.docker import DockerRuntime
from oneplus_node_executor.runtime.environment import rank_environment
from oneplus_node_executor.runtime.slurm_tasks import NodeStep

pytestmark = pytest.mark.engine

SAMPLE = Path(__file__).resolve().parents[1] / "jobformats" / "samples" / "public" / "lcls2_submit_slac_hetjob.sh"
A, B = "drp-srcf-cmp035", "drp-srcf-cmp036"
# (published text, adapted text, how many times, why)
ADAPTED: list[tuple[str, str, int, str]] = [
    ("#!/bin/bash", "#!/bin/sh", 1, "the image has busybox sh, no bash"),
    (" bash -c ", " sh -c ", 4, "the steps' shell: no bash in the image"),
]
SLEEPS_S = (5, 10, 15, 15)  # the script's four steps


def adapted_script() -> str:
    text = SAMPLE.read_text()
    for published, adapted, times, _why in ADAPTED:
        assert text.count(published) == times, published
        text = text.replace(published, adapted)
    return text


@pytest.fixture
async def het_nodes(engine_url: str, tmp_path: Path) -> AsyncIterator[dict[str, DockerRuntime]]:
    runtimes = {n: DockerRuntime(engine_url, node=n, slurm_spool_root=tmp_path / "spool" / n) for n in (A, B)}
    try:
        yield runtimes
    finally:
        for rt in runtimes.values():
            for ranks in await rt.list_managed():
                await rt.remove(ranks.job_id)
            await rt.close()


def het_launches(job_id: str) -> list[LaunchRanks]:
    """The launches placement gives the job: component 0's three ranks on its node, component 1's one on its own."""
    spec = parse_sbatch(adapted_script(), filename=SAMPLE.name, submit_dir="/home/me").spec
    assert spec.components is not None
    layout = [(c.nodelist[0], list(range(start, start + c.ranks))) for start, c in
              zip(spec.component_offsets(), spec.components, strict=True)]  # fmt: skip
    assert layout == [(A, [0, 1, 2]), (B, [3])]
    nodes = [node for node, _ in layout]
    return [
        LaunchRanks(
            job_id=job_id,
            node=node,
            token=1,
            spec=spec,
            ranks=[RankPlacement(rank=r, node=node, gpus=[], cpus=1, memory_mb=64) for r in ranks],
            world_size=spec.ranks,
            node_rank=i,
            nodes=nodes,
            master_addr=nodes[0],
            ranks_per_node=[len(r) for _, r in layout],
        )
        for i, (node, ranks) in enumerate(layout)
    ]


async def test_the_public_hetjob_script_runs_its_two_het_groups_side_by_side(
    het_nodes: dict[str, DockerRuntime],
) -> None:
    job_id = "job-" + uuid.uuid4().hex[:10]
    cmds = het_launches(job_id)
    for cmd in reversed(cmds):  # the holder first, as a launch that reaches node B before node A would
        await het_nodes[cmd.node].launch(cmd, rank_environment(cmd, None))
    batch = het_nodes[A]
    spool = slurm.spool_dir(batch.slurm_spool_root, job_id, 1)
    to_peer: list[tuple[str, int]] = []  # the steps the batch node started on another node (the rest: on its own)

    async def transport(node: str, op: slurm.StepOp) -> slurm.StepProgress:
        if isinstance(op, NodeStep):
            to_peer.append((node, op.step_id))
        return await slurm.serve_op(het_nodes[node].slurm_tasks, op)

    async def release(node: str, rel: slurm.Release) -> None:
        await slurm.release_holders(het_nodes[node], rel.job_id)

    started = time.monotonic()
    server = asyncio.create_task(slurm.StepServer(batch, cmds[0], spool, transport, release).run())
    ends = await asyncio.wait_for(asyncio.gather(*(rt.wait(job_id) for rt in het_nodes.values())), 90)
    took = time.monotonic() - started
    await asyncio.wait_for(server, 10)
    lines = await batch.logs(job_id, 0, follow=False)
    assert sorted(lines) == ["blah 1", "blah 2", "blah 3", "blah 4"], lines
    assert lines.index("blah 1") < lines.index("blah 2") < lines.index("blah 3")  # 5, 10, 15 s side by side
    # Component 1's step (the script's fourth srun) ran on its node, the other three on component 0's (the batch
    # node's own); none waited for another.
    assert [node for node, _ in to_peer] == [B]
    assert not any("temporarily disabled" in line for line in lines)
    assert max(SLEEPS_S) <= took < sum(SLEEPS_S[:3]), f"the steps took {took:.1f} s: they did not run side by side"
    assert [e.exit_code for e in ends] == [0, 0]  # the script's end is the job's; the holder was released
    assert batch.slurm_tasks.summary(job_id) == "srun steps: 0 exit 0, 1 exit 0, 2 exit 0, 3 exit 0"
