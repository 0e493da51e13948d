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


def test_a_mig_profile_no_node_offers_is_refused_with_the_profiles_there_are() -> None:
    from pathlib import Path

    from oneplus_topology.mig import apply_gpu_listing, parse_gpu_listing

    listing = Path(__file__).resolve().parents[2] / "data/topologies/dgx_a100_8gpu_mig_smi_L.txt"
    a100 = NODES[2].topology
    split = NodeRecord(topology=apply_gpu_listing(a100, parse_gpu_listing(listing.read_text(encoding="utf-8"))))
    nodes = [*NODES[:2], split, NODES[3]]

    def mig(profile: str, ranks: int = 1) -> JobSpec:
        return JobSpec.model_validate({"name": "m", "ranks": ranks, "resources": {"mig": profile}})

    with pytest.raises(Inadmissible) as e:
        admit(mig("7g.80gb"), default_config(), nodes, EmptyCluster())
    assert str(e.value) == (
        "mig='7g.80gb': no node offers MIG instances of that profile; "
        "the cluster has 1g.10gb x2, 2g.20gb x1, 3g.40gb x3"
    )
    with pytest.raises(Inadmissible, match="no GPU is in MIG mode"):
        admit(mig("3g.40gb"), default_config(), NODES, EmptyCluster())
    with pytest.raises(Inadmissible, match=r"4 ranks of mig='3g\.40gb' need 4 instances; the cluster has 3"):
        admit(mig("3g.40gb", 4), default_config(), nodes, EmptyCluster())
    admit(mig("3g.40gb", 3), default_config(), nodes, EmptyCluster())


def test_a_share_is_refused_when_no_node_runs_mps_unless_its_queue_time_slices() -> None:
    share = JobSpec.model_validate({"name": "s", "resources": {"gpus": 0.5}})
    with pytest.raises(Inadmissible) as e:
        admit(share, default_config(), NODES, EmptyCluster())
    assert str(e.value) == (
        "gpus=0.5 is a GPU share, which runs isolated under MPS, and no node runs MPS; ask whole GPUs, "
        "or use a queue with sharing: time-slice (queue 'default' has sharing: mps)"
    )
    admit(share, load_queue_config("queues: [{name: default, sharing: time-slice}]\n"), NODES, EmptyCluster())
    from oneplus_contracts import MpsDaemon

    with_mps = [*NODES[:3], NodeRecord(topology=NODES[3].topology.model_copy(update={"mps": MpsDaemon()}))]
    admit(share, default_config(), with_mps, EmptyCluster())
    cpu_only = JobSpec.model_validate({"name": "c", "resources": {"gpus": 0.001}})
    admit(cpu_only, default_config(), NODES, EmptyCluster())
