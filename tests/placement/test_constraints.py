"""Shares, GPU models, CPU and memory, required domains, leaf limits and exclusive nodes."""

from __future__ import annotations

from oneplus_contracts import Allocation, JobSpec, RankPlacement
from oneplus_placement import ClusterSnapshot, ClusterState, PendingGang, place_batch, place_gang
from placement_boards import HGX_H100, L40S, board, cluster_of, preset_cluster


def spec(ranks: int, gpus: float, **kw: object) -> JobSpec:
    topology = kw.pop("topology", {})
    resources = {"gpus": gpus, **kw}
    return JobSpec(name="j", ranks=ranks, resources=resources, topology=topology)  # type: ignore[arg-type]


def held(node: str, gpus: list[int], milli: int = 0) -> Allocation:
    return Allocation(ranks=[RankPlacement(rank=0, node=node, gpus=gpus, gpu_milli=milli)])


def test_quarter_gpu_ranks_pack_onto_one_gpu() -> None:
    snap = ClusterSnapshot.from_cluster(preset_cluster(HGX_H100, 2))
    result = place_gang(snap, spec(4, 0.25))
    assert result.allocation is not None
    assert {(r.node, tuple(r.gpus)) for r in result.allocation.ranks} == {("node-00", (0,))}
    assert all(r.gpu_milli == 250 for r in result.allocation.ranks)
    state = snap.mutable_copy()
    state.apply(result.allocation)
    assert state.free_count == [7, 8]


def test_a_share_joins_the_fullest_shared_gpu_before_opening_a_whole_one() -> None:
    snap = ClusterSnapshot.from_cluster(preset_cluster(HGX_H100, 2))
    snap = snap.with_allocation(held("node-01", [5], 500)).with_allocation(held("node-01", [6], 700))
    result = place_gang(snap, spec(1, 0.3))
    assert result.allocation is not None
    (rank,) = result.allocation.ranks
    assert (rank.node, rank.gpus) == ("node-01", [6])


def test_shares_never_land_on_a_gpu_held_whole_and_whole_jobs_avoid_shared_gpus() -> None:
    snap = ClusterSnapshot.from_cluster(preset_cluster(HGX_H100, 1))
    snap = snap.with_allocation(held("node-00", [0, 1, 2, 3, 4, 5, 6]))
    share = place_gang(snap, spec(1, 0.5))
    assert share.allocation is not None and share.allocation.ranks[0].gpus == [7]
    snap = snap.with_allocation(share.allocation)
    assert place_gang(snap, spec(1, 1)).allocation is None
    assert place_gang(snap, spec(1, 0.5)).allocation is not None


def test_gpu_model_restriction_picks_only_matching_nodes() -> None:
    snap = ClusterSnapshot.from_cluster(cluster_of([board(L40S), board(HGX_H100)]))
    result = place_gang(snap, spec(1, 2, gpu_models=["H100"]))
    assert result.allocation is not None and result.allocation.nodes == ["n001"]
    l40s = place_gang(snap, spec(1, 2, gpu_models=["l40s"]))
    assert l40s.allocation is not None and l40s.allocation.nodes == ["n000"]


def test_unknown_gpu_model_is_refused_naming_the_models_present() -> None:
    snap = ClusterSnapshot.from_cluster(cluster_of([board(L40S)]))
    result = place_gang(snap, spec(1, 1, gpu_models=["B200"]))
    assert result.explanation is not None and result.explanation.constraint == "gpu_model"
    assert "B200" in result.explanation.message and "L40S" in result.explanation.message


def test_cpu_bound_rank_moves_to_a_node_with_cpus_left() -> None:
    snap = ClusterSnapshot.from_cluster(preset_cluster(HGX_H100, 2))
    cpus = snap.slots[0].cpus
    hog = Allocation(ranks=[RankPlacement(rank=0, node="node-00", gpus=[0], cpus=cpus - 2)])
    snap = snap.with_allocation(hog)
    result = place_gang(snap, spec(1, 1, cpus=8))
    assert result.allocation is not None and result.allocation.nodes == ["node-01"]


def test_rank_needing_more_memory_than_any_node_is_refused_at_request_level() -> None:
    snap = ClusterSnapshot.from_cluster(preset_cluster(HGX_H100, 1))
    result = place_gang(snap, spec(1, 1, memory_mb=16 * 1024 * 1024))
    assert result.explanation is not None and result.explanation.constraint == "memory"


def test_rank_bigger_than_any_node_is_refused() -> None:
    snap = ClusterSnapshot.from_cluster(preset_cluster(HGX_H100, 4))
    result = place_gang(snap, spec(1, 16))
    assert result.explanation is not None and result.explanation.constraint == "rank_size"
    assert "needs 16 GPUs on one node" in result.explanation.message


def test_required_leaf_refuses_to_spread_and_says_which_leaf_came_closest() -> None:
    cluster = preset_cluster(HGX_H100, 8, nodes_per_leaf=2)
    snap = ClusterSnapshot.from_cluster(cluster)
    snap = snap.with_allocation(held("node-00", [0, 1, 2, 3])).with_allocation(held("node-02", [0, 1, 2, 3, 4, 5]))
    snap = snap.with_allocation(held("node-04", [0, 1, 2, 3, 4, 5, 6, 7]))
    snap = snap.with_allocation(held("node-06", [0, 1, 2, 3, 4, 5, 6, 7]))
    for node in ("node-01", "node-03", "node-05", "node-07"):
        snap = snap.with_allocation(held(node, [0]))
    req = spec(16, 1, topology={"domain": "leaf", "mode": "required"})
    result = place_gang(snap, req)
    assert result.explanation is not None
    assert result.explanation.level == "leaf"
    assert result.explanation.message.startswith(
        "needs 16 GPUs (16 ranks x 1) under one leaf; best leaf leaf0 has 11 free"
    )
    # Preferred instead of required: it spreads rather than waits.
    spread = place_gang(snap, spec(16, 1, topology={"domain": "leaf"}))
    assert spread.allocation is not None and spread.allocation.domain == "spine"
    assert spread.allocation.score["preferred_domain_met"] == 0.0


def test_required_domain_that_can_never_hold_the_gang_says_so() -> None:
    snap = ClusterSnapshot.from_cluster(preset_cluster(HGX_H100, 8, nodes_per_leaf=2))
    result = place_gang(snap, spec(4, 8, topology={"domain": "leaf", "mode": "required"}))
    assert result.explanation is not None and result.explanation.constraint == "domain_size"
    assert "can never fit" in result.explanation.message


def test_max_leaves_limits_the_spread_when_required() -> None:
    cluster = preset_cluster(HGX_H100, 8, nodes_per_leaf=2, leaves_per_spine=4)
    snap = ClusterSnapshot.from_cluster(cluster)
    for node in ("node-00", "node-02", "node-04", "node-06"):
        snap = snap.with_allocation(held(node, list(range(8))))
    ok = place_gang(snap, spec(2, 8, topology={"max_leaves": 2, "mode": "required"}))
    assert ok.allocation is not None
    three = place_gang(snap, spec(3, 8, topology={"max_leaves": 2, "mode": "required"}))
    assert three.explanation is not None and three.explanation.constraint == "max_leaves"
    assert "across at most 2 leaves" in three.explanation.message


def test_exclusive_gang_only_takes_idle_nodes() -> None:
    snap = ClusterSnapshot.from_cluster(preset_cluster(HGX_H100, 2)).with_allocation(held("node-00", [0]))
    result = place_gang(snap, spec(1, 2, topology={"exclusive": True}))
    assert result.allocation is not None and result.allocation.nodes == ["node-01"]


def test_exclusive_gang_holds_every_gpu_and_cpu_of_its_node_so_no_other_job_lands_there() -> None:
    state = ClusterState.from_cluster(preset_cluster(HGX_H100, 1))
    alloc = place_gang(state.snapshot(), spec(2, 1, memory_mb=4096, topology={"exclusive": True})).allocation
    assert alloc is not None
    # Each rank keeps its own GPU first (its first device); the node's other six are dealt between them.
    assert [len(r.gpus) for r in alloc.ranks] == [4, 4]
    assert sorted(g for r in alloc.ranks for g in r.gpus) == list(range(8))
    assert alloc.ranks[0].gpus[0] != alloc.ranks[1].gpus[0]
    node_cpus = state.slots[0].cpus
    assert sum(r.cpus for r in alloc.ranks) == node_cpus
    assert [r.memory_mb for r in alloc.ranks] == [4096, 4096]  # memory as asked, as Slurm allocates it
    state.apply(alloc)
    # Six GPUs would be free had the exclusive job held only its two; neither a GPU nor a share fits now.
    for gpus in (1, 0.25):
        later = place_gang(state.snapshot(), spec(1, gpus))
        assert later.allocation is None and later.explanation is not None
    state.release(alloc)
    assert state.snapshot().idle(0)


def test_exclusive_share_gang_holds_its_node_by_its_cpus() -> None:
    state = ClusterState.from_cluster(preset_cluster(HGX_H100, 1))
    alloc = place_gang(state.snapshot(), spec(1, 0.5, topology={"exclusive": True})).allocation
    assert alloc is not None and alloc.ranks[0].cpus == state.slots[0].cpus
    state.apply(alloc)
    assert place_gang(state.snapshot(), spec(1, 0.25)).allocation is None


def test_batch_window_puts_no_job_beside_an_exclusive_one() -> None:
    snap = ClusterSnapshot.from_cluster(preset_cluster(HGX_H100, 2))
    jobs = [
        PendingGang("excl", spec(1, 2, topology={"exclusive": True}), priority=10),
        PendingGang("a", spec(1, 4)),
        PendingGang("b", spec(1, 4)),
    ]
    got = place_batch(snap, jobs, time_limit_s=1.0)
    excl = got.decisions["excl"].allocation
    assert excl is not None and sorted(excl.ranks[0].gpus) == list(range(8))
    others = [got.decisions[j].allocation for j in ("a", "b")]
    # The two 4-GPU jobs share the other node; neither lands on the exclusive job's six "free" GPUs.
    assert all(a is not None and a.nodes != excl.nodes for a in others)


def test_gang_is_all_or_nothing_when_the_cluster_is_one_rank_short() -> None:
    state = ClusterState.from_cluster(preset_cluster(HGX_H100, 2))
    state.apply(held("node-01", [0]))
    result = place_gang(state.snapshot(), spec(2, 8))
    assert result.allocation is None and result.explanation is not None
    assert result.explanation.level == "cluster"
    assert "the cluster has 8 free" in result.explanation.message


def test_fragmented_free_gpus_are_reported_as_unusable_for_big_ranks() -> None:
    snap = ClusterSnapshot.from_cluster(preset_cluster(HGX_H100, 2))
    snap = snap.with_allocation(held("node-00", [0, 1, 2, 3])).with_allocation(held("node-01", [0, 1, 2, 3]))
    result = place_gang(snap, spec(1, 8))
    assert result.explanation is not None
    assert "8 free GPUs in all, but only 0 in usable sets" in result.explanation.message
