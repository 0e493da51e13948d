"""A GPU share's container on a node that runs MPS: its SM and memory limits, and the daemon's directories mounted."""

from __future__ import annotations

import pytest
from oneplus_contracts import JobSpec, LaunchRanks, MpsDaemon, NodeTopology, RankPlacement
from oneplus_node_executor.app import parse_args
from oneplus_node_executor.runtime.container_spec import container_body
from oneplus_node_executor.runtime.environment import rank_environment
from oneplus_topology.presets import load_preset

MPS = MpsDaemon(pipe_directory="/run/nvidia-mps", log_directory="/var/log/nvidia-mps")


def node(mps: MpsDaemon | None) -> NodeTopology:
    return load_preset("l40s_8gpu_pcie_node_sys", "l40s-0").model_copy(update={"mps": mps})


def share_launch(gpus: float = 0.25, gpu: int = 5, **resources: object) -> LaunchRanks:
    spec = JobSpec.model_validate({"name": "s", "resources": {"gpus": gpus, **resources}, "image": "busybox"})
    rank = RankPlacement(rank=0, node="l40s-0", gpus=[gpu], gpu_milli=spec.resources.gpu_milli)
    return LaunchRanks(
        job_id="job-s", node="l40s-0", token=1, spec=spec, ranks=[rank], world_size=1, node_rank=0,
        nodes=["l40s-0"], master_addr="10.0.0.1", master_port=29511,
    )  # fmt: skip


def body(cmd: LaunchRanks, topo: NodeTopology) -> dict[str, object]:
    env = rank_environment(cmd, topo, in_container=True)[0]
    return container_body(
        cmd, cmd.ranks[0], env, local_rank=0, gpu_node=True, network_mode="host", cpuset=None, nano_cpus=None,
        mps=topo.mps,
    )  # fmt: skip


def env_of(b: dict[str, object]) -> dict[str, str]:
    return dict(str(item).split("=", 1) for item in b["Env"])  # type: ignore[attr-defined]


def test_a_share_runs_under_mps_with_its_limits() -> None:
    b = body(share_launch(0.25, gpu_memory_mb=8192), node(MPS))
    env = env_of(b)
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=8192M"  # the one GPU the container sees is device 0
    assert (
        env["CUDA_MPS_PIPE_DIRECTORY"] == "/run/nvidia-mps" and env["CUDA_MPS_LOG_DIRECTORY"] == "/var/log/nvidia-mps"
    )
    assert env["ONEPLUS_GPU_SHARING"] == "mps" and env["ONEPLUS_GPU_MILLI"] == "250"
    host = b["HostConfig"]
    assert host["Binds"] == ["/run/nvidia-mps:/run/nvidia-mps", "/var/log/nvidia-mps:/var/log/nvidia-mps"]  # type: ignore[index]
    assert host["DeviceRequests"][0]["DeviceIDs"] == ["5"]  # type: ignore[index]
    outside = rank_environment(share_launch(0.25, gpu_memory_mb=512), node(MPS), in_container=False)[0]
    assert outside["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "5=512M"


def test_a_small_share_gets_at_least_one_percent_and_no_memory_limit_unless_asked() -> None:
    env = env_of(body(share_launch(0.004), node(MPS)))
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "1" and "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in env


def test_without_mps_a_share_is_time_sliced_and_said_so() -> None:
    b = body(share_launch(0.5, gpu_memory_mb=1024), node(None))
    env = env_of(b)
    assert env["ONEPLUS_GPU_SHARING"] == "time-slice"
    assert not any(k.startswith("CUDA_MPS_") for k in env) and "Binds" not in b["HostConfig"]  # type: ignore[operator]


def test_a_job_cannot_lift_its_own_limits() -> None:
    cmd = share_launch(0.25)
    cmd = cmd.model_copy(
        update={"spec": cmd.spec.model_copy(update={"env": {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100"}})}
    )
    assert env_of(body(cmd, node(MPS)))["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"


def test_executor_mps_flags(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    a = parse_args(["--node", "n", "--simulate", "--mps-pipe-dir", "/run/nvidia-mps"])
    assert a.mps_pipe_dir == "/run/nvidia-mps" and a.mps_log_dir is None
    with pytest.raises(SystemExit):
        parse_args(["--node", "n", "--simulate", "--mps-log-dir", "/var/log/x"])
    assert "--mps-log-dir /var/log/x: a node runs MPS when --mps-pipe-dir names" in capsys.readouterr().err
