"""rank_environment on real topologies: GPUs, rendezvous, identity and the NCCL rail hints of each local rank."""

from __future__ import annotations

import pytest
from executor_engine_support import launch, new_job_id, real_topology
from oneplus_node_executor.runtime.environment import (
    DEFAULT_CHECKPOINT_MARKER,
    PLATFORM_KEYS,
    rail_nics,
    rank_environment,
)


def test_dgx_a100_ranks_get_their_gpus_rendezvous_and_rail_nics() -> None:
    topo = real_topology("dgx_a100_8gpu_nv12_12nic.txt")
    cmd = launch(new_job_id(), "node-a", [(9, [6, 7]), (8, [0, 1])], world_size=16)
    env = rank_environment(cmd, topo)
    assert set(env) == {8, 9}
    first, second = env[8], env[9]
    assert first["CUDA_VISIBLE_DEVICES"] == "0,1" and second["CUDA_VISIBLE_DEVICES"] == "6,7"
    assert second["NVIDIA_VISIBLE_DEVICES"] == "6,7"
    # LOCAL_RANK follows the global rank order, not the order of the command's list.
    assert (first["RANK"], first["LOCAL_RANK"], second["RANK"], second["LOCAL_RANK"]) == ("8", "0", "9", "1")
    assert first["WORLD_SIZE"] == "16" and first["LOCAL_WORLD_SIZE"] == "2"
    assert (first["MASTER_ADDR"], first["MASTER_PORT"], first["NODE_RANK"]) == ("10.0.0.1", "29511", "0")
    # GPU0/1 sit at PXB from mlx5_0/1; '=' keeps NCCL from also matching the storage NICs mlx5_10/11 by prefix.
    assert first["NCCL_IB_HCA"] == "=mlx5_0,mlx5_1"
    assert second["NCCL_IB_HCA"] == "=mlx5_8,mlx5_9"
    assert first["ONEPLUS_JOB_ID"] == cmd.job_id and first["ONEPLUS_TOKEN"] == "1"
    assert first["ONEPLUS_CHECKPOINT_MARKER"] == DEFAULT_CHECKPOINT_MARKER
    assert first["ONEPLUS_CHECKPOINT_SIGNAL"] == "SIGUSR1"
    assert "ONEPLUS_RESUME" not in first


def test_a800_rails_follow_the_pix_nics_and_a_gpu_without_one_gets_no_hint() -> None:
    topo = real_topology("a800_8gpu_nvswitch_nv8_4nic.txt")
    cmd = launch(new_job_id(), "node-a", [(0, [0]), (1, [1]), (2, [7])], world_size=3)
    env = rank_environment(cmd, topo)
    assert "NCCL_IB_HCA" not in env[0]  # GPU0 is only NODE-near to NIC0/NIC1
    assert env[1]["NCCL_IB_HCA"] == "=mlx5_0"
    assert env[2]["NCCL_IB_HCA"] == "=mlx5_2,mlx5_3"


@pytest.mark.parametrize("name", ["h100_sxm_8gpu_nvswitch_nv18.txt", "gb200_nvl72_compute_tray_4gpu.txt"])
def test_topologies_without_rail_nics_leave_the_choice_to_nccl(name: str) -> None:
    topo = real_topology(name)
    assert rail_nics(topo, [0, 1]) == []
    env = rank_environment(launch(new_job_id(), "node-a", [(0, [0, 1])]), topo)
    assert "NCCL_IB_HCA" not in env[0]


def test_inside_a_container_cuda_numbers_the_exposed_gpus_from_zero() -> None:
    topo = real_topology("dgx_a100_8gpu_nv12_12nic.txt")
    env = rank_environment(launch(new_job_id(), "node-a", [(0, [4, 5])]), topo, in_container=True)
    assert env[0]["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert env[0]["NVIDIA_VISIBLE_DEVICES"] == "4,5"


def test_job_env_is_kept_but_cannot_override_the_platform() -> None:
    cmd = launch(
        new_job_id(),
        "node-a",
        [(1, [2])],
        world_size=2,
        env={"RANK": "7", "NCCL_IB_HCA": "=mlx5_4", "MY_FLAG": "on"},
    )
    env = rank_environment(cmd, real_topology("dgx_a100_8gpu_nv12_12nic.txt"))[1]
    assert env["RANK"] == "1"
    assert env["NCCL_IB_HCA"] == "=mlx5_4"  # a hint, so the job's own choice wins
    assert env["MY_FLAG"] == "on"
    assert set(env) - {"MY_FLAG", "NCCL_IB_HCA"} <= PLATFORM_KEYS


def test_resume_and_checkpoint_marker_reach_the_ranks() -> None:
    cmd = launch(new_job_id(), "node-a", [(0, [0])], checkpoint={"marker_path": "/ckpt/done", "signal": "usr2"})
    cmd.resume_from_checkpoint_ts = 1700000000.5
    env = rank_environment(cmd, None)[0]
    assert env["ONEPLUS_RESUME"] == "1"
    assert float(env["ONEPLUS_RESUME_FROM_CHECKPOINT_TS"]) == 1700000000.5
    assert env["ONEPLUS_CHECKPOINT_MARKER"] == "/ckpt/done"
    assert env["ONEPLUS_CHECKPOINT_SIGNAL"] == "SIGUSR2"


def test_a_gpu_share_is_announced() -> None:
    cmd = launch(new_job_id(), "node-a", [(0, [3])])
    cmd.ranks[0].gpu_milli = 250
    env = rank_environment(cmd, None)[0]
    assert env["ONEPLUS_GPU_MILLI"] == "250" and env["CUDA_VISIBLE_DEVICES"] == "3"


def test_rank_placed_on_another_node_is_refused() -> None:
    cmd = launch(new_job_id(), "node-a", [(0, [0])])
    cmd.ranks[0].node = "node-b"
    with pytest.raises(ValueError, match=r"rank 0 of job .* is placed on node-b, not on node-a"):
        rank_environment(cmd, None)


def test_gpu_the_node_does_not_have_is_refused() -> None:
    cmd = launch(new_job_id(), "node-a", [(0, [3, 4])])
    with pytest.raises(ValueError, match=r"asks for GPU\(s\) \[4\], node node-a has \[0, 1, 2, 3\]"):
        rank_environment(cmd, real_topology("gb200_nvl72_compute_tray_4gpu.txt"))


def test_rank_outside_the_world_is_refused() -> None:
    with pytest.raises(ValueError, match="outside world_size=2"):
        rank_environment(launch(new_job_id(), "node-a", [(2, [0])], world_size=2), None)


def test_duplicate_rank_is_refused() -> None:
    with pytest.raises(ValueError, match=r"rank 0 of job .* appears twice"):
        rank_environment(launch(new_job_id(), "node-a", [(0, [0]), (0, [1])], world_size=2), None)


def test_node_rank_must_name_this_node() -> None:
    cmd = launch(new_job_id(), "node-a", [(0, [0])])
    cmd.nodes = ["node-b", "node-a"]
    with pytest.raises(ValueError, match="node_rank=0 names node-b, but this launch is for node-a"):
        rank_environment(cmd, None)
    cmd.node_rank = 5
    with pytest.raises(ValueError, match="node_rank=5 is outside the job's 2 node"):
        rank_environment(cmd, None)
