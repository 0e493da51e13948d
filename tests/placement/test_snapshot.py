"""Holdings: apply and release are all-or-nothing, conflicts are refused by name, the fill is seeded."""

from __future__ import annotations

import pytest
from oneplus_contracts import Allocation, NodeRecord, RankPlacement
from oneplus_placement import AllocationConflict, ClusterSnapshot, ClusterState, seeded_fill
from placement_boards import HGX_H100, board, preset_cluster


def alloc(*ranks: tuple[str, list[int], int]) -> Allocation:
    return Allocation(
        ranks=[
            RankPlacement(rank=n, node=node, gpus=gpus, gpu_milli=milli) for n, (node, gpus, milli) in enumerate(ranks)
        ]
    )


def test_apply_then_release_restores_every_free_gpu() -> None:
    state = ClusterState.from_cluster(preset_cluster(HGX_H100, 2))
    a = alloc(("node-00", [0, 1], 0), ("node-01", [7], 0))
    state.apply(a)
    assert state.free_count == [6, 7]
    state.release(a)
    assert state.free_count == [8, 8]
    assert state.cpu_used == [0.0, 0.0]


def test_a_gpu_held_twice_is_refused_and_nothing_is_taken() -> None:
    state = ClusterState.from_cluster(preset_cluster(HGX_H100, 2))
    state.apply(alloc(("node-00", [3], 0)))
    with pytest.raises(AllocationConflict, match=r"GPUs \[3\] on node-00 are already held"):
        state.apply(alloc(("node-01", [0], 0), ("node-00", [2, 3], 0)))
    assert state.free_count == [7, 8]


def test_shares_pack_up_to_one_gpu_and_no_further() -> None:
    state = ClusterState.from_cluster(preset_cluster(HGX_H100, 1))
    state.apply(alloc(("node-00", [0], 600)))
    state.apply(alloc(("node-00", [0], 400)))
    with pytest.raises(AllocationConflict, match="exceed one whole GPU"):
        state.apply(alloc(("node-00", [0], 1)))


def test_a_share_never_joins_a_gpu_held_whole_and_the_reverse() -> None:
    state = ClusterState.from_cluster(preset_cluster(HGX_H100, 1))
    state.apply(alloc(("node-00", [0], 0)))
    with pytest.raises(AllocationConflict, match="held whole"):
        state.apply(alloc(("node-00", [0], 250)))
    state.apply(alloc(("node-00", [1], 250)))
    with pytest.raises(AllocationConflict, match="already held"):
        state.apply(alloc(("node-00", [1], 0)))
    assert state.free_count == [6]


def test_releasing_what_is_not_held_is_refused() -> None:
    state = ClusterState.from_cluster(preset_cluster(HGX_H100, 1))
    with pytest.raises(AllocationConflict, match="not held"):
        state.release(alloc(("node-00", [0], 0)))
    with pytest.raises(AllocationConflict, match="not held"):
        state.release(alloc(("node-00", [0], 250)))


def test_unknown_node_and_unknown_gpu_are_named() -> None:
    state = ClusterState.from_cluster(preset_cluster(HGX_H100, 1))
    with pytest.raises(AllocationConflict, match="node 'ghost' is not in cluster"):
        state.apply(alloc(("ghost", [0], 0)))
    with pytest.raises(ValueError, match="GPU 9 does not exist"):
        state.apply(alloc(("node-00", [9], 0)))


def test_cpu_and_memory_cannot_be_overcommitted() -> None:
    state = ClusterState.from_cluster(preset_cluster(HGX_H100, 1))
    cpus = state.slots[0].cpus
    big = Allocation(ranks=[RankPlacement(rank=0, node="node-00", gpus=[0], cpus=cpus + 1)])
    with pytest.raises(AllocationConflict, match="CPUs asked"):
        state.apply(big)


def test_snapshot_is_not_changed_by_with_allocation() -> None:
    snap = ClusterSnapshot.from_cluster(preset_cluster(HGX_H100, 1))
    after = snap.with_allocation(alloc(("node-00", [0, 1], 0)))
    assert snap.free_count == [8] and after.free_count == [6]
    assert after.without_allocation(alloc(("node-00", [0, 1], 0))).free_count == [8]


def test_cordoned_nodes_and_unhealthy_gpus_are_not_free() -> None:
    records = [
        NodeRecord(topology=board(HGX_H100).model_copy(update={"node": "a"}), cordoned=True),
        NodeRecord(topology=board(HGX_H100).model_copy(update={"node": "b"}), unhealthy_gpus=[2, 5]),
        NodeRecord(topology=board(HGX_H100).model_copy(update={"node": "c"}), status="lost"),
    ]
    snap = ClusterSnapshot.from_records("live", records)
    assert snap.free_count == [0, 6, 0]
    assert snap.usable_gpus() == 6


def test_seeded_fill_is_deterministic_and_reaches_the_percentage() -> None:
    snap = ClusterSnapshot.from_cluster(preset_cluster(HGX_H100, 32))
    a, b, c = seeded_fill(snap, 7, 60), seeded_fill(snap, 7, 60), seeded_fill(snap, 8, 60)
    assert a.free == b.free
    assert a.free != c.free
    assert a.total_free_gpus() == 256 - round(256 * 0.6)
    assert snap.total_free_gpus() == 256


def test_seeded_fill_rejects_a_percentage_outside_0_to_100() -> None:
    snap = ClusterSnapshot.from_cluster(preset_cluster(HGX_H100, 1))
    with pytest.raises(ValueError, match="between 0 and 100"):
        seeded_fill(snap, 1, 120)


def test_duplicate_node_names_are_refused() -> None:
    cluster = preset_cluster(HGX_H100, 2)
    cluster.nodes[1] = cluster.nodes[1].model_copy(update={"node": "node-00"})
    with pytest.raises(ValueError, match="appears twice"):
        ClusterSnapshot.from_cluster(cluster)
