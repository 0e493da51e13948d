"""Properties over random clusters, fills and gangs: no over-allocation, no partial gang, same seed same answer."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from oneplus_contracts import JobSpec
from oneplus_placement import ClusterSnapshot, place_gang, seeded_fill
from placement_boards import DGX1, H100_QUAD, HGX_H100, L40S, PCIE_SWITCHES, board, cluster_of

PRESETS = [HGX_H100, DGX1, L40S, PCIE_SWITCHES, H100_QUAD]

clusters = st.lists(st.sampled_from(PRESETS), min_size=1, max_size=10).map(
    lambda names: cluster_of([board(n) for n in names], nodes_per_leaf=2, leaves_per_spine=2)
)


@st.composite
def gangs(draw: st.DrawFn) -> JobSpec:
    shared = draw(st.booleans()) and draw(st.booleans())
    if shared:
        gpus: float = draw(st.sampled_from([0.1, 0.25, 0.5, 0.75]))
        group = None
    else:
        gpus = draw(st.sampled_from([1, 2, 3, 4, 8]))
        group = draw(st.sampled_from([None, None, 2, 4]))
        if group and (int(gpus) % group and group % int(gpus)):
            group = None
    ranks = draw(st.integers(1, 6))
    if group and group > gpus:
        ranks = ranks * (group // int(gpus))
    topology = {
        "domain": draw(st.sampled_from([None, "node", "leaf", "spine"])),
        "mode": draw(st.sampled_from(["required", "preferred"])),
        "group_gpus": group,
    }
    return JobSpec(
        name="prop",
        ranks=ranks,
        resources={"gpus": gpus, "cpus": draw(st.sampled_from([1, 4, 16])), "memory_mb": 4096},  # type: ignore[arg-type]
        topology=topology,  # type: ignore[arg-type]
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster=clusters, fill_seed=st.integers(0, 1000), pct=st.integers(0, 95), gang=gangs(), seed=st.integers(0, 3))
def test_a_decision_places_every_rank_exactly_and_never_over_allocates(
    cluster: object, fill_seed: int, pct: int, gang: JobSpec, seed: int
) -> None:
    snap = seeded_fill(ClusterSnapshot.from_cluster(cluster), fill_seed, pct)  # type: ignore[arg-type]
    result = place_gang(snap, gang, seed=seed)
    assert (result.allocation is None) != (result.explanation is None)
    if result.allocation is None:
        assert result.explanation is not None and result.explanation.message
        return
    ranks = result.allocation.ranks
    assert [r.rank for r in ranks] == list(range(gang.ranks))
    per_rank = gang.resources
    for r in ranks:
        if per_rank.gpus < 1:
            assert len(r.gpus) == 1 and r.gpu_milli == per_rank.gpu_milli
        else:
            assert len(r.gpus) == len(set(r.gpus)) == per_rank.whole_gpus and r.gpu_milli == 0
    # Applying the decision on the snapshot it was made on must pass every over-allocation check.
    state = snap.mutable_copy()
    state.apply(result.allocation)
    taken_whole = sum(len(r.gpus) for r in ranks if not r.gpu_milli)
    index = snap.layout.index
    opened_for_shares = {(r.node, g) for r in ranks if r.gpu_milli for g in r.gpus if snap.free[index(r.node)] >> g & 1}
    assert state.total_free_gpus() == snap.total_free_gpus() - taken_whole - len(opened_for_shares)
    # A required domain is never exceeded.
    if gang.topology.domain and gang.topology.mode == "required":
        order = ["node", "leaf", "spine", "cluster"]
        assert order.index(result.allocation.domain) <= order.index(gang.topology.domain)
    # Every TP group of K GPUs sits in one NVLink domain of one node.
    k = gang.topology.group_gpus
    if k and per_rank.gpus >= 1:
        flat = [(r.node, g) for r in ranks for g in r.gpus]
        for start in range(0, len(flat), k):
            group = flat[start : start + k]
            assert len({n for n, _ in group}) == 1
            node = snap.slots[snap.layout.index(group[0][0])]
            domain = node.shape.domain_of(node.shape.indexes.index(group[0][1]))
            assert all(domain >> node.shape.indexes.index(g) & 1 for _, g in group)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster=clusters, fill_seed=st.integers(0, 1000), pct=st.integers(0, 90), gang=gangs(), seed=st.integers(0, 5))
def test_the_same_snapshot_and_seed_give_the_same_decision(
    cluster: object, fill_seed: int, pct: int, gang: JobSpec, seed: int
) -> None:
    first = place_gang(seeded_fill(ClusterSnapshot.from_cluster(cluster), fill_seed, pct), gang, seed=seed)  # type: ignore[arg-type]
    again = place_gang(seeded_fill(ClusterSnapshot.from_cluster(cluster), fill_seed, pct), gang, seed=seed)  # type: ignore[arg-type]
    assert first == again


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster=clusters, fill_seed=st.integers(0, 1000), gangs=st.lists(gangs(), min_size=1, max_size=12))
def test_placing_gang_after_gang_never_holds_a_gpu_twice(cluster: object, fill_seed: int, gangs: list[JobSpec]) -> None:
    state = seeded_fill(ClusterSnapshot.from_cluster(cluster), fill_seed, 30).mutable_copy()  # type: ignore[arg-type]
    for gang in gangs:
        result = place_gang(state.snapshot(), gang)
        if result.allocation is not None:
            state.apply(result.allocation)  # raises AllocationConflict on any double hold
    for i, shares in enumerate(state.shares):
        assert shares is None or all(0 <= s <= 1000 for s in shares)
        assert state.whole[i] & state.share_mask[i] == 0
