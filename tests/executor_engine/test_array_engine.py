"""The public sweep script (samples/public/princeton_job_array.slurm, `--array=0-2`) on the real container engine:
each task is a job of its own, and its batch script sees the array's and its own id, as Slurm gives them.

The script's `#!/bin/bash` is run by the busybox image's `/bin/sh` (the image has no bash; the script is POSIX sh).
Its `module` and `python` lines then fail, as they would on a node without them: the ids are echoed before that.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from oneplus_contracts import LaunchRanks, RankPlacement
from oneplus_contracts.array_facts import task_specs
from oneplus_jobformats.sbatch import parse_sbatch
from oneplus_node_executor.runtime.docker import DockerRuntime
from oneplus_node_executor.runtime.environment import rank_environment

pytestmark = pytest.mark.engine

SWEEP = Path(__file__).resolve().parents[1] / "jobformats" / "samples" / "public" / "princeton_job_array.slurm"


async def test_each_task_of_the_public_sweep_sees_its_ids(engine_url: str, tmp_path: Path) -> None:
    spec = parse_sbatch(SWEEP.read_text(), filename=SWEEP.name, submit_dir="/home/me").spec
    assert spec.array is not None and spec.array.tasks == 3
    array_id = "j-" + uuid.uuid4().hex[:10]
    node = "sweep-" + uuid.uuid4().hex[:6]
    rt = DockerRuntime(engine_url, node=node, slurm_spool_root=tmp_path / "spool")
    try:
        for job_id, task in task_specs(array_id, spec):
            task = task.model_copy(update={"command": ["/bin/sh", *task.command[1:]]})
            cmd = LaunchRanks(
                job_id=job_id,
                node=node,
                token=1,
                spec=task,
                ranks=[RankPlacement(rank=0, node=node, gpus=[], cpus=1, memory_mb=64)],
                world_size=1,
                node_rank=0,
                nodes=[node],
                master_addr=node,
            )
            await rt.launch(cmd, rank_environment(cmd, None))
        seen: dict[int, list[str]] = {}
        for task_id in (0, 1, 2):
            job_id = f"{array_id}_{task_id}"
            await asyncio.wait_for(rt.wait(job_id), 60)
            seen[task_id] = await rt.logs(job_id, 0, follow=False)
        for task_id, lines in seen.items():
            assert f"My SLURM_ARRAY_JOB_ID is {array_id}." in lines, lines
            assert f"My SLURM_ARRAY_TASK_ID is {task_id}" in lines, lines
    finally:
        for ranks in await rt.list_managed():
            await rt.remove(ranks.job_id)
        await rt.close()
