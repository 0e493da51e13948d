"""Tensor-parallel groups on multi-node NVLink domains (issue 41 item 5): the trace rule, the TP communication model,
the share of groups inside one domain, and each NVL72-aware policy's defining trait."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from oneplus_sim.cluster import SimCluster, load_cluster
from oneplus_sim.comm import IdealRing, group_in_nvlink_domain, tp_groups, tp_slowdown
from oneplus_sim.engine import Simulation
from oneplus_sim.metrics import figures
from oneplus_sim.policies import make_policy
from oneplus_sim.policies.common import FreeView
from oneplus_sim.policies.nvlink import KueueTasSlices, SlurmBlock, segment_ranks
from oneplus_sim.replay import ReplaySpec, run_replay
from oneplus_sim.state import Occupancy, Placement
from oneplus_sim.trace import SimJob, TraceRules, tp_group_of
from oneplus_topology.cluster import synthetic_cluster
from sim_helpers import REPO, job

FULL = (0, 1, 2, 3)


def racks(n_racks: int = 2, trays: int = 8, racks_per_leaf: int = 2) -> SimCluster:
    """GB200 trays of 4 GPUs, `trays` per NVLink domain (a rack), `racks_per_leaf` racks per leaf, 2:1 above."""
    c = synthetic_cluster(
        n_racks * trays,
        "gb200_nvl72_compute_tray_4gpu",
        nodes_per_leaf=trays * racks_per_leaf,
        nodes_per_nvlink_domain=trays,
        oversubscription=2.0,
        prefix="tray",
    )
    return SimCluster(c, source="synthetic:nvl")


def tp_job(job_id: str, gpus: int, tp: int, submit: float = 0.0, duration: float = 100.0, f: float = 0.4) -> SimJob:
    j = job(job_id, submit, gpus, duration, node_gpus=4, f=f)
    j.tp_group = tp
    return j


def busy(occ: Occupancy, nodes: list[int]) -> None:
    """Fill these trays with one-tray jobs."""
    for n in nodes:
        filler = job(f"fill-{n}", 0.0, 4, 1.0, node_gpus=4)
        occ.take(filler, Placement(((n, FULL),)))


# ---- the trace rule ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("gpus", "allowed"), [(1, {0}), (4, {0}), (12, {0}), (8, {8}), (24, {8}), (16, {8, 16})])
def test_the_rule_gives_the_two_largest_dividing_group_sizes(gpus: int, allowed: set[int]) -> None:
    got = {tp_group_of(SimJob(f"j{k}", 0.0, 10.0, float(gpus)), seed=0) for k in range(40)}
    assert got <= allowed
    assert len(got) == len(allowed)  # both sizes are drawn over 40 jobs


def test_jobs_of_32_gpus_and_more_get_16_or_32_and_the_draw_is_seeded() -> None:
    jobs = [SimJob(f"j{k}", 0.0, 10.0, 64.0) for k in range(40)]
    first = [tp_group_of(j, seed=3) for j in jobs]
    assert set(first) == {16, 32}
    assert first == [tp_group_of(j, seed=3) for j in jobs]


def test_turning_tp_groups_on_changes_nothing_else_of_a_job() -> None:
    def apply(tp: bool) -> list[SimJob]:
        jobs = [SimJob(f"j{k}", float(k), 10.0, float(g)) for k, g in enumerate((1, 8, 16, 32, 12))]
        TraceRules(seed=1, tp_groups=tp).apply(jobs, node_gpus=4)
        return jobs

    off, on = apply(False), apply(True)
    assert [j.tp_group for j in off] == [0] * 5
    assert [j.tp_group for j in on][:2] == [0, 8]
    for a, b in zip(off, on, strict=True):
        assert (a.ranks, a.gpus_per_rank, a.priority, a.comm_fraction, a.checkpoint_interval_s) == (
            b.ranks,
            b.gpus_per_rank,
            b.priority,
            b.comm_fraction,
            b.checkpoint_interval_s,
        )
    assert "tp_groups" in TraceRules(tp_groups=True).describe()
    assert "tp_groups" not in TraceRules().describe()


# ---- the communication model ---------------------------------------------------------------------------------


def test_a_group_inside_one_rack_runs_at_the_nvlink_figure_and_one_across_racks_at_the_nic() -> None:
    c = racks()
    ideal = IdealRing(c)
    inside = ((0, FULL), (1, FULL), (2, FULL), (3, FULL))
    across = ((0, FULL), (1, FULL), (8, FULL), (9, FULL))
    s_in, b_in, b_star, k_in, n = tp_slowdown(c, ideal, 0.4, 16, 4, inside)
    s_out, b_out, _, k_out, _ = tp_slowdown(c, ideal, 0.4, 16, 4, across)
    assert (s_in, b_in, b_star, k_in, n) == (1.0, 900.0, 900.0, 1, 1)
    assert b_out == 50.0  # 400 Gb/s NIC per GPU, both racks under one leaf
    assert k_out == 0
    assert s_out == pytest.approx(0.6 + 0.4 * 900.0 / 50.0)


def test_groups_each_inside_a_rack_pay_only_the_data_parallel_share_across_racks() -> None:
    c = racks()
    ideal = IdealRing(c)
    slots = ((0, FULL), (1, FULL), (8, FULL), (9, FULL))  # two TP-8 groups, one per rack
    assert [sorted({n for n, _ in g}) for g in tp_groups(slots, 8)] == [[0, 1], [8, 9]]
    s, b_tp, _, inside, groups = tp_slowdown(c, ideal, 0.4, 8, 4, slots)
    assert (b_tp, inside, groups) == (900.0, 2, 2)
    # 80% of f on the groups (ideal), 20% on the data-parallel ring across the racks (50 vs 900 GB/s).
    assert s == pytest.approx(0.6 + 0.4 * (0.8 + 0.2 * 900.0 / 50.0))


def test_a_group_on_one_tray_is_inside_its_boards_nvlink_domain() -> None:
    c = racks()
    assert group_in_nvlink_domain(c, [(0, g) for g in FULL])
    assert not group_in_nvlink_domain(c, [(0, 0), (8, 0)])


def test_figures_report_the_share_of_groups_inside_one_domain_and_their_slowdown() -> None:
    c = racks()
    a = tp_job("a", 16, 8)
    res = Simulation(c, [a], _Fixed({"a": ((0, FULL), (1, FULL), (2, FULL), (8, FULL))})).run()
    figs = figures(res)
    assert res.records["a"].tp_groups == [(1, 2)]
    assert figs["tp_groups"] == 2
    assert figs["tp_in_nvlink_domain_pct"] == 50.0
    assert figs["comm_slowdown_tp_avg"] == figs["comm_slowdown_avg"]
    assert float(figs["comm_slowdown_tp_avg"]) > 1.0  # type: ignore[arg-type]
    plain = figures(Simulation(c, [job("b", 0.0, 8, 10.0, node_gpus=4)], make_policy("oneplus")).run())
    assert "tp_groups" not in plain


class _Fixed:
    """A policy that starts every job at a placement given by the test."""

    name = "fixed"

    def __init__(self, where: dict[str, tuple[tuple[int, tuple[int, ...]], ...]]) -> None:
        self.where = where

    def queue_key(self, j: SimJob) -> tuple[float, ...]:
        return (j.order,)

    def schedule(self, ctx: object) -> None:
        for j in list(ctx.pending):  # type: ignore[attr-defined]
            ctx.start(j, Placement(self.where[j.job_id]))  # type: ignore[attr-defined]


# ---- the policies --------------------------------------------------------------------------------------------


def test_oneplus_keeps_every_tp_group_inside_one_rack_even_when_no_rack_holds_the_job() -> None:
    c = racks()
    # Rack 0 has 3 free trays, rack 1 has 5: a TP-8 job of 32 GPUs fits only as groups split between the racks.
    hold = [job(f"h{n}", 0.0, 4, 1000.0, node_gpus=4, cls="high", order=n) for n in range(8)]
    big = tp_job("big", 32, 8, submit=1.0)
    big.order = 100
    res = Simulation(c, [*hold, big], make_policy("oneplus")).run()
    rec = res.records["big"]
    assert rec.tp_groups and rec.tp_groups[0][0] == rec.tp_groups[0][1]
    assert figures(res)["tp_in_nvlink_domain_pct"] == 100.0


def test_segment_is_the_tp_group_in_ranks() -> None:
    assert segment_ranks(tp_job("a", 32, 16)) == 4
    assert segment_ranks(tp_job("b", 8, 8)) == 2
    assert segment_ranks(job("c", 0.0, 16, 1.0, node_gpus=4)) == 1


def test_slurm_block_keeps_each_segment_inside_one_base_block_or_waits() -> None:
    c = racks()
    occ = Occupancy(c)
    busy(occ, [0, 1, 2, 3, 4, 8, 9, 10])  # rack 0: 3 trays free; rack 1: 5 free
    policy = SlurmBlock()
    # 32 GPUs in segments of 4 trays: rack 0 holds none, rack 1 one; Slurm waits.
    assert policy.place(FreeView(occ), tp_job("a", 32, 16)) is None
    # 16 GPUs, one segment: rack 1, the only base block with room.
    p = policy.place(FreeView(occ), tp_job("b", 16, 16))
    assert p is not None and {n // 8 for n in p.nodes} == {1}
    # 24 GPUs in segments of 2 trays: rack 1 holds 2, rack 0 one: the 2-rack block, each segment in one rack.
    q = policy.place(FreeView(occ), tp_job("c", 24, 8))
    assert q is not None
    assert all(group_in_nvlink_domain(c, g) for g in tp_groups(q.slots, 8))


def test_slurm_block_puts_a_job_that_fits_one_rack_in_the_tightest_rack() -> None:
    c = racks()
    occ = Occupancy(c)
    busy(occ, [0, 1, 2, 3, 4, 8])  # rack 0: 3 free, rack 1: 7 free
    p = SlurmBlock().place(FreeView(occ), job("a", 0.0, 12, 1.0, node_gpus=4))
    assert p is not None and {n // 8 for n in p.nodes} == {0}


def test_kueue_tas_slices_prefers_the_tightest_rack_and_requires_each_slice_in_a_rack() -> None:
    c = racks()
    occ = Occupancy(c)
    busy(occ, [0, 1, 2, 3, 4, 8, 9, 10])  # rack 0: 3 free; rack 1: 5 free
    policy = KueueTasSlices()
    p = policy.place(FreeView(occ), tp_job("a", 8, 8))
    assert p is not None and {n // 8 for n in p.nodes} == {0}  # BestFit: the rack with the least room that fits
    q = policy.place(FreeView(occ), tp_job("b", 24, 8))  # 3 slices of 2 trays: 2 in rack 1, 1 in rack 0
    assert q is not None and {n // 8 for n in q.nodes} == {0, 1}
    assert all(group_in_nvlink_domain(c, g) for g in tp_groups(q.slots, 8))
    assert policy.place(FreeView(occ), tp_job("c", 32, 16)) is None  # slices of 4 trays: rack 1 holds one, rack 0 none


def test_k8s_default_is_topology_blind_and_splits_tp_groups_over_racks() -> None:
    c = racks()
    split = 0
    for seed in range(5):
        res = Simulation(c, [tp_job("a", 16, 16)], make_policy("k8s-default", seed)).run()
        inside, groups = res.records["a"].tp_groups[0]
        split += inside < groups
    assert split > 0


def test_the_nvl72_cluster_file_is_eight_racks_of_72_gpus_under_a_2_to_1_fabric() -> None:
    c = load_cluster(REPO / "bench" / "clusters" / "nvl72_8rack.yaml")
    level = c.layout.level("nvlink")
    assert c.total_gpus == 576
    assert level is not None and [len(m) for m in level.members] == [18] * 8
    assert c.oversubscription == 2.0


def test_a_replay_with_tp_groups_reports_their_share_for_every_policy(tmp_path: Path) -> None:
    trace = tmp_path / "philly.csv"
    rows = ["timestamp,duration,num_gpus,gpu_time,cluster"]
    rows += [f"2017-10-09 07:{k:02d}:00,600.0,{g},0,vc{k % 3}" for k, g in enumerate([8, 16, 32, 1, 4, 16, 8, 2] * 3)]
    trace.write_text("\n".join(rows) + "\n")
    names = ["oneplus", "k8s-default", "slurm-block", "kueue-tas-slices"]
    rep = run_replay(ReplaySpec(racks(), trace, names, tp_groups=True)).report
    assert rep["tp_comm_share"] == 0.8
    for name in names:
        figs = rep["policies"][name]  # type: ignore[index]
        assert figs["tp_groups"] > 0
    assert rep["policies"]["oneplus"]["tp_in_nvlink_domain_pct"] == 100.0  # type: ignore[index]


def test_the_cli_flag_turns_the_rule_on_and_the_table_shows_the_share(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from oneplus.cli.sim import app

    cluster = tmp_path / "c.yaml"
    cluster.write_text(
        "name: two-racks\nfabric: {nodes_per_leaf: 8, oversubscription: 2.0}\nnode_groups:\n"
        "  - {prefix: gb200, count: 16, topology: gb200_nvl72_compute_tray_4gpu, nodes_per_nvlink_domain: 8}\n"
    )
    trace = tmp_path / "philly.csv"
    rows = ["timestamp,duration,num_gpus,gpu_time,cluster"]
    rows += [f"2017-10-09 07:{k:02d}:00,600.0,{g},0,vc0" for k, g in enumerate([16, 8, 1, 32])]
    trace.write_text("\n".join(rows) + "\n")
    out = tmp_path / "r.json"
    args = ["run", "--cluster", str(cluster), "--trace", str(trace), "--policy", "oneplus,slurm-block"]
    res = CliRunner().invoke(app, [*args, "--tp-groups", "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert "tp_in_nvlink_domain_pct" in res.output
    report = json.loads(out.read_text())
    assert "tp_groups" in report["rules"]
    assert report["policies"]["slurm-block"]["tp_in_nvlink_domain_pct"] == 100.0
    plain = CliRunner().invoke(app, [*args, "--json", str(out)])
    assert plain.exit_code == 0 and "tp_in_nvlink_domain_pct" not in plain.output
