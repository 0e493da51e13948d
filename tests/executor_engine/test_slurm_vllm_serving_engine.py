"""A public vLLM-serving batch script on the real engine: its server step runs in the background while its client step
polls the server, and the script ends (the server step ends with it, and each step's end is recorded).

The script is huggingface/open-r1 `slurm/train.slurm` (tests/jobformats/samples/public/openr1_train.slurm, Apache-2.0,
source in that folder's README): with `use_vllm: true` in its recipe, it starts `trl vllm-serve` as an srun step in the
background on the allocation's last node, then runs the GRPO trainer (which polls the vLLM server until it answers)
as a step on the other node, and ends. It runs here as published except where the busybox test image forces a change
(`ADAPTED`, each with its reason): no bash (so no arrays), no conda/modules/Weka, no trl/accelerate/python (stand-ins
that serve and poll over HTTP with busybox httpd and wget), and both "nodes" share this one host (the client polls
127.0.0.1, the containers use the host's network).
"""

from __future__ import annotations

import asyncio
import socket
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from oneplus_contracts import LaunchRanks, RankPlacement
from oneplus_jobformats.sbatch import parse_sbatch
from oneplus_node_executor.runtime import slurm
from oneplus_node_executor.runtime.docker import DockerRuntime
from oneplus_node_executor.runtime.environment import rank_environment

pytestmark = pytest.mark.engine

SAMPLE = Path(__file__).resolve().parents[1] / "jobformats" / "samples" / "public" / "openr1_train.slurm"
# As open-r1's README submits it: `sbatch --nodes=2 slurm/train.slurm --model ... --task grpo ...`.
SBATCH_ARGS = ["--nodes=2"]
SCRIPT_ARGS = ["--model", "Qwen2.5-1.5B-Instruct", "--task", "grpo", "--config", "demo", "--accelerator", "zero2"]

# The recipe the script reads (the open-r1 checkout it runs in; only the keys the script greps for).
RECIPE = (
    "mkdir -p /tmp/open-r1/recipes/Qwen2.5-1.5B-Instruct/grpo && cd /tmp/open-r1 && "
    "printf 'model_name_or_path: Qwen/Qwen2.5-1.5B-Instruct\\nmodel_revision: main\\n"
    "gradient_accumulation_steps: 4\\nuse_vllm: true\\n' > recipes/Qwen2.5-1.5B-Instruct/grpo/config_demo.yaml"
)
SERVER = (
    'sh -c \'mkdir -p /tmp/vllm && echo ok > /tmp/vllm/health && echo "vllm-serve: listening on {port}" '
    "&& exec busybox httpd -f -p 127.0.0.1:{port} -h /tmp/vllm' vllm-serve"
)
CLIENT = (
    'sh -c "accelerate() { i=0; until busybox wget -q -O /dev/null http://127.0.0.1:{port}/health; do '
    'i=\\$((i + 1)); [ \\$i -lt 300 ] || exit 1; sleep 0.1; done; echo \\"grpo: the vLLM server answered after '
    '\\$i tries (rank \\$SLURM_PROCID)\\"; }; $LAUNCHER $CMD"'
)

# (published text, adapted text, why): each is applied exactly once.
ADAPTED: list[tuple[str, str, str]] = [
    ("#!/bin/bash", "#!/bin/sh", "the image has busybox sh, no bash"),
    ("module load cuda/12.4\n", ": module load cuda/12.4\n", "no environment modules in the image"),
    ("source ~/.bashrc\nsource openr1/bin/activate\n", f"{RECIPE}\n", "no conda env; the recipe the repo holds"),
    (
        "find -L /fsx/h4/ -type f | xargs -d '\\n' -r -n512 -P64 weka fs tier fetch\n",
        ": weka fs tier fetch\n",
        "no Weka filesystem (Hugging Face's cluster)",
    ),
    (
        "IFS=' ' read -ra ARGS <<< \"$OPTIONAL_ARGS\"\n",
        "",
        "no arrays in sh: the loop below splits the string itself",
    ),
    ('for arg in "${ARGS[@]}"; do', "for arg in $OPTIONAL_ARGS; do", "no arrays in sh"),
    (
        "NODELIST=($(scontrol show hostnames $SLURM_JOB_NODELIST))\n",
        "NODELIST=$(scontrol show hostnames $SLURM_JOB_NODELIST)\n",
        "no arrays in sh: one name a line",
    ),
    ("MASTER_ADDR=${NODELIST[0]}", 'MASTER_ADDR=$(echo "$NODELIST" | head -n 1)', "no arrays in sh"),
    ('TRAIN_NODES=("${NODELIST[@]}")', 'TRAIN_NODES="$NODELIST"', "no arrays in sh"),
    (
        'TRAIN_NODES=("${NODELIST[@]:0:$((NUM_NODES - 1))}")',
        'TRAIN_NODES=$(echo "$NODELIST" | head -n $((NUM_NODES - 1)))',
        "no arrays in sh",
    ),
    ("VLLM_NODE=${NODELIST[-1]}", 'VLLM_NODE=$(echo "$NODELIST" | tail -n 1)', "no arrays in sh"),
    ('NODELIST=$(IFS=,; echo "${TRAIN_NODES[*]}")', "NODELIST=$(echo $TRAIN_NODES | tr ' ' ,)", "no arrays in sh"),
    (
        "trl vllm-serve --model $MODEL",
        SERVER + " --model $MODEL",
        "no trl/vLLM: busybox httpd answers /health on the port (the nodes share this host)",
    ),
    (
        'srun $SRUN_ARGS bash -c "$LAUNCHER $CMD"',
        "srun $SRUN_ARGS " + CLIENT,
        "no bash nor accelerate: a stand-in trainer polls the server as TRL's client does",
    ),
]


def adapted_script(port: int) -> str:
    text = SAMPLE.read_text()
    for old, new, why in ADAPTED:
        assert text.count(old) == 1, f"the sample no longer has {old!r} ({why})"
        text = text.replace(old, new.replace("{port}", str(port)))
    return text


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
async def host_nodes(engine_url: str, tmp_path: Path) -> AsyncIterator[dict[str, DockerRuntime]]:
    stem = "vllm-" + uuid.uuid4().hex[:6]
    names = [f"{stem}-a", f"{stem}-b"]
    runtimes = {
        n: DockerRuntime(engine_url, node=n, network_mode="host", slurm_spool_root=tmp_path / "spool" / n)
        for n in names
    }
    try:
        yield runtimes
    finally:
        for rt in runtimes.values():
            for ranks in await rt.list_managed():
                await rt.remove(ranks.job_id)
            await rt.close()


async def test_the_server_step_runs_beside_the_client_step_and_the_script_ends(
    host_nodes: dict[str, DockerRuntime],
) -> None:
    nodes = list(host_nodes)
    job_id = "job-" + uuid.uuid4().hex[:10]
    port = free_port()
    spec = parse_sbatch(
        adapted_script(port), SBATCH_ARGS, filename="train.slurm", script_args=SCRIPT_ARGS, submit_dir="/tmp"
    ).spec
    assert spec.slurm is not None and spec.ranks == 2 and spec.resources.whole_gpus == 8
    spec = spec.model_copy(update={"image": "localhost/busybox:latest"})
    cmds = [
        LaunchRanks(
            job_id=job_id,
            node=node,
            token=1,
            spec=spec,
            ranks=[RankPlacement(rank=i, node=node, gpus=list(range(8)), cpus=1, memory_mb=64)],
            world_size=2,
            node_rank=i,
            nodes=nodes,
            master_addr=nodes[0],
        )
        for i, node in enumerate(nodes)
    ]
    for cmd in cmds:
        await host_nodes[cmd.node].launch(cmd, rank_environment(cmd, None))

    async def transport(node: str, op: slurm.StepOp) -> slurm.StepProgress:
        return await slurm.serve_op(host_nodes[node].slurm_tasks, op)

    async def release(node: str, rel: slurm.Release) -> None:
        await slurm.release_holders(host_nodes[node], rel.job_id)

    batch = host_nodes[nodes[0]]
    spool = slurm.spool_dir(batch.slurm_spool_root, job_id, 1)
    server = asyncio.create_task(slurm.StepServer(batch, cmds[0], spool, transport, release).run())
    # Before concurrent steps, this waited for ever: the client step queued behind the server step, which never ends.
    ends = await asyncio.wait_for(asyncio.gather(*(rt.wait(job_id) for rt in host_nodes.values())), 120)
    await asyncio.wait_for(server, 30)
    b = nodes[1]
    lines = await batch.logs(job_id, 0, follow=False)
    text = "\n".join(lines)
    # (The server step's own "listening" line may be lost: the script can end before its srun printed it, as in
    # Slurm, where the job's end kills the srun still running.)
    assert any(line.startswith("grpo: the vLLM server answered after") for line in lines), text
    # The script went on past the client step to its end (its `set -x` trace shares the log: the line may follow
    # a "+ " of it).
    assert any("TOTAL JOB TIME:" in line and "echo" not in line for line in lines), text
    # The client's answer came from the server step while it ran (two srun processes print in either order); the job
    # is the script's: it exited 0, and its server step, still running then, ended with it (SIGTERM).
    assert [e.exit_code for e in ends] == [0, 0], [e.reason for e in ends]
    assert ends[0].reason.endswith("srun steps: 0 ended with the batch script (exit 143), 1 exit 0"), ends[0].reason
    assert not batch.slurm_tasks.running(job_id) and not host_nodes[b].slurm_tasks.running(job_id)
