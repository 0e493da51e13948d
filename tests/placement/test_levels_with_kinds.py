"""Issue 41's level tree and issue 44's rules together, on the two NVL72 racks plus eight H100 boards of
`bench/clusters/nvl72_2rack_h100.yaml`: one GPU model per gang over multi-node NVLink domains, `--nodes` beside TP
groups that span trays, and the explanation of a gang no one model can hold."""

from __future__ import annotations

from pathlib import Path

import pytest
from oneplus_contracts import JobSpec
from oneplus_placement import ClusterSnapshot, PendingGang, place_batch, place_gang
from oneplus_topology.cluster import Cluster, load_cluster

NVL72 = Path(__file__).resolve().parents[2] / "bench" / "clusters" / "nvl72_2rack_h100.yaml"


@pytest.fixture(scope="module")
def cluster() -> Cluster:
    return load_cluster(NVL72)


def spec(ranks: int, gpus: int, **topology: object) -> JobSpec:
    return JobSpec.model_validate({"name": "j", "ranks": ranks, "resources": {"gpus": gpus}, "topology": topology})


def models(cluster: Cluster, nodes: list[str]) -> set[str]:
    return {cluster.node(n).gpu_model for n in nodes}


def test_a_gang_wider_than_one_domain_keeps_to_the_trays_not_the_h100_boards(cluster: Cluster) -> None:
    """80 GPUs: more than one NVL72 domain (72); before the kinds rule, 2 trays and 8 H100 boards were as good."""
    alloc = place_gang(ClusterSnapshot.from_cluster(cluster), spec(20, 4)).allocation
    assert alloc is not None
    assert models(cluster, [r.node for r in alloc.ranks]) == {"GB200"}


def test_tp_segments_are_planned_per_model_and_stay_in_one_domain(cluster: Cluster) -> None:
    alloc = place_gang(ClusterSnapshot.from_cluster(cluster), spec(16, 4, group_gpus=32)).allocation
    assert alloc is not None and alloc.domain == "nvlink"
    for g in range(2):
        assert len({cluster.node(alloc.ranks[r].node).nvlink_domain for r in range(g * 8, g * 8 + 8)}) == 1


def test_nodes_keeps_a_tp_group_on_its_node_instead_of_spanning_trays(cluster: Cluster) -> None:
    """--nodes=1 with a TP group of 8 over two 4-GPU ranks: one node's share, so an H100 board, never two trays."""
    alloc = place_gang(ClusterSnapshot.from_cluster(cluster), spec(2, 4, group_gpus=8, nodes=1)).allocation
    assert alloc is not None
    nodes = {r.node for r in alloc.ranks}
    assert len(nodes) == 1 and models(cluster, list(nodes)) == {"H100"}


def test_nodes_over_trays_takes_exactly_that_many_trays_of_one_domain(cluster: Cluster) -> None:
    alloc = place_gang(ClusterSnapshot.from_cluster(cluster), spec(8, 2, nodes=4)).allocation
    assert alloc is not None
    nodes = {r.node for r in alloc.ranks}
    assert len(nodes) == 4 and len(models(cluster, list(nodes))) == 1


def test_a_gang_no_one_model_holds_says_so_on_the_level_tree(cluster: Cluster) -> None:
    """160 GPUs: 144 GB200 and 64 H100 would hold it together, neither alone."""
    got = place_gang(ClusterSnapshot.from_cluster(cluster), spec(40, 4))
    assert got.allocation is None and got.explanation is not None
    assert got.explanation.constraint == "cluster_size"
    assert "GB200" in got.explanation.message and "H100" in got.explanation.message
    assert place_gang(ClusterSnapshot.from_cluster(cluster), spec(40, 4), mix_gpu_models=True).allocation is not None


def test_batch_placement_keeps_segments_in_one_domain_and_one_model(cluster: Cluster) -> None:
    gangs = [PendingGang(f"g{i}", spec(8, 4, group_gpus=16)) for i in range(3)]
    result = place_batch(ClusterSnapshot.from_cluster(cluster), gangs, time_limit_s=0.5)
    for i in range(3):
        alloc = result.decisions[f"g{i}"].allocation
        assert alloc is not None
        assert models(cluster, [r.node for r in alloc.ranks]) == {"GB200"}
        for g in range(2):
            assert len({cluster.node(alloc.ranks[r].node).nvlink_domain for r in range(g * 4, g * 4 + 4)}) == 1
