"""A MIG rank's container is handed exactly its instances: by UUID in the device request and the NVIDIA variables."""

from __future__ import annotations

from pathlib import Path

import pytest
from oneplus_contracts import JobSpec, LaunchRanks, NodeTopology, RankPlacement
from oneplus_node_executor.runtime.container_spec import container_body
from oneplus_node_executor.runtime.environment import rank_environment
from oneplus_topology.mig import apply_gpu_listing, parse_gpu_listing
from oneplus_topology.presets import load_preset

LISTING = Path(__file__).resolve().parents[2] / "data" / "topologies" / "dgx_a100_8gpu_mig_smi_L.txt"
GPU0_3G = "MIG-0c4e8f6d-2a5b-5d3e-9f1c-7b2a4d6e8f01"
GPU1_3G = "MIG-4a8c2d0b-6e9f-5b7c-d350-bf6e8b0c2d45"


def topo() -> NodeTopology:
    base = load_preset("dgx_a100_8gpu_nv12_12nic", "a100-0")
    return apply_gpu_listing(base, parse_gpu_listing(LISTING.read_text(encoding="utf-8")))


def mig_launch(uuids: list[str]) -> LaunchRanks:
    spec = JobSpec.model_validate(
        {"name": "m", "ranks": len(uuids), "resources": {"mig": "3g.40gb"}, "image": "localhost/busybox:latest"}
    )
    ranks = [RankPlacement(rank=r, node="a100-0", gpus=[], mig=[u]) for r, u in enumerate(uuids)]
    return LaunchRanks(
        job_id="job-m", node="a100-0", token=1, spec=spec, ranks=ranks, world_size=len(uuids), node_rank=0,
        nodes=["a100-0"], master_addr="10.0.0.1", master_port=29511,
    )  # fmt: skip


def test_each_rank_sees_only_its_instance() -> None:
    cmd = mig_launch([GPU0_3G, GPU1_3G])
    inside = rank_environment(cmd, topo(), in_container=True)
    assert inside[0]["NVIDIA_VISIBLE_DEVICES"] == GPU0_3G and inside[0]["CUDA_VISIBLE_DEVICES"] == "0"
    assert inside[1]["NVIDIA_VISIBLE_DEVICES"] == GPU1_3G and inside[1]["CUDA_VISIBLE_DEVICES"] == "0"
    outside = rank_environment(cmd, topo(), in_container=False)
    assert outside[1]["CUDA_VISIBLE_DEVICES"] == GPU1_3G  # CUDA takes a MIG UUID as a device name


def test_device_request_names_the_instances_by_uuid() -> None:
    cmd = mig_launch([GPU1_3G])
    env = rank_environment(cmd, topo(), in_container=True)[0]
    body = container_body(
        cmd, cmd.ranks[0], env, local_rank=0, gpu_node=True, network_mode="host", cpuset=None, nano_cpus=None
    )
    host = body["HostConfig"]
    assert host["DeviceRequests"] == [{"Driver": "nvidia", "DeviceIDs": [GPU1_3G], "Capabilities": [["gpu"]]}]
    assert f"NVIDIA_VISIBLE_DEVICES={GPU1_3G}" in body["Env"]


def test_an_instance_the_node_does_not_have_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"asks for MIG instance\(s\) \['MIG-gone'\] that node a100-0 does not have"):
        rank_environment(mig_launch(["MIG-gone"]), topo())
