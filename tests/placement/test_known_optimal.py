"""Cases whose best placement is known: each test names the behaviour it guards."""

from __future__ import annotations

from oneplus_contracts import Allocation, JobSpec, RankPlacement
from oneplus_placement import ClusterSnapshot, place_gang
from placement_boards import (
    DGX1,
    HGX_H100,
    L40S,
    PCIE_SWITCHES,
    board,
    cluster_of,
    preset_cluster,
    two_islands_topo,
)


def job(gpus: int, per_rank: int | None = None, **topology: object) -> JobSpec:
    k = per_rank or gpus
    return JobSpec(name="j", ranks=gpus // k, resources={"gpus": k}, topology=topology)  # type: ignore[arg-type]


def held(node: str, gpus: list[int]) -> Allocation:
    return Allocation(ranks=[RankPlacement(rank=0, node=node, gpus=gpus)])


def only_rank(snapshot: ClusterSnapshot, spec: JobSpec) -> tuple[str, list[int]]:
    result = place_gang(snapshot, spec)
    assert result.allocation is not None, result.explanation
    (rank,) = result.allocation.ranks
    return rank.node, rank.gpus


def test_four_gpu_rank_on_hybrid_cube_mesh_gets_a_fully_nvlinked_quad() -> None:
    snap = ClusterSnapshot.from_cluster(preset_cluster(DGX1, 1))
    _, gpus = only_rank(snap, job(4))
    assert sorted(gpus) in ([0, 1, 2, 3], [4, 5, 6, 7])


def test_four_gpu_rank_on_hybrid_cube_mesh_avoids_a_nvlinked_ring_that_is_not_a_quad() -> None:
    # 0,1,4,5 form an NVLink ring (0-1, 1-5, 5-4, 4-0) but 0-5 and 1-4 are SYS; the intact quad 4-7 must win.
    snap = ClusterSnapshot.from_cluster(preset_cluster(DGX1, 1)).with_allocation(held("node-00", [2, 3]))
    _, gpus = only_rank(snap, job(4))
    assert sorted(gpus) == [4, 5, 6, 7]


def test_two_gpu_rank_on_hybrid_cube_mesh_gets_an_nv2_pair() -> None:
    topo = board(DGX1)
    snap = ClusterSnapshot.from_cluster(preset_cluster(DGX1, 1))
    _, gpus = only_rank(snap, job(2))
    link = next(lk for lk in topo.links if {lk.a, lk.b} == set(gpus))
    assert link.kind == "NV2"


def test_two_gpu_rank_on_hybrid_cube_mesh_prefers_the_nv2_pair_over_an_nv1_pair_left_free() -> None:
    # Free: 0,1,2 (0-1 NV1, 0-2 NV1, 1-2 NV2) and 4..7; the NV2 pair 1-2 is the tightest fragment that fits.
    snap = ClusterSnapshot.from_cluster(preset_cluster(DGX1, 1)).with_allocation(held("node-00", [3]))
    _, gpus = only_rank(snap, job(2))
    assert sorted(gpus) == [1, 2]


def test_l40s_pair_stays_on_one_socket() -> None:
    # Leave one GPU free on socket 0 and all four on socket 1: the pair must not straddle the sockets.
    snap = ClusterSnapshot.from_cluster(preset_cluster(L40S, 1)).with_allocation(held("node-00", [0, 1, 2]))
    _, gpus = only_rank(snap, job(2))
    assert all(g >= 4 for g in gpus)


def test_l40s_pair_fills_a_broken_socket_before_an_intact_one() -> None:
    snap = ClusterSnapshot.from_cluster(preset_cluster(L40S, 1)).with_allocation(held("node-00", [0, 1]))
    _, gpus = only_rank(snap, job(2))
    assert sorted(gpus) == [2, 3]


def test_pcie_pair_stays_under_one_pcie_switch() -> None:
    # Free 1 (switch A), 2,3 (switch B), 4..7: the PIX pair 2-3 beats any PXB or SYS pair.
    snap = ClusterSnapshot.from_cluster(preset_cluster(PCIE_SWITCHES, 1)).with_allocation(held("node-00", [0]))
    _, gpus = only_rank(snap, job(2))
    assert sorted(gpus) == [2, 3]


def test_two_node_job_does_not_split_across_leaves_when_one_leaf_fits() -> None:
    # leaf0: node-00 and node-01 half used, node-02 and node-03 whole; leaf1 whole. Nodes are in order, so a
    # naive first-fit would take node-02 and node-04? No: it must be two whole nodes of one leaf.
    cluster = preset_cluster(HGX_H100, 8, nodes_per_leaf=4)
    snap = ClusterSnapshot.from_cluster(cluster)
    for n in ("node-00", "node-01", "node-02"):
        snap = snap.with_allocation(held(n, [0, 1, 2, 3]))
    result = place_gang(snap, job(16, 8))
    assert result.allocation is not None
    leaves = {cluster.leaf_of(r.node) for r in result.allocation.ranks}
    assert leaves == {"leaf1"}
    assert result.allocation.domain == "leaf"


def test_multi_node_job_prefers_the_fuller_leaf_and_keeps_an_empty_leaf_free() -> None:
    cluster = preset_cluster(HGX_H100, 8, nodes_per_leaf=4)
    snap = ClusterSnapshot.from_cluster(cluster).with_allocation(held("node-00", [0, 1, 2, 3, 4, 5, 6, 7]))
    result = place_gang(snap, job(16, 8))
    assert result.allocation is not None
    assert {cluster.leaf_of(r.node) for r in result.allocation.ranks} == {"leaf0"}


def test_one_gpu_job_does_not_break_the_only_whole_free_node() -> None:
    cluster = preset_cluster(HGX_H100, 3)
    snap = ClusterSnapshot.from_cluster(cluster)
    snap = snap.with_allocation(held("node-00", [0, 1, 2, 3, 4, 5]))
    snap = snap.with_allocation(held("node-01", [0, 1, 2]))
    node, _ = only_rank(snap, job(1))
    assert node == "node-00"  # the tightest fragment; node-02 stays whole


def test_single_node_gang_prefers_one_node_over_a_leaf() -> None:
    snap = ClusterSnapshot.from_cluster(preset_cluster(HGX_H100, 4))
    result = place_gang(snap, job(8, 2))
    assert result.allocation is not None
    assert result.allocation.domain == "node"
    assert len(result.allocation.nodes) == 1


def test_multi_node_ranks_line_up_on_the_same_nic_rails() -> None:
    # node-00 has GPUs 4-7 free, node-01 is whole: the second node's rank must use rails of GPUs 4-7 too.
    cluster = preset_cluster(HGX_H100, 2)
    snap = ClusterSnapshot.from_cluster(cluster).with_allocation(held("node-00", [0, 1, 2, 3]))
    snap = snap.with_allocation(held("node-01", [0, 1]))
    result = place_gang(snap, job(8, 4))
    assert result.allocation is not None
    by_node = {r.node: sorted(r.gpus) for r in result.allocation.ranks}
    assert by_node == {"node-00": [4, 5, 6, 7], "node-01": [4, 5, 6, 7]}


def test_tp8_on_a_board_of_two_nvlink_islands_is_refused_with_a_clear_reason() -> None:
    snap = ClusterSnapshot.from_cluster(cluster_of([two_islands_topo()] * 2))
    result = place_gang(snap, job(8, 8, group_gpus=8))
    assert result.allocation is None and result.explanation is not None
    assert result.explanation.constraint == "nvlink_domain"
    assert "tensor-parallel group of 8 GPUs" in result.explanation.message
    assert "largest NVLink domain here has 4 GPUs" in result.explanation.message


def test_tp4_groups_on_two_nvlink_islands_each_sit_inside_one_island() -> None:
    snap = ClusterSnapshot.from_cluster(cluster_of([two_islands_topo()]))
    snap = snap.with_allocation(held("n000", [0, 4]))
    # Six free GPUs (3 per island) cannot hold two TP-4 groups, and one rank of 8 cannot fit at all.
    assert place_gang(snap, job(8, 4, group_gpus=4)).allocation is None
    fresh = ClusterSnapshot.from_cluster(cluster_of([two_islands_topo()]))
    result = place_gang(fresh, job(8, 8, group_gpus=4))
    assert result.allocation is not None
    gpus = result.allocation.ranks[0].gpus
    assert {g // 4 for g in gpus[:4]} == {gpus[0] // 4} and {g // 4 for g in gpus[4:]} == {gpus[4] // 4}


def test_tp_group_spanning_two_ranks_keeps_both_ranks_on_one_nvlink_domain() -> None:
    snap = ClusterSnapshot.from_cluster(cluster_of([two_islands_topo()] * 2))
    result = place_gang(snap, job(8, 2, group_gpus=4))
    assert result.allocation is not None
    ranks = result.allocation.ranks
    for a, b in ((ranks[0], ranks[1]), (ranks[2], ranks[3])):
        assert a.node == b.node
        assert len({g // 4 for g in a.gpus + b.gpus}) == 1
