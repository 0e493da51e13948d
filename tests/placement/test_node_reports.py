"""A GPU is free only when its reservation is gone and its node no longer reports a rank on it."""

from __future__ import annotations

from oneplus_contracts import Allocation, GpuHealth, NodeHeartbeat, NodeRecord, RankPlacement, RankReport
from oneplus_placement.live import LiveCapacity
from oneplus_placement.reports import HeartbeatRanks, NodeReports
from oneplus_topology.presets import load_preset


def alloc(node: str, gpus: list[int]) -> Allocation:
    return Allocation(ranks=[RankPlacement(rank=0, node=node, gpus=gpus)])


def hb(node: str, ts: float, *ranks: tuple[str, int, list[int]]) -> NodeHeartbeat:
    return NodeHeartbeat(node=node, ts=ts, ranks=[RankReport(job_id=j, token=t, gpus=g) for j, t, g in ranks])


def test_ranks_of_a_holder_do_not_linger_but_those_of_a_released_attempt_do() -> None:
    reports = NodeReports()
    reports.report(hb("n0", 1.0, ("a", 5, [0, 1]), ("b", 7, [2])))
    held = {"a": (5, alloc("n0", [0, 1]))}
    assert reports.lingering(held) == {"n0": {2}}  # b's reservation is gone (store reset, lease out) yet it runs
    # b's attempt was requeued and placed again elsewhere under a newer token: its old ranks still count here.
    assert reports.lingering({**held, "b": (9, alloc("n1", [0]))}) == {"n0": {2}}


def test_a_reported_end_outweighs_an_older_heartbeat_and_a_newer_heartbeat_clears_it() -> None:
    reports = NodeReports()
    reports.report(hb("n0", 1.0, ("b", 7, [2])))
    reports.rank_ended("b", 7, "n0", now=2.0)
    assert reports.lingering({}) == {}
    reports.report(hb("n0", 3.0, ("c", 8, [3])))
    reports.report(hb("n0", 2.5, ("d", 1, [4])))  # late and older: ignored
    assert reports.lingering({}) == {"n0": {3}}
    reports.report(hb("n0", 4.0))
    assert reports.lingering({}) == {}


def test_a_lost_node_reports_nothing_and_old_ends_are_forgotten() -> None:
    reports = NodeReports(ended_memory_s=10)
    reports.report(hb("n0", 1.0, ("b", 7, [2])))
    reports.node_lost("n0")
    assert reports.lingering({}) == {}
    reports.rank_ended("x", 1, "n0", now=0.0)
    reports.rank_ended("y", 1, "n0", now=20.0)
    assert list(reports.ended) == [("y", 1, "n0")]


def test_an_end_is_forgotten_once_the_node_heartbeats_after_reporting_it() -> None:
    reports = NodeReports()
    reports.report(hb("n0", 10.0, ("b", 7, [2]), ("c", 8, [3])))
    reports.rank_ended("b", 7, "n0", now=500.0, reported_ts=11.0)  # solver and node clocks differ: each is used alone
    reports.rank_ended("c", 8, "n0", now=500.0, reported_ts=13.0)
    reports.report(hb("n0", 12.0, ("c", 8, [3])))  # taken after b's end, before c's (which it still lists)
    assert list(reports.ended) == [("c", 8, "n0")]
    assert reports.lingering({}) == {}
    reports.report(hb("n1", 99.0))  # another node's heartbeat forgets nothing of n0
    assert list(reports.ended) == [("c", 8, "n0")]
    reports.report(hb("n0", 14.0))
    assert list(reports.ended) == [] and reports.lingering({}) == {}


def test_an_end_without_the_nodes_time_is_kept_for_the_memory_span() -> None:
    reports = NodeReports(ended_memory_s=10)
    reports.rank_ended("b", 7, "n0", now=0.0)
    reports.report(hb("n0", 1e12))
    assert list(reports.ended) == [("b", 7, "n0")]
    reports.rank_ended("c", 1, "n0", now=20.0, reported_ts=5.0)
    assert list(reports.ended) == [("c", 1, "n0")]


def test_blocked_gpus_are_not_offered_on_the_cycles_copy_only() -> None:
    cap = LiveCapacity()
    cap.set_node(NodeRecord(topology=load_preset("h100_sxm_8gpu_nvswitch_nv18", "n0")))
    state = cap.copy()
    before = state.total_free_gpus()
    state.block("n0", [0, 1, 99])  # a GPU the node does not have is ignored
    state.block("gone", [0])
    assert state.total_free_gpus() == before - 2
    assert cap.copy().total_free_gpus() == before


def test_the_solver_reads_the_ranks_of_a_whole_heartbeat_and_passes_over_its_gpu_health() -> None:
    whole = hb("n0", 5.0, ("a", 3, [0, 1])).model_copy(
        update={"gpus": [GpuHealth(index=0, healthy=False, reason="Xid 79")], "running": ["a"], "engine_ok": False}
    )
    slim = HeartbeatRanks.model_validate_json(whole.model_dump_json())
    assert (slim.node, slim.ts, slim.ranks) == ("n0", 5.0, whole.ranks)
    by_slim, by_whole = NodeReports(), NodeReports()
    by_slim.report(slim)
    by_whole.report(whole)
    assert by_slim.ranks == by_whole.ranks == {"n0": {"a": (3, (0, 1))}}
    assert by_slim.lingering({}) == {"n0": {0, 1}}
