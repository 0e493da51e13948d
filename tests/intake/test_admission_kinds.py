"""A gang no one GPU model could ever hold is refused at submission, unless its queue lets it mix models."""

from __future__ import annotations

import pytest
from oneplus_contracts import JobSpec, NodeRecord
from oneplus_intake.admission import EmptyCluster, Inadmissible, admit
from oneplus_queueing.config import default_config, load_queue_config
from oneplus_topology.presets import load_preset


def node(name: str, preset: str) -> NodeRecord:
    topo = load_preset(preset, name).model_copy(update={"leaf": "l0", "spine": "s0"})
    return NodeRecord(topology=topo)  # type: ignore[arg-type]


# The demo cluster: two H100 boards, an A100 board, an L40S box.
NODES = [
    node("h100-0", "h100_sxm_8gpu_nvswitch_nv18"),
    node("h100-1", "h100_sxm_8gpu_nvswitch_nv18"),
    node("a100-0", "dgx_a100_8gpu_nv12_12nic"),
    node("l40s-0", "l40s_8gpu_pcie_node_sys"),
]


def three_boards() -> JobSpec:
    return JobSpec.model_validate({"name": "t", "ranks": 3, "resources": {"gpus": 8}})


def test_three_whole_boards_of_one_model_can_never_run_here() -> None:
    with pytest.raises(Inadmissible, match="no GPU model has enough nodes even when idle"):
        admit(three_boards(), default_config(), NODES, EmptyCluster())


def test_a_queue_that_mixes_models_admits_it() -> None:
    config = load_queue_config("queues: [{name: default, mix_gpu_models: true}]\n")
    admit(three_boards(), config, NODES, EmptyCluster())


def test_a_job_that_lists_several_models_is_admitted() -> None:
    spec = JobSpec.model_validate({"name": "t", "ranks": 3, "resources": {"gpus": 8, "gpu_models": ["H100", "A100"]}})
    admit(spec, default_config(), NODES, EmptyCluster())
