"""Elastic gangs in the simulator: the oneplus policy's own cycle starts them small, grows and shrinks them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from oneplus_sim.elastic import ElasticRuleError, make_elastic
from oneplus_sim.engine import Simulation
from oneplus_sim.policies.oneplus import OnePlusPolicy, sim_queue_config
from sim_helpers import h100, job
from test_sim_cli import CLUSTER
from typer.testing import CliRunner

from oneplus.cli.sim import app

# Victims and growing gangs have no minimum run time here (the scenarios last minutes, not hours), and a cycle runs
# at every event (no minimum interval), so that the times are exact.
CONFIG = sim_queue_config({"preemption": {"min_runtime_s": 0}})


def _trace():  # type: ignore[no-untyped-def]
    """A (4 GPUs, not preemptible) runs 0..1000; E (8 GPUs, elastic 1..2 ranks of 4) arrives at 1, 10,000 s of work."""
    jobs = [job("A", 0.0, 4, 1000.0, cls="high"), job("E", 1.0, 8, 10_000.0)]
    assert make_elastic(jobs, "half") == 2
    assert (jobs[1].ranks, jobs[1].gpus_per_rank, jobs[1].elastic_min, jobs[1].elastic_max) == (2, 4, 1, 2)
    jobs[0].elastic_min = jobs[0].elastic_max = 0  # A stays a fixed gang of one rank
    jobs[0].ranks, jobs[0].gpus_per_rank = 1, 4
    return jobs


def test_an_elastic_gang_starts_at_half_size_grows_when_gpus_free_and_ends_before_its_fixed_twin() -> None:
    elastic = Simulation(h100(1), _trace(), OnePlusPolicy(config=CONFIG, elastic=True, cycle_interval_s=0.0)).run()
    fixed_jobs = _trace()
    fixed_jobs[1].elastic_min = fixed_jobs[1].elastic_max = 0
    fixed = Simulation(h100(1), fixed_jobs, OnePlusPolicy(config=CONFIG, cycle_interval_s=0.0)).run()
    e = elastic.records["E"]
    assert e.first_start_s == 1.0 and [len(p) for p in e.placements] == [1, 2]  # 1 rank, then both after A ended
    assert elastic.counters["elastic_grows"] == 1 and e.preemptions == 0 and e.lost_gpu_s == 0
    # Half speed for 999 s (≈ 500 s of work), 30 s of checkpoint grace, then the 9,500 s left at full speed.
    assert e.finish_s is not None and e.finish_s == pytest.approx(1000 + 30 + 10_000 - 999 / 2, abs=1.0)
    assert fixed.records["E"].first_start_s == 1000.0
    assert e.finish_s < (fixed.records["E"].finish_s or 0)


def test_an_elastic_victim_shrinks_for_a_higher_priority_gang_and_goes_on() -> None:
    jobs = [job("E", 0.0, 8, 10_000.0, cls="low"), job("H", 100.0, 4, 500.0, cls="high")]
    make_elastic(jobs, "half")
    jobs[1].elastic_min = jobs[1].elastic_max = 0
    jobs[1].ranks, jobs[1].gpus_per_rank = 1, 4
    res = Simulation(h100(1), jobs, OnePlusPolicy(config=CONFIG, elastic=True, cycle_interval_s=0.0)).run()
    e, h = res.records["E"], res.records["H"]
    assert res.counters["elastic_shrinks"] == 1
    assert [len(p) for p in e.placements][:2] == [2, 1]  # it gave up one rank of 4 GPUs, not the gang
    assert h.first_start_s == pytest.approx(100 + 30)  # after the victim's checkpoint grace
    assert e.lost_gpu_s == 0  # it checkpointed at the signal


def test_an_unknown_elastic_rule_is_refused_naming_the_rules() -> None:
    with pytest.raises(ElasticRuleError, match=r"--elastic: unknown rule 'all'; choose from half"):
        make_elastic([job("A", 0.0, 4, 10.0)], "all")


def test_sim_run_elastic_reports_the_same_jobs_fixed_and_elastic_in_one_run(tmp_path: Path, philly_small: Path) -> None:
    cluster = tmp_path / "c.yaml"
    cluster.write_text(CLUSTER)
    out = tmp_path / "r.json"
    args = ["run", "--cluster", str(cluster), "--trace", str(philly_small), "--policy", "oneplus", "--max-jobs", "60"]
    res = CliRunner().invoke(app, [*args, "--load", "20", "--elastic", "half", "--json", str(out)])
    assert res.exit_code == 0, res.output
    report = json.loads(out.read_text())
    assert list(report["policies"]) == ["oneplus", "oneplus-elastic"]
    elastic = report["trace"]["elastic"]
    assert elastic["rule"] == "half" and elastic["jobs"] > 0 and "linearly" in elastic["description"]
    fixed, el = report["policies"]["oneplus"], report["policies"]["oneplus-elastic"]
    assert fixed["jobs"] == el["jobs"] == 60 and fixed["elastic_grows"] == fixed["elastic_shrinks"] == 0
    line = " ".join(res.output.split())
    assert f"avg JCT {fixed['avg_jct_s']} -> {el['avg_jct_s']} s" in line
    assert f"p95 wait of big jobs (>= 8 GPUs) {fixed['p95_wait_large_s']} -> {el['p95_wait_large_s']} s" in line


def test_sim_run_refuses_an_unknown_elastic_rule_or_elastic_without_oneplus(tmp_path: Path, philly_small: Path) -> None:
    cluster = tmp_path / "c.yaml"
    cluster.write_text(CLUSTER)
    args = ["run", "--cluster", str(cluster), "--trace", str(philly_small), "--json", str(tmp_path / "r.json")]
    res = CliRunner().invoke(app, [*args, "--elastic", "all"])
    assert res.exit_code == 2 and "--elastic: unknown rule 'all'; choose from half" in res.output
    res = CliRunner().invoke(app, [*args, "--policy", "k8s-default", "--elastic", "half"])
    assert res.exit_code == 2 and "--policy must include oneplus" in res.output
