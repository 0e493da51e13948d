"""Trace and cluster loaders, the seeded trace rule, and the errors bad input gets."""

from __future__ import annotations

from pathlib import Path

import pytest
from oneplus_sim.cluster import ClusterError, load_cluster
from oneplus_sim.trace import TraceError, TraceRules, cut, load_trace, parse_window, split_ranks
from sim_helpers import DATA


def test_philly_loads_in_submit_order_with_virtual_clusters() -> None:
    t = load_trace(DATA / "philly" / "philly.csv")
    assert t.source == "philly"
    assert len(t.jobs) + t.dropped["zero_duration"] == 82_247
    submits = [j.submit_s for j in t.jobs[:5000]]
    assert submits == sorted(submits)
    assert {j.vc for j in t.jobs[:200]} >= {"6214e9"}
    assert max(j.gpus for j in t.jobs) >= 64


def test_tiresias_and_openb_traces_load() -> None:
    t = load_trace(DATA / "tiresias" / "60_job.csv")
    assert len(t.jobs) == 60 and t.jobs[0].job_id == "tiresias-0" and t.jobs[1].gpus == 8
    o = load_trace(DATA / "openb" / "openb_pod_list_default.csv")
    shares = [j for j in o.jobs if j.gpu_milli]
    assert shares and all(0 < j.gpus < 1 for j in shares)
    assert {j.qos for j in o.jobs} >= {"LS", "BE"}


def test_window_max_jobs_and_load_cut_the_trace() -> None:
    jobs = load_trace(DATA / "philly" / "philly.csv").jobs
    sel = cut(jobs, (100, 300), max_jobs=50, load=2.0)
    assert len(sel) == 50 and sel[0].submit_s == 0
    assert sel[-1].submit_s == pytest.approx((jobs[149].submit_s - jobs[100].submit_s) / 2)
    assert parse_window("60000:80000") == (60000, 80000)


@pytest.mark.parametrize(
    ("window", "max_jobs", "load", "message"),
    [
        ((5, 5), None, 1.0, "START < END"),
        ((10**7, 10**7 + 1), None, 1.0, "only"),
        (None, 0, 1.0, "max-jobs"),
        (None, None, 0.0, "load"),
    ],
)
def test_bad_cuts_are_refused(window: tuple[int, int] | None, max_jobs: int | None, load: float, message: str) -> None:
    jobs = load_trace(DATA / "tiresias" / "60_job.csv").jobs
    with pytest.raises(TraceError, match=message):
        cut(jobs, window, max_jobs, load)


def test_bad_window_text_is_refused() -> None:
    with pytest.raises(TraceError, match="START:END"):
        parse_window("10-20")


def test_bad_trace_files_name_the_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("timestamp,duration,num_gpus,gpu_time,cluster\n2017-10-09 07:01:55,sixty,1,66,vc\n")
    with pytest.raises(TraceError, match=r"bad.csv:2: column 'duration' must be a number"):
        load_trace(bad)
    bad.write_text("a,b,c\n1,2,3\n")
    with pytest.raises(TraceError, match="unknown trace format"):
        load_trace(bad)
    with pytest.raises(TraceError, match="no such trace file"):
        load_trace(tmp_path / "missing.csv")


def test_rank_rule_splits_only_jobs_bigger_than_a_node() -> None:
    jobs = load_trace(DATA / "tiresias" / "60_job.csv").jobs
    j = jobs[0]
    for n, expect in ((4, (1, 4)), (8, (1, 8)), (32, (4, 8)), (12, (2, 6))):
        j.gpus = float(n)
        assert split_ranks(j, 8) == expect


def test_trace_rule_is_seeded_and_documented(philly_small: Path) -> None:
    def assign(seed: int) -> list[tuple[str, float | None, float]]:
        jobs = cut(load_trace(philly_small).jobs, max_jobs=300)
        TraceRules(seed=seed).apply(jobs, 8)
        return [(j.priority_class, j.checkpoint_interval_s, j.comm_fraction) for j in jobs]

    assert assign(3) == assign(3)
    assert assign(3) != assign(4)
    classes = {c for c, _, _ in assign(3)}
    assert classes <= {"low", "normal", "high"}
    text = TraceRules(seed=3).describe()
    assert set(text) == {"seed", "priority", "checkpoint", "ranks", "comm_fraction"}
    multi = [f for c, _, f in assign(3) if f]
    assert multi and all(0.1 <= f <= 0.5 for f in multi)


def test_clusters_from_yaml_tiresias_and_openb() -> None:
    repo = DATA.parents[1]
    h = load_cluster(repo / "bench" / "clusters" / "h100_512.yaml")
    assert (h.total_gpus, len(h.leaves), h.oversubscription) == (512, 8, 2.0)
    t = load_cluster(DATA / "tiresias" / "n160g8.csv")
    assert (len(t.nodes), t.total_gpus, len(t.leaves)) == (160, 1280, 5)
    assert "PCIe" in t.notes[0]
    o = load_cluster(DATA / "openb" / "openb_node_list_gpu_node.csv")
    assert o.total_gpus == 6212 and len(o.nodes) == 1213


def test_bad_cluster_files_are_refused(tmp_path: Path) -> None:
    bad = tmp_path / "c.csv"
    bad.write_text("num_switch,num_node_p_switch,num_gpu_p_node\n2,x,8\n")
    with pytest.raises(ClusterError, match=r"c.csv:2: column 'num_node_p_switch' must be a number"):
        load_cluster(bad)
    bad.write_text("x,y\n1,2\n")
    with pytest.raises(ClusterError, match="unknown cluster format"):
        load_cluster(bad)
    y = tmp_path / "c.yaml"
    y.write_text("name: x\nnode_groups: []\n")
    with pytest.raises(ClusterError, match="node_groups"):
        load_cluster(y)
