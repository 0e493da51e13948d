"""The communication model, metrics, determinism and the report's keys."""

from __future__ import annotations

from pathlib import Path

import pytest
from oneplus_sim.cluster import SimCluster
from oneplus_sim.comm import IdealRing, allocation_ring_gbps, slowdown
from oneplus_sim.engine import Simulation
from oneplus_sim.metrics import figures, percentile
from oneplus_sim.policies import POLICY_NAMES, make_policy
from oneplus_sim.replay import ReplaySpec, run_replay
from oneplus_sim.state import Placement
from oneplus_topology.cluster import synthetic_cluster
from sim_helpers import h100, job, simulate

REPORT_KEYS = {
    "jobs",
    "avg_jct_s",
    "p50_wait_s",
    "p95_wait_s",
    "p95_wait_large_s",
    "makespan_s",
    "gpu_alloc_pct",
    "frag_pct",
    "tightest_domain_pct",
    "comm_slowdown_avg",
    "p95_wait_by_priority",
    "preemptions",
    "lost_gpu_hours",
    "solver_p50_ms",
    "solver_p99_ms",
}


def test_ring_crossing_a_leaf_pays_the_oversubscription() -> None:
    c = h100(nodes=4, per_leaf=2, oversub=2.0)
    inside = allocation_ring_gbps(c, [(0, tuple(range(8))), (1, tuple(range(8)))])
    across = allocation_ring_gbps(c, [(0, tuple(range(8))), (2, tuple(range(8)))])
    assert inside == pytest.approx(50.0)  # 400 Gb/s NIC per GPU
    assert across == pytest.approx(25.0)
    assert IdealRing(c)(2, 8) == pytest.approx(50.0)
    assert allocation_ring_gbps(c, [(0, (0, 1, 2, 3))]) == pytest.approx(450.0)  # NV18


def test_slowdown_formula() -> None:
    assert slowdown(0.4, 50.0, 25.0) == pytest.approx(0.6 + 0.4 * 2)
    assert slowdown(0.4, 50.0, 50.0) == 1.0
    assert slowdown(0.0, 50.0, 1.0) == 1.0
    with pytest.raises(ValueError, match="zero ring bandwidth"):
        slowdown(0.3, 50.0, 0.0)


def test_a_gang_split_across_leaves_runs_slower_by_the_model() -> None:
    # Leaf 0 has one free node left, leaf 1 one: the 16-GPU job must cross leaves under every policy.
    c = h100(nodes=4, per_leaf=2, oversub=2.0)
    jobs = [job("x", 0, 8, 1000), job("y", 0.5, 8, 1000), job("gang", 1, 16, 100, f=0.5)]
    res = simulate(c, [jobs[0], jobs[1], jobs[2]], "k8s-default")
    rec = res.records["gang"]
    seg = rec.segments[0]
    if len({c.nodes[n].leaf for n, _ in rec.placements[0]}) > 1:
        assert seg[1] == pytest.approx(1.5)  # (1 - 0.5) + 0.5 * 50/25
        assert rec.finish_s == pytest.approx(1 + 150)
    else:
        assert seg[1] == 1.0


def test_percentile_matches_linear_interpolation() -> None:
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([], 95) == 0.0
    assert percentile([7], 99) == 7


def test_figures_have_every_key_of_benchmarks_md() -> None:
    res = simulate(h100(2), [job("a", 0, 8, 100), job("b", 5, 2, 50, f=0.2), job("c", 6, 1, 10)], "slurm-tree")
    f = figures(res)
    assert set(f) >= REPORT_KEYS
    assert f["jobs"] == 3 and f["makespan_s"] == 100
    assert f["gpu_alloc_pct"] == pytest.approx(100 * (8 * 100 + 2 * 50 + 10) / (16 * 100))
    assert f["p95_wait_by_priority"] == {"50": 0.0}


def test_frag_pct_counts_free_gpus_an_8_gpu_gang_cannot_use() -> None:
    # Node 0: 1 GPU busy for 100 s (7 free, unusable); node 1 idle (8 usable): 7 of 15 free GPUs are stranded.
    res = simulate(h100(2), [job("a", 0, 1, 100)], "kueue-tas")
    assert figures(res)["frag_pct"] == pytest.approx(100 * 7 / 15, abs=0.01)


def test_replay_is_deterministic_for_a_seed(philly_small: Path) -> None:
    def once(seed: int) -> dict[str, object]:
        spec = ReplaySpec(h100(8, 4), philly_small, list(POLICY_NAMES), max_jobs=150, seed=seed)
        report = run_replay(spec).report
        for figs in report["policies"].values():  # type: ignore[union-attr]
            for k in ("solver_p50_ms", "solver_p99_ms", "wall_s"):
                figs.pop(k)
        return report

    a, b = once(7), once(7)
    assert a == b
    assert a["rules"]["seed"] == "7"  # type: ignore[index]
    assert set(a["policies"]) == set(POLICY_NAMES)  # type: ignore[arg-type]
    assert once(8)["policies"] != a["policies"]


def test_on_nvl72_racks_the_tightest_domain_of_a_multi_tray_gang_is_one_nvlink_domain() -> None:
    """Two racks of 18 GB200 trays under one leaf: a 16-GPU gang over four trays is tightest only inside one rack."""
    trays = synthetic_cluster(
        36, "gb200_nvl72_compute_tray_4gpu", nodes_per_leaf=36, nodes_per_nvlink_domain=18, prefix="tray"
    )
    cluster = SimCluster(trays, source="synthetic:nvl72")
    gang = job("g", 0.0, 16, 10.0, node_gpus=4)
    sim = Simulation(cluster, [gang], make_policy("oneplus", 0))
    one_rack = Placement(tuple((n, (0, 1, 2, 3)) for n in (0, 1, 2, 3)))
    two_racks = Placement(tuple((n, (0, 1, 2, 3)) for n in (0, 1, 18, 19)))
    assert sim._tightest(gang, one_rack)
    assert not sim._tightest(gang, two_racks)
    result = simulate(cluster, [gang], "oneplus")
    assert result.records["g"].segments[0][4] is True
