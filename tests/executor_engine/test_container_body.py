"""The create body of a rank's container: GPU device request on GPU nodes only, limits, labels, names."""

from __future__ import annotations

import pytest
from executor_engine_support import launch, new_job_id
from oneplus_bus.config import SettingsError
from oneplus_node_executor.runtime.container_spec import (
    container_body,
    container_env,
    container_name,
    identity_from_labels,
    rank_labels,
)
from oneplus_node_executor.runtime.environment import rank_environment


def _body(gpu_node: bool, network_mode: str = "none") -> dict[str, object]:
    cmd = launch("job-1", "node-a", [(3, [2, 3])], world_size=4, memory_mb=2048, labels={"team": "vision"})
    return container_body(
        cmd,
        cmd.ranks[0],
        {"RANK": "3"},
        local_rank=0,
        gpu_node=gpu_node,
        network_mode=network_mode,
        cpuset="0-3",
        nano_cpus=500_000_000,
    )


def test_gpu_node_asks_the_nvidia_driver_for_exactly_the_reserved_gpus() -> None:
    host = _body(gpu_node=True, network_mode="host")["HostConfig"]
    assert isinstance(host, dict)
    assert host["DeviceRequests"] == [{"Driver": "nvidia", "DeviceIDs": ["2", "3"], "Capabilities": [["gpu"]]}]
    assert host["NetworkMode"] == "host"
    assert host["Ulimits"] == [{"Name": "memlock", "Soft": -1, "Hard": -1}]


def test_node_without_gpus_sends_no_device_request() -> None:
    host = _body(gpu_node=False)["HostConfig"]
    assert isinstance(host, dict)
    assert "DeviceRequests" not in host and "Ulimits" not in host
    assert host["NetworkMode"] == "none"


def test_limits_cpuset_env_and_command() -> None:
    body = _body(gpu_node=False)
    host = body["HostConfig"]
    assert isinstance(host, dict)
    assert host["Memory"] == 2048 * 1024 * 1024
    assert host["CpusetCpus"] == "0-3" and host["NanoCpus"] == 500_000_000
    assert host["RestartPolicy"] == {"Name": "no"}
    assert body["Env"] == ["RANK=3"]
    assert body["Cmd"] == ["sh", "-c", "sleep 30"]
    assert body["Image"] == "localhost/busybox:latest"


def test_labels_carry_job_rank_token_and_read_back() -> None:
    cmd = launch(new_job_id(), "node-a", [(5, [0])], world_size=8, token=42, labels={"oneplus.token": "1", "a": "b"})
    labels = rank_labels(cmd, cmd.ranks[0], local_rank=0)
    assert labels["a"] == "b"
    ident = identity_from_labels(labels)
    assert ident is not None
    # A job's own label cannot impersonate the fencing token.
    assert (ident.job_id, ident.rank, ident.token, ident.node) == (cmd.job_id, 5, 42, "node-a")
    assert ident.marker_path == "/tmp/oneplus-checkpoint" and ident.restart_policy == "Never"


def test_foreign_or_damaged_labels_are_not_ours() -> None:
    assert identity_from_labels(None) is None
    assert identity_from_labels({"oneplus.job": "j"}) is None
    assert identity_from_labels({"oneplus.managed": "true", "oneplus.job": "j", "oneplus.rank": "x"}) is None


def test_container_name_is_per_job_rank_and_token_and_engine_safe() -> None:
    assert container_name("job-abc", 3, 7) == "oneplus-job-abc-r3-t7"
    assert container_name("team/job:1", 0, 1) == "oneplus-team_job_1-r0-t1"


def test_gpu_node_container_numbers_cuda_devices_from_zero_whatever_the_executor_passed() -> None:
    cmd = launch(new_job_id(), "node-a", [(0, [4, 6])])
    computed = rank_environment(cmd, None, in_container=True)[0]
    host_numbered = rank_environment(cmd, None)[0] | {"EXTRA": "1"}
    env = container_env(computed, host_numbered, gpu_node=True)
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1" and env["NVIDIA_VISIBLE_DEVICES"] == "4,6"
    assert env["EXTRA"] == "1"
    # Without a device request the container sees the host's GPUs, so the host numbering stays.
    assert container_env(rank_environment(cmd, None)[0], None, gpu_node=False)["CUDA_VISIBLE_DEVICES"] == "4,6"


def test_no_limit_means_no_memory_cap_and_a_limit_caps() -> None:
    """A request reserves, a limit caps (issue 13): without memory_limit_mb the container has no Memory cap."""
    cmd = launch("job-1", "node-a", [(0, [0])], memory_mb=2048)
    uncapped = cmd.model_copy(
        update={
            "spec": cmd.spec.model_copy(
                update={"resources": cmd.spec.resources.model_copy(update={"memory_limit_mb": None, "cpu_limit": None})}
            )
        }
    )
    args = {"local_rank": 0, "gpu_node": False, "network_mode": "none", "cpuset": None, "nano_cpus": None}
    assert "Memory" not in container_body(uncapped, uncapped.ranks[0], {}, **args)["HostConfig"]  # type: ignore[operator]
    host = container_body(cmd, cmd.ranks[0], {}, **args)["HostConfig"]
    assert isinstance(host, dict) and host["Memory"] == 2048 * 1024 * 1024


def test_kubernetes_command_is_the_entrypoint_and_args_the_cmd() -> None:
    args = {"local_rank": 0, "gpu_node": False, "network_mode": "none", "cpuset": None, "nano_cpus": None}
    cmd = launch("job-1", "node-a", [(0, [0])], entrypoint=["python3", "/opt/mnist.py"], command=["--epochs=1"])
    body = container_body(cmd, cmd.ranks[0], {}, **args)
    assert body["Entrypoint"] == ["python3", "/opt/mnist.py"] and body["Cmd"] == ["--epochs=1"]
    cleared = launch("job-1", "node-a", [(0, [0])], entrypoint=[], command=["sh", "-c", "true"])
    assert container_body(cleared, cleared.ranks[0], {}, **args)["Entrypoint"] == [""]
    plain = launch("job-1", "node-a", [(0, [0])])
    assert "Entrypoint" not in container_body(plain, plain.ranks[0], {}, **args)


def test_the_launchers_hostfile_upload_ends_at_the_end_of_archive_blocks() -> None:
    import io
    import tarfile

    from oneplus_node_executor.runtime.docker import _hostfile_tar

    body = _hostfile_tar("10.0.0.1 slots=2\n10.0.0.2 slots=2\n")
    # Two zero blocks close the archive and nothing follows them: Podman's copier stops reading there, and padding
    # still being sent made the upload fail (containers/buildah#6573).
    assert len(body) % 512 == 0 and body[-1024:] == b"\0" * 1024 and body[-1536:-1024] != b"\0" * 512
    with tarfile.open(fileobj=io.BytesIO(body)) as tar:
        assert tar.getnames() == ["etc", "etc/mpi", "etc/mpi/hostfile"]
        member = tar.extractfile("etc/mpi/hostfile")
        assert member is not None and member.read() == b"10.0.0.1 slots=2\n10.0.0.2 slots=2\n"


def _nvlink_body(gpu_node: bool, multi_node_nvlink: bool, imex_channel: int | None = 0) -> dict[str, object]:
    cmd = launch("job-1", "gb200-00", [(0, [0, 1, 2, 3])], world_size=4).model_copy(
        update={"nodes": ["gb200-00", "gb200-01", "gb200-02", "gb200-03"], "multi_node_nvlink": multi_node_nvlink}
    )
    return container_body(
        cmd,
        cmd.ranks[0],
        {"RANK": "0"},
        local_rank=0,
        gpu_node=gpu_node,
        network_mode="host",
        cpuset=None,
        nano_cpus=None,
        imex_channel=imex_channel,
    )


def test_a_job_over_the_trays_of_one_nvlink_domain_gets_the_imex_channel() -> None:
    """NVIDIA's IMEX guide: cross-tray GPU memory needs an IMEX channel in the container; the toolkit injects
    /dev/nvidia-caps-imex-channels/channel<N> for NVIDIA_IMEX_CHANNELS=<N>."""
    body = _nvlink_body(gpu_node=True, multi_node_nvlink=True)
    assert "NVIDIA_IMEX_CHANNELS=0" in body["Env"]  # type: ignore[operator]
    assert _nvlink_body(gpu_node=True, multi_node_nvlink=True, imex_channel=3)["Env"] == [
        "NVIDIA_IMEX_CHANNELS=3",
        "RANK=0",
    ]
    # Not for a job outside a multi-node domain, on a CPU-only node, or where the node has no channel to give.
    assert _nvlink_body(gpu_node=True, multi_node_nvlink=False)["Env"] == ["RANK=0"]
    assert _nvlink_body(gpu_node=False, multi_node_nvlink=True)["Env"] == ["RANK=0"]
    assert _nvlink_body(gpu_node=True, multi_node_nvlink=True, imex_channel=None)["Env"] == ["RANK=0"]


def test_the_executor_reads_its_imex_channel_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from oneplus_node_executor.app import make_runtime
    from oneplus_topology.presets import load_preset

    tray = load_preset("gb200_nvl72_compute_tray_4gpu", "gb200-00")
    monkeypatch.setenv("ONEPLUS_IMEX_CHANNEL", "3")
    assert make_runtime("docker", tray).imex_channel == 3
    monkeypatch.setenv("ONEPLUS_IMEX_CHANNEL", "none")
    assert make_runtime("docker", tray).imex_channel is None
    monkeypatch.setenv("ONEPLUS_IMEX_CHANNEL", "chan0")
    with pytest.raises(SettingsError, match="ONEPLUS_IMEX_CHANNEL='chan0': give a channel number"):
        make_runtime("docker", tray)
