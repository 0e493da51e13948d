"""Fragmentation per tier, and the ring model the simulator shares."""

from __future__ import annotations

import pytest
from oneplus_contracts import Allocation, RankPlacement
from oneplus_placement import ClusterSnapshot, allocation_ring_gbps, fragmentation, ideal_ring_gbps
from placement_boards import DGX1, HGX_H100, preset_cluster


def held(node: str, gpus: list[int], cpus: float = 1.0) -> Allocation:
    return Allocation(ranks=[RankPlacement(rank=0, node=node, gpus=gpus, cpus=cpus)])


def test_fragmentation_reports_largest_gang_per_tier_and_stranded_gpus() -> None:
    snap = ClusterSnapshot.from_cluster(preset_cluster(HGX_H100, 4, nodes_per_leaf=2))
    cpus = snap.slots[0].cpus
    snap = snap.with_allocation(held("node-00", [0, 1, 2]))
    snap = snap.with_allocation(held("node-01", [0], cpus=cpus))  # CPUs gone: 7 GPUs stranded
    snap = snap.with_allocation(held("node-02", [0, 1, 2, 3, 4, 5, 6, 7]))
    report = fragmentation(snap)
    assert report.free_gpus == 5 + 7 + 8
    assert report.stranded_gpus == 7
    assert report.tiers["node"].largest_gang_gpus == 8 and report.tiers["node"].best_domain == "node-03"
    assert report.tiers["leaf"].largest_gang_gpus == 8
    assert report.tiers["cluster"].largest_gang_gpus == 13
    assert report.tiers["cluster"].whole_nodes_free == 1
    # node-00's 5 free GPUs cannot serve an 8-GPU gang; node-01's 7 are stranded.
    assert report.frag_pct == pytest.approx(100 * 12 / 20)


def test_an_empty_cluster_is_not_fragmented() -> None:
    report = fragmentation(ClusterSnapshot.from_cluster(preset_cluster(HGX_H100, 4)))
    assert report.frag_pct == 0 and report.stranded_gpus == 0
    assert report.tiers["spine"].largest_gang_gpus == 32
    with pytest.raises(ValueError, match="gang_gpus"):
        fragmentation(ClusterSnapshot.from_cluster(preset_cluster(HGX_H100, 1)), gang_gpus=0)


def test_ring_inside_a_node_is_its_weakest_hop() -> None:
    snap = ClusterSnapshot.from_cluster(preset_cluster(DGX1, 1))
    assert allocation_ring_gbps(snap, held("node-00", [0, 3])) == pytest.approx(50.0)  # NV2
    assert allocation_ring_gbps(snap, held("node-00", [0, 1])) == pytest.approx(25.0)  # NV1
    assert allocation_ring_gbps(snap, held("node-00", [0])) == 0.0


def test_ring_across_leaves_pays_the_oversubscription() -> None:
    cluster = preset_cluster(HGX_H100, 4, nodes_per_leaf=2)
    cluster.fabric.oversubscription = 2.0
    snap = ClusterSnapshot.from_cluster(cluster)
    same_leaf = Allocation(
        ranks=[RankPlacement(rank=0, node="node-00", gpus=[0]), RankPlacement(rank=1, node="node-01", gpus=[0])]
    )
    across = Allocation(
        ranks=[RankPlacement(rank=0, node="node-00", gpus=[0]), RankPlacement(rank=1, node="node-02", gpus=[0])]
    )
    nic = cluster.fabric.nic_gbps_per_gpu / 8
    assert allocation_ring_gbps(snap, same_leaf) == pytest.approx(nic)
    assert allocation_ring_gbps(snap, across) == pytest.approx(nic / 2)
    assert ideal_ring_gbps(cluster, 16, 8) == pytest.approx(nic)
    assert ideal_ring_gbps(cluster, 8, 8) == pytest.approx(450.0)
    assert ideal_ring_gbps(cluster, 40, 8) == pytest.approx(nic / 2)  # five nodes cannot share a leaf of two
