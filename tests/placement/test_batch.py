"""CP-SAT batches: bounded in time, gap reported, never worse than greedy, greedy fallback on a tiny bound."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from oneplus_contracts import JobSpec
from oneplus_placement import ClusterSnapshot, PendingGang, place_batch, seeded_fill
from placement_boards import HGX_H100, preset_cluster


def gang(job_id: str, gpus: int, per_rank: int, priority: int = 0) -> PendingGang:
    spec = JobSpec(name=job_id, ranks=gpus // per_rank, resources={"gpus": per_rank}, priority=priority)  # type: ignore[arg-type]
    return PendingGang(job_id, spec)


def window(n: int, seed: int) -> list[PendingGang]:
    rng = random.Random(seed)
    out = []
    for j in range(n):
        gpus = rng.choice([1, 1, 2, 4, 8, 16, 32])
        out.append(gang(f"j{j}", gpus, min(gpus, rng.choice([1, 2, 4, 8])), rng.choice([0, 5, 50])))
    return out


def assert_valid(snapshot: ClusterSnapshot, result: object) -> None:
    state = snapshot.mutable_copy()
    for alloc in result.allocations.values():  # type: ignore[attr-defined]
        state.apply(alloc)  # raises on any GPU held twice


def test_batch_places_jointly_reports_gap_and_records_solver_on_each_decision() -> None:
    snap = seeded_fill(ClusterSnapshot.from_cluster(preset_cluster(HGX_H100, 32, nodes_per_leaf=4)), 3, 50)
    jobs = window(40, 1)
    result = place_batch(snap, jobs, time_limit_s=2.0)
    assert result.solver in ("cp-sat", "greedy-fallback")
    assert result.gap is not None and 0 <= result.gap <= 1
    assert result.bound is not None and result.model_objective is not None
    assert result.bound >= result.model_objective - 1e-6
    assert result.upper_bound >= result.objective
    assert set(result.decisions) == {j.job_id for j in jobs}
    assert result.objective >= result.greedy_objective
    assert set(result.terms) == {"priority_gpus", "topology_quality", "fragmentation"}
    assert_valid(snap, result)
    for alloc in result.allocations.values():
        assert alloc.solver in ("cp-sat", "greedy-fallback", "cp-sat+greedy-repair")
        assert "batch_gap" in alloc.score and "priority_weight" in alloc.score


def test_every_unplaced_gang_in_a_batch_has_an_explanation() -> None:
    snap = ClusterSnapshot.from_cluster(preset_cluster(HGX_H100, 2))
    jobs = [gang("big", 16, 8), gang("huge", 64, 8), gang("small", 2, 2)]
    result = place_batch(snap, jobs, time_limit_s=1.0)
    assert result.decisions["huge"].explanation is not None
    assert "needs 64 GPUs" in result.decisions["huge"].explanation.message
    placed = {j for j, d in result.decisions.items() if d.placed}
    assert "huge" not in placed and len(placed) >= 1


def test_higher_priority_wins_the_last_free_node() -> None:
    snap = ClusterSnapshot.from_cluster(preset_cluster(HGX_H100, 1))
    jobs = [gang("low", 8, 8, priority=1), gang("high", 8, 8, priority=100)]
    result = place_batch(snap, jobs, time_limit_s=1.0)
    assert result.decisions["high"].placed and not result.decisions["low"].placed


def test_batch_beats_greedy_when_greedy_order_strands_capacity() -> None:
    # Greedy puts the 1-GPU job first (highest priority) into the tightest fragment it sees; a joint answer can
    # still fit both 4-GPU gangs. Whatever greedy does, the batch must place at least as many weighted GPUs.
    snap = ClusterSnapshot.from_cluster(preset_cluster(HGX_H100, 2))
    jobs = [gang("a", 4, 4, 10), gang("b", 4, 4, 10), gang("c", 8, 8, 10), gang("d", 1, 1, 10)]
    result = place_batch(snap, jobs, time_limit_s=1.0)
    assert result.placed_gpus >= result.greedy_placed_gpus
    assert result.objective >= result.greedy_objective
    assert_valid(snap, result)


def test_a_tiny_time_bound_falls_back_to_greedy_and_still_places() -> None:
    snap = seeded_fill(ClusterSnapshot.from_cluster(preset_cluster(HGX_H100, 64, nodes_per_leaf=8)), 5, 40)
    jobs = window(120, 2)
    result = place_batch(snap, jobs, time_limit_s=1e-6)
    assert result.solver == "greedy-fallback"
    assert result.gap is None
    assert result.placed_gpus == result.greedy_placed_gpus > 0
    assert any("no solution within" in n for n in result.notes)
    assert_valid(snap, result)
    assert all(a.solver == "greedy-fallback" for a in result.allocations.values())


def test_the_solver_respects_its_time_bound() -> None:
    snap = seeded_fill(ClusterSnapshot.from_cluster(preset_cluster(HGX_H100, 64, nodes_per_leaf=8)), 9, 60)
    result = place_batch(snap, window(100, 3), time_limit_s=0.2)
    # The whole batch (greedy, model, solve, decode) stays within a small multiple of the solver bound here.
    assert result.wall_s < 5.0


def test_bad_batch_input_is_refused() -> None:
    snap = ClusterSnapshot.from_cluster(preset_cluster(HGX_H100, 1))
    with pytest.raises(ValueError, match="unique"):
        place_batch(snap, [gang("a", 1, 1), gang("a", 1, 1)])
    with pytest.raises(ValueError, match="time_limit_s must be positive"):
        place_batch(snap, [gang("a", 1, 1)], time_limit_s=0)


def test_empty_window_is_an_empty_answer() -> None:
    snap = ClusterSnapshot.from_cluster(preset_cluster(HGX_H100, 1))
    result = place_batch(snap, [])
    assert result.decisions == {} and result.placed_gpus == 0


@pytest.mark.parametrize(
    ("sizes", "greedy_gpus"),
    [
        # Best fit in arrival order packs the 2-GPU jobs four to a node: two nodes, then only six 6-GPU jobs fit.
        ([2] * 8 + [6] * 8, 52),
        # The same with 3 and 5: the 3-GPU jobs take two nodes (and leave 2 GPUs each); four 5-GPU jobs are left out.
        ([3] * 8 + [5] * 8, 44),
    ],
)
def test_the_batch_packs_what_greedy_in_arrival_order_strands(sizes: list[int], greedy_gpus: int) -> None:
    """Hand-checked: 8 empty 8-GPU nodes, every pair (small, large) fits one node exactly; only a joint packing
    (the largest pieces first) places all 64 GPUs."""
    snap = ClusterSnapshot.from_cluster(preset_cluster(HGX_H100, 8, nodes_per_leaf=8))
    jobs = [gang(f"j{i}", g, g) for i, g in enumerate(sizes)]
    result = place_batch(snap, jobs, time_limit_s=2.0)
    assert result.greedy_placed_gpus == greedy_gpus
    assert result.solver == "cp-sat" and result.placed_gpus == 64, result.notes
    assert all(d.allocation is not None and d.allocation.domain == "node" for d in result.decisions.values())
    assert_valid(snap, result)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fill_seed=st.integers(0, 1000), pct=st.integers(0, 80), seed=st.integers(0, 1000), n=st.integers(1, 30))
def test_the_batch_is_never_worse_than_its_greedy_warm_start(fill_seed: int, pct: int, seed: int, n: int) -> None:
    snap = seeded_fill(ClusterSnapshot.from_cluster(preset_cluster(HGX_H100, 16, nodes_per_leaf=4)), fill_seed, pct)
    result = place_batch(snap, window(n, seed), time_limit_s=0.2)
    assert result.objective >= result.greedy_objective - 1e-9
    assert_valid(snap, result)  # no GPU given twice, none that was held


def test_contested_only_skips_cp_sat_when_greedy_places_the_whole_window() -> None:
    snap = ClusterSnapshot.from_cluster(preset_cluster(HGX_H100, 8, nodes_per_leaf=8))
    easy = place_batch(snap, [gang(f"j{i}", 2, 2) for i in range(8)], contested_only=True)
    assert easy.solver == "greedy" and easy.status == "NOT_RUN" and easy.placed_gpus == 16
    assert easy.objective == easy.greedy_objective and easy.bound is None
    contested = place_batch(snap, [gang(f"j{i}", g, g) for i, g in enumerate([2] * 8 + [6] * 8)], contested_only=True)
    assert contested.solver == "cp-sat" and contested.placed_gpus == 64
