"""On a real engine: a GPU share's container gets its MPS limits and sees the node's MPS pipe and log directories.

No MPS daemon runs here (nor a GPU): the check is that the container is created as MPS needs it, not that CUDA
enforces the limits.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from executor_engine_support import launch, new_job_id
from oneplus_contracts import GpuInfo, MpsDaemon, NodeTopology
from oneplus_node_executor.runtime.docker import DockerRuntime
from oneplus_node_executor.runtime.environment import rank_environment
from test_docker_runtime_engine import inspect, wait_for_line

pytestmark = pytest.mark.engine


async def test_share_container_sees_the_mps_directories_and_its_limits(
    engine_url: str, node_name: str, tmp_path: Path
) -> None:
    pipe, log = tmp_path / "mps-pipe", tmp_path / "mps-log"
    pipe.mkdir()
    log.mkdir()
    (pipe / "control").write_text("daemon pipe stand-in\n")
    mps = MpsDaemon(pipe_directory=str(pipe), log_directory=str(log))
    topo = NodeTopology(node=node_name, gpus=[GpuInfo(index=0, cpu_affinity="0")], cpus=1, mps=mps)
    job = new_job_id()
    script = (
        'env | grep -E "^(CUDA_MPS|ONEPLUS_GPU)" | sort; cat "$CUDA_MPS_PIPE_DIRECTORY/control"; echo done; sleep 30'
    )
    cmd = launch(job, node_name, [(0, [0])], command=["sh", "-c", script])
    spec = cmd.spec.model_copy(
        update={"resources": cmd.spec.resources.model_copy(update={"gpus": 0.3, "gpu_memory_mb": 4096})}
    )
    cmd = cmd.model_copy(update={"spec": spec, "ranks": [cmd.ranks[0].model_copy(update={"gpu_milli": 300})]})
    rt = DockerRuntime(engine_url, node_topology=topo)
    try:
        await rt.launch(cmd, rank_environment(cmd, topo))
        running = await rt.list_running()
        info = await inspect(engine_url, running[0].handles[0])
        binds = {b.split(":")[0] + ":" + b.split(":")[1] for b in info["HostConfig"]["Binds"]}  # engine adds options
        assert binds == {f"{pipe}:{pipe}", f"{log}:{log}"}
        await wait_for_line(rt, job, "done", rank=0)
        lines = await rt.logs(job, 0, follow=False)
        assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30" in lines
        assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4096M" in lines
        assert f"CUDA_MPS_PIPE_DIRECTORY={pipe}" in lines and "ONEPLUS_GPU_SHARING=mps" in lines
        assert "daemon pipe stand-in" in lines  # the mounted pipe directory is the node's
    finally:
        await rt.remove(job)
        await rt.close()


async def test_mig_rank_container_is_told_exactly_its_instance(engine_url: str, node_name: str) -> None:
    # Without the NVIDIA runtime the engine takes no device request (gpu_node=False): the variables are checked here,
    # the request by UUID in test_mig_container_spec.py.
    from oneplus_contracts import MigInstance

    uuid = "MIG-4a8c2d0b-6e9f-5b7c-d350-bf6e8b0c2d45"
    gpu = GpuInfo(
        index=0, cpu_affinity="0", mig_enabled=True, mig_instances=[MigInstance(profile="3g.40gb", uuid=uuid, device=0)]
    )
    topo = NodeTopology(node=node_name, gpus=[gpu], cpus=1)
    job = new_job_id()
    cmd = launch(
        job, node_name, [(0, [])], command=["sh", "-c", "env | grep VISIBLE_DEVICES | sort; echo done; sleep 30"]
    )
    spec = cmd.spec.model_copy(update={"resources": cmd.spec.resources.model_copy(update={"mig": "3g.40gb"})})
    cmd = cmd.model_copy(update={"spec": spec, "ranks": [cmd.ranks[0].model_copy(update={"mig": [uuid]})]})
    rt = DockerRuntime(engine_url, node_topology=topo)
    try:
        await rt.launch(cmd, rank_environment(cmd, topo))
        await wait_for_line(rt, job, "done", rank=0)
        lines = await rt.logs(job, 0, follow=False)
        assert f"NVIDIA_VISIBLE_DEVICES={uuid}" in lines and f"CUDA_VISIBLE_DEVICES={uuid}" in lines
    finally:
        await rt.remove(job)
        await rt.close()
