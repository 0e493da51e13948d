"""Across board kinds, bandwidth is compared in GB/s: a gang goes to the fastest kind of board that holds it.

The case from the issue: two 8×V100 hybrid-mesh (DGX-1) nodes, two 4×H100 NV6 nodes and one 4×V100 POWER9 node
(NVLink pairs, SYS between them). Before, `place --gpus 4` returned the POWER9 node (a perfect best fit on its own
board: 13.8 GB/s where the idle H100 quads give 150).
"""

from __future__ import annotations

from oneplus_contracts import JobSpec, NodeTopology
from oneplus_placement import ClusterSnapshot, place_gang
from oneplus_placement.bandwidth import board_shortfall
from placement_boards import DGX1, H100_QUAD, HGX_H100, L40S, board, cluster_of, islands_topo


def power9_quad(node: str = "p9") -> NodeTopology:
    """An AC922-style board: GPU0-GPU1 and GPU2-GPU3 are NV3 pairs, SYS (the X-bus) between the pairs."""
    return islands_topo(4, 2, "NV3", "Tesla V100-SXM2-16GB", node)


def mixed() -> ClusterSnapshot:
    # The POWER9 board alone on the second leaf, the fullest: best fit alone prefers it (the pick).
    boards = [board(DGX1), board(DGX1), board(H100_QUAD), board(H100_QUAD), power9_quad()]
    return ClusterSnapshot.from_cluster(cluster_of(boards, nodes_per_leaf=4))


def four(name: str = "four") -> JobSpec:
    return JobSpec(name=name, resources={"gpus": 4})  # type: ignore[arg-type]


def test_a_four_gpu_gang_goes_to_an_idle_h100_quad_not_the_power9_board() -> None:
    snap = mixed()
    got = place_gang(snap, four())
    assert got.allocation is not None
    nodes = {r.node for r in got.allocation.ranks}
    assert nodes <= {"n002", "n003"}, f"placed on {nodes}, the H100 quads are n002/n003"
    assert got.allocation.score["topology_quality"] == 1.0


def test_board_kinds_are_ranked_by_their_ring_against_the_clusters_best() -> None:
    snap = mixed()
    layout = snap.layout
    h100 = next(s.shape for s in layout.slots if s.name == "n002")
    p9 = next(s.shape for s in layout.slots if s.name == "n004")
    assert board_shortfall(layout, h100, 4) == 0.0
    assert board_shortfall(layout, p9, 4) >= 0.8, "13.8 GB/s against 150 GB/s"
    assert board_shortfall(layout, p9, 1) == 0.0, "a single GPU has no ring: any board will do"


def test_once_the_fast_boards_are_taken_the_next_fastest_kind_is_chosen() -> None:
    snap = mixed()
    first = place_gang(snap, four("a"))
    assert first.allocation is not None
    snap = snap.with_allocation(first.allocation)
    second = place_gang(snap, four("b"))
    assert second.allocation is not None
    snap = snap.with_allocation(second.allocation)
    third = place_gang(snap, four("c"))
    assert third.allocation is not None
    assert {r.node for r in third.allocation.ranks} <= {"n000", "n001"}, "a DGX-1 quad beats the POWER9 pairs"
    assert third.allocation.ring_gbps > 13.8


def generations(nic_gbps_per_gpu: float = 200) -> ClusterSnapshot:
    """Two leaves of two nodes: 8×H100 SXM (NV18) on leaf0, 8×L40S (PCIe) on leaf1."""
    boards = [board(HGX_H100), board(HGX_H100), board(L40S), board(L40S)]
    return ClusterSnapshot.from_cluster(cluster_of(boards, nodes_per_leaf=2, nic_gbps_per_gpu=nic_gbps_per_gpu))


def test_a_one_gpu_job_takes_the_weakest_board_and_leaves_the_nvlink_boards_to_gangs_that_ring() -> None:
    snap = generations()
    one = place_gang(snap, JobSpec(name="one", resources={"gpus": 1}))  # type: ignore[arg-type]
    assert one.allocation is not None and {r.node for r in one.allocation.ranks} <= {"n002", "n003"}, "an L40S"
    eight = place_gang(snap.with_allocation(one.allocation), JobSpec(name="eight", resources={"gpus": 8}))  # type: ignore[arg-type]
    assert eight.allocation is not None and {r.node for r in eight.allocation.ranks} <= {"n000", "n001"}, "an H100"


def test_a_gang_bounded_by_the_network_takes_the_weaker_leaf_unless_the_board_would_bound_it_instead() -> None:
    two_nodes = JobSpec(name="sixteen", ranks=2, resources={"gpus": 8})  # type: ignore[arg-type]
    # 200 Gb/s per GPU is 25 GB/s a hop: an L40S ring (about 14 GB/s) is within half of it, so the H100s stay free.
    got = place_gang(generations(200), two_nodes)
    assert got.allocation is not None and {r.node for r in got.allocation.ranks} == {"n002", "n003"}
    # At 800 Gb/s (100 GB/s a hop) the L40S ring would halve the gang's bandwidth: the H100 leaf is chosen.
    got = place_gang(generations(800), two_nodes)
    assert got.allocation is not None and {r.node for r in got.allocation.ranks} == {"n000", "n001"}


def test_without_keeping_strong_boards_a_one_gpu_job_is_placed_by_best_fit_alone() -> None:
    snap = generations()
    one = JobSpec(name="one", resources={"gpus": 1})  # type: ignore[arg-type]
    got = place_gang(snap, one, keep_strong_boards=False)
    assert got.allocation is not None and got.allocation.ranks[0].node == "n000", "every board ties: node order"
