"""Each policy on tiny traces whose completion times are worked out by hand, and each baseline's defining trait."""

from __future__ import annotations

import pytest
from oneplus_sim.cluster import uniform_cluster
from oneplus_sim.comm import allocation_ring_gbps
from oneplus_sim.policies import POLICY_NAMES, make_policy
from sim_helpers import finish_times, h100, job, simulate, start_times


def blocked_head() -> list:
    # One 8-GPU node. A holds 4 GPUs for 100 s; B wants all 8; C (10 s) and D (200 s) want 1 GPU each.
    return [
        job("A", 0, 4, 100),
        job("B", 1, 8, 50),
        job("C", 2, 1, 10),
        job("D", 3, 1, 200),
    ]


def test_fifo_firstfit_blocks_everything_behind_the_head() -> None:
    res = simulate(h100(), blocked_head(), "fifo-firstfit")
    # B waits for A (100), C and D wait for B (150).
    assert finish_times(res) == {"A": 100, "B": 150, "C": 160, "D": 350}


def test_k8s_default_lets_small_jobs_pass_a_blocked_gang() -> None:
    res = simulate(h100(), blocked_head(), "k8s-default")
    # C and D start at once; B needs the whole node: after D ends at 203.
    assert finish_times(res) == {"A": 100, "B": 253, "C": 12, "D": 203}


def test_kueue_tas_is_best_effort_fifo_without_a_reservation() -> None:
    res = simulate(h100(), blocked_head(), "kueue-tas")
    assert finish_times(res) == {"A": 100, "B": 253, "C": 12, "D": 203}


def test_slurm_tree_backfills_only_what_ends_before_the_reservation() -> None:
    res = simulate(h100(), blocked_head(), "slurm-tree")
    # B is reserved the node from t=100 (A's limit); C ends at 12 < 100 and is backfilled; D would end at 203 on
    # the reserved node, so it waits until B is done.
    assert finish_times(res) == {"A": 100, "B": 150, "C": 12, "D": 350}


def test_slurm_tree_backfills_a_long_job_onto_nodes_the_reservation_does_not_need() -> None:
    jobs = [job("A", 0, 8, 100), job("B", 1, 8, 50), job("C", 2, 4, 500)]
    # Two nodes: A takes node 0; B fits on node 1 at once; C then cannot start before B or A end.
    res = simulate(h100(2), jobs, "slurm-tree")
    assert start_times(res) == {"A": 0, "B": 1, "C": 51}


def test_oneplus_runs_the_same_tiny_trace_to_hand_checked_times() -> None:
    jobs = [job("A", 0, 4, 100), job("C", 2, 1, 10)]
    res = simulate(h100(), jobs, "oneplus")
    # Both fit at once; the solver cycle of t=2 is held to its interval (60 s) after the cycle at t=0.
    assert finish_times(res) == {"A": 100, "C": 70}


def test_oneplus_preempts_low_priority_work_and_it_resumes_from_its_checkpoint() -> None:
    low = job("low", 0, 8, 6000, cls="low", checkpoint=600)
    high = job("high", 4000, 8, 100, cls="high")
    res = simulate(h100(), [low, high], "oneplus", preempt_grace_s=30)
    rec = res.records
    assert rec["low"].preemptions == 1
    # high arrives at 4000, past low's hour of protection, and the cycle then evicts low; low writes its checkpoint
    # for the 30 s grace and releases at 4030; cycles run at most every 60 s, so high starts at 4060, ends at 4160.
    assert rec["high"].first_start_s == 4060
    # low had done 4000 s, its last checkpoint was at 3600 s: 400 s x 8 GPUs are lost, 2400 s are left.
    assert rec["low"].lost_gpu_s == pytest.approx(400 * 8)
    assert rec["low"].finish_s == pytest.approx(4160 + 2400)


def test_oneplus_leaves_a_job_younger_than_the_default_hour_running() -> None:
    low = job("low", 0, 8, 3000, cls="low", checkpoint=600)
    high = job("high", 1000, 8, 100, cls="high")
    res = simulate(h100(), [low, high], "oneplus", preempt_grace_s=30)
    # low has run 1000 s of the default 3600 s floor (`preemption.min_runtime_s`) when high comes, and ends at 3000
    # before its protection would lapse: no preemption, high starts at the first cycle after.
    assert res.preemptions == 0
    assert res.records["high"].first_start_s == 3000


def test_baselines_never_preempt() -> None:
    for policy in ("k8s-default", "slurm-tree", "kueue-tas", "fifo-firstfit"):
        low = job("low", 0, 8, 3000, cls="low", checkpoint=600)
        high = job("high", 1000, 8, 100, cls="high")
        res = simulate(h100(), [low, high], policy)
        assert res.preemptions == 0
        assert finish_times(res) == {"low": 3000, "high": 3100}


def test_k8s_default_spreads_and_the_topology_aware_pack() -> None:
    nodes_used = {}
    for policy in ("k8s-default", "kueue-tas", "slurm-tree"):
        res = simulate(h100(2), [job("a", 0, 1, 100), job("b", 1, 1, 100)], policy)
        nodes_used[policy] = len({res.placements[k][0][0][0] for k in ("a", "b")})
    assert nodes_used == {"k8s-default": 2, "kueue-tas": 1, "slurm-tree": 1}


def test_slurm_tree_picks_gpus_by_nvlink_while_k8s_takes_the_lowest_indexes() -> None:
    # DGX-1 hybrid cube mesh: with GPU 0 busy, four more GPUs are best taken as the other quad (4-7).
    cluster = uniform_cluster(1, "dgx1_v100", 1)
    got = {}
    for policy in ("k8s-default", "slurm-tree"):
        res = simulate(cluster, [job("hold", 0, 1, 1000), job("quad", 1, 4, 100, f=0.5)], policy)
        slots = res.placements["quad"][0]
        got[policy] = (slots[0][1], allocation_ring_gbps(cluster, slots))
    assert got["k8s-default"][0] == (1, 2, 3, 4)
    assert got["slurm-tree"][0] == (4, 5, 6, 7)
    assert got["slurm-tree"][1] > got["k8s-default"][1]


def test_a_gang_is_placed_whole_or_not_at_all_by_every_policy() -> None:
    for policy in POLICY_NAMES:
        res = simulate(h100(2), [job("a", 0, 4, 100), job("big", 1, 16, 100)], policy)
        big = res.records["big"]
        assert big.first_start_s is not None and big.first_start_s >= 100, policy


def test_unknown_policy_names_the_choices() -> None:
    with pytest.raises(ValueError, match="choose from oneplus, k8s-default"):
        make_policy("yarn")


def test_oneplus_keeps_a_multi_node_gang_in_one_leaf_and_still_places_one_bigger_than_a_leaf() -> None:
    # Two leaves of two nodes; leaf 0 has one node busy. A 16-GPU gang waits for a whole leaf rather than
    # straddling; a 32-GPU gang (bigger than any leaf) is placed across leaves.
    c = h100(nodes=4, per_leaf=2)
    res = simulate(
        c, [job("busy", 0, 8, 500), job("other", 0, 8, 500, order=1), job("gang", 1, 16, 100, f=0.4)], "oneplus"
    )
    leaves = {c.nodes[n].leaf for n, _ in res.placements["gang"][0]}
    assert len(leaves) == 1
    res = simulate(c, [job("huge", 0, 32, 100, f=0.4)], "oneplus")
    assert res.records["huge"].finish_s is not None
    assert len({c.nodes[n].leaf for n, _ in res.placements["huge"][0]}) == 2
