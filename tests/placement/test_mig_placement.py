"""MIG instances as placement units: one free instance of the profile a rank, never a whole GPU of a MIG board."""

from __future__ import annotations

from pathlib import Path

import pytest
from oneplus_contracts import Allocation, JobSpec, NodeRecord, NodeTopology, RankPlacement
from oneplus_placement import AllocationConflict, ClusterSnapshot
from oneplus_placement.greedy import place_gang
from oneplus_placement.mig import cluster_profiles
from oneplus_topology.mig import apply_gpu_listing, parse_gpu_listing
from oneplus_topology.presets import load_preset
from pydantic import ValidationError

LISTING = Path(__file__).resolve().parents[2] / "data" / "topologies" / "dgx_a100_8gpu_mig_smi_L.txt"


def mig_a100(name: str) -> NodeTopology:
    topo = load_preset("dgx_a100_8gpu_nv12_12nic", name).model_copy(update={"leaf": "l0", "spine": "s0"})
    return apply_gpu_listing(topo, parse_gpu_listing(LISTING.read_text(encoding="utf-8")))


def snapshot() -> ClusterSnapshot:
    h100 = load_preset("h100_sxm_8gpu_nvswitch_nv18", "h100-0").model_copy(update={"leaf": "l0", "spine": "s0"})
    return ClusterSnapshot.from_records("c", [NodeRecord(topology=mig_a100("a100-0")), NodeRecord(topology=h100)])


def mig_job(ranks: int, profile: str = "3g.40gb", **extra: object) -> JobSpec:
    return JobSpec.model_validate({"name": "m", "ranks": ranks, "resources": {"mig": profile}, **extra})


def test_each_rank_gets_one_free_instance_of_its_profile() -> None:
    snap = snapshot()
    got = place_gang(snap, mig_job(3)).allocation
    assert got is not None
    assert [(r.node, r.gpus) for r in got.ranks] == [("a100-0", [])] * 3
    assert [r.mig for r in got.ranks] == [
        ["MIG-0c4e8f6d-2a5b-5d3e-9f1c-7b2a4d6e8f01"],
        ["MIG-4a8c2d0b-6e9f-5b7c-d350-bf6e8b0c2d45"],
        ["MIG-5b9d3e1c-7f0a-5c8d-e461-c07f9c1d3e56"],
    ]
    held = snap.with_allocation(got)
    more = place_gang(held, mig_job(1))
    assert not more.placed and more.explanation is not None
    assert (
        more.explanation.message
        == "1 ranks need 1 free MIG 3g.40gb instances in the cluster; 0 are free, at most 0 usable on a100-0"
    )
    # Other profiles of the same GPUs are still offered; releasing gives the instances back.
    assert place_gang(held, mig_job(2, "1g.10gb")).placed
    assert place_gang(held.without_allocation(got), mig_job(3)).placed


def test_gpus_split_into_instances_are_never_offered_whole() -> None:
    snap = snapshot()
    a100 = snap.layout.index("a100-0")
    assert snap.free_count[a100] == 6  # GPUs 0 and 1 are MIG boards
    whole = JobSpec.model_validate({"name": "w", "resources": {"gpus": 8, "gpu_models": ["A100"]}})
    assert not place_gang(snap, whole).placed
    share = JobSpec.model_validate({"name": "s", "ranks": 7, "resources": {"gpus": 0.5, "gpu_models": ["A100"]}})
    got = place_gang(snap, share).allocation
    assert got is not None and all(g >= 2 for r in got.ranks for g in r.gpus)


def test_an_instance_held_twice_is_refused_and_nothing_taken() -> None:
    state = snapshot().thaw()
    uuid = "MIG-0c4e8f6d-2a5b-5d3e-9f1c-7b2a4d6e8f01"
    one = Allocation(ranks=[RankPlacement(rank=0, node="a100-0", gpus=[], mig=[uuid])])
    state.apply(one)
    with pytest.raises(AllocationConflict, match=f"MIG instance {uuid} on a100-0 is already held"):
        state.apply(one)
    with pytest.raises(AllocationConflict, match="MIG-nope is not a MIG instance of a healthy GPU of h100-0"):
        state.apply(Allocation(ranks=[RankPlacement(rank=0, node="h100-0", gpus=[], mig=["MIG-nope"])]))
    state.release(one)
    with pytest.raises(AllocationConflict, match="is not held"):
        state.release(one)


def test_one_node_required_and_profiles_of_the_cluster() -> None:
    snap = snapshot()
    assert cluster_profiles(s.topology for s in snap.layout.slots) == {"3g.40gb": 3, "2g.20gb": 1, "1g.10gb": 2}
    spec = mig_job(4, "3g.40gb", topology={"domain": "node", "mode": "required"})
    got = place_gang(snap, spec)
    assert not got.placed and got.explanation is not None and "in one node; 3 are free" in got.explanation.message


@pytest.mark.parametrize(
    ("resources", "topology", "message"),
    [
        ({"mig": "3g.40gb", "gpus": 1}, {}, "mig='3g.40gb' together with gpus=1: a rank asks one MIG instance or GPUs"),
        ({"mig": "3g40"}, {}, "mig='3g40' is not a MIG profile name"),
        ({"mig": "1g.10gb"}, {"group_gpus": 2}, "MIG instances have no NVLink between them"),
    ],
)
def test_bad_mig_requests_are_refused_by_name(resources: dict, topology: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        JobSpec.model_validate({"name": "m", "ranks": 2, "resources": resources, "topology": topology})


def test_a_mig_spec_round_trips_without_gpus() -> None:
    spec = mig_job(2)
    again = JobSpec.model_validate_json(spec.model_dump_json())
    assert again.resources.mig == "3g.40gb" and "gpus" not in spec.model_dump()["resources"]
