"""Time limits of trace jobs: the seeded user-estimate model, the oracle, and the policies that read them."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest
from oneplus_sim.estimates import (
    DAY,
    ROUND_LIMITS_S,
    TIME_LIMIT_MODELS,
    UserEstimates,
    assign_time_limits,
)
from oneplus_sim.policies.oneplus import job_spec
from oneplus_sim.replay import ReplaySpec, prepare_jobs, run_replay
from oneplus_sim.trace import SimJob, TraceError, cut, load_trace
from sim_helpers import DATA, h100, job, simulate, start_times
from typer.testing import CliRunner

from oneplus.cli import sim as sim_cli

ROUND = {v for v, _ in ROUND_LIMITS_S} | {UserEstimates().max_limit_s}


@pytest.fixture(scope="module")
def philly_2000() -> list[SimJob]:
    """The first 2,000 Philly jobs in submit order, as the replays of docs/simulator.md cut them."""
    return cut(load_trace(DATA / "philly" / "philly.csv").jobs, max_jobs=2000)


def test_same_seed_same_limits_and_independent_of_the_window(philly_2000: list[SimJob]) -> None:
    model = UserEstimates(seed=7)
    first = [model.limit(j.job_id, j.duration_s) for j in philly_2000]
    again = [UserEstimates(seed=7).limit(j.job_id, j.duration_s) for j in philly_2000]
    other = [UserEstimates(seed=8).limit(j.job_id, j.duration_s) for j in philly_2000]
    assert first == again
    assert sum(a != b for a, b in zip(first, other, strict=True)) > 500  # the seed matters
    # A job's limit depends on the job and the seed only, not on which jobs were cut around it.
    later = cut(philly_2000, window=(1000, 2000))
    assert [model.limit(j.job_id, j.duration_s) for j in later] == first[1000:]


def test_limits_never_below_the_run_time_and_mostly_round(philly_2000: list[SimJob]) -> None:
    info = assign_time_limits(philly_2000, "user", 0)
    assert all(j.time_limit_s is not None and j.time_limit_s >= j.duration_s for j in philly_2000)
    ratios = [j.limit_s / j.duration_s for j in philly_2000]
    # The documented overestimate: users ask several times what they use (Philly's many short jobs: far more).
    assert statistics.median(ratios) > 2
    assert info["median_limit_over_runtime"] == pytest.approx(statistics.median(ratios), abs=1e-3)
    # Every limit is a round value: a listed one, or whole days for a job that ran longer than the site maximum
    # (2.9% of these first 2,000 jobs; 0.3% of the whole trace).
    assert all(j.limit_s in ROUND or (j.duration_s > 7 * DAY and j.limit_s % DAY == 0) for j in philly_2000)
    assert sum(1 for j in philly_2000 if j.limit_s in ROUND) / len(philly_2000) >= 0.95
    assert info["round_value_share"] == 1.0
    share_max = sum(1 for j in philly_2000 if j.limit_s == UserEstimates().max_limit_s) / len(philly_2000)
    assert 0.12 <= share_max <= 0.25  # max_share 0.15 plus the few long jobs whose guess exceeds 3 days
    assert info["model"] == "user" and info["seed"] == "0"


def test_long_and_edge_durations() -> None:
    model = UserEstimates(seed=1)
    assert model.limit("long", 7 * DAY + 1) == 8 * DAY  # over the site maximum: rounded up to whole days
    assert model.limit("max", 7 * DAY) == 7 * DAY
    for i in range(300):
        d = 1.0 + i * 1234.5
        limit = model.limit(f"j{i}", d)
        assert limit >= d and limit in ROUND


def test_oracle_limits_are_the_run_time(philly_2000: list[SimJob]) -> None:
    jobs = cut(philly_2000, max_jobs=50)
    info = assign_time_limits(jobs, "oracle", 0)
    assert info["model"] == "oracle" and "seed" not in info
    assert all(j.limit_s == j.duration_s for j in jobs)
    with pytest.raises(TraceError, match="--time-limits 'exact'"):
        assign_time_limits(jobs, "exact", 0)


def test_every_policy_replays_the_same_limits(philly_small: Path) -> None:
    spec = ReplaySpec(h100(4, 2), philly_small, ["k8s-default", "slurm-tree", "oneplus"], max_jobs=60, seed=3)
    replay = run_replay(spec)
    limits = {name: {k: r.job.time_limit_s for k, r in res.records.items()} for name, res in replay.results.items()}
    assert limits["k8s-default"] == limits["slurm-tree"] == limits["oneplus"]
    assert all(v is not None for v in limits["oneplus"].values())
    report_limits = replay.report["time_limits"]
    assert isinstance(report_limits, dict) and report_limits["model"] == "user" and report_limits["seed"] == "3"
    # prepare_jobs is what every policy copies: computed once, the same on a second call.
    again, _, _ = prepare_jobs(spec, h100(4, 2))
    assert {j.job_id: j.time_limit_s for j in again} == limits["oneplus"]


def test_oneplus_job_spec_carries_the_limit_not_the_run_time() -> None:
    j = job("a", 0, 2, 1000.0)
    assert job_spec(j, 30).time_limit_s == 1000
    j.time_limit_s = 3600.0
    assert job_spec(j, 30).time_limit_s == 3600


def _backfill_case(a_limit: float | None, c_limit: float | None) -> dict[str, float | None]:
    """One 8-GPU node. A (4 GPUs, runs 1,000 s) starts at 0; B (8 GPUs) arrives at 1 and is blocked: it gets the
    reservation at A's limit end; C (4 GPUs, runs 2,000 s) arrives at 2: the node is reserved, so C may backfill only
    if its limit ends before the reservation."""
    a, b, c = job("a", 0, 4, 1000.0), job("b", 1, 8, 500.0), job("c", 2, 4, 2000.0)
    a.time_limit_s, c.time_limit_s = a_limit, c_limit
    return start_times(simulate(h100(1), [a, b, c], "slurm-tree"))


def test_slurm_backfill_decides_by_the_limit_not_the_run_time() -> None:
    # Oracle: the reservation is at 1,000 (A's run time); C would end at 2,002 > 1,000: no backfill. B at 1,000.
    assert _backfill_case(None, None) == {"a": 0.0, "b": 1000.0, "c": 1500.0}
    # User limits: A asked 4 h, so the reservation is at 14,400; C asked 2 h and 2 + 7,200 <= 14,400: it backfills
    # at 2 and B, which needs the whole node, starts when both A and C have ended (2,002), not at 1,000.
    assert _backfill_case(4 * 3600.0, 2 * 3600.0) == {"a": 0.0, "b": 2002.0, "c": 2.0}
    # A's limit is still 4 h, but C asked 8 h: 2 + 28,800 > 14,400, no backfill although C would run only 2,000 s.
    assert _backfill_case(4 * 3600.0, 8 * 3600.0) == {"a": 0.0, "b": 1000.0, "c": 1500.0}


def test_cli_selects_the_model_and_the_report_says_which_ran(tmp_path: Path, philly_small: Path) -> None:
    assert tuple(TIME_LIMIT_MODELS) == sim_cli.TIME_LIMIT_MODELS
    cluster = tmp_path / "c.yaml"
    cluster.write_text(
        "name: tiny\nfabric: {nodes_per_leaf: 2, leaves_per_spine: 2, nic_gbps_per_gpu: 400, oversubscription: 2.0}\n"
        "node_groups:\n  - {prefix: h100, count: 4, topology: h100_sxm_8gpu_nvswitch_nv18}\n"
    )
    runner = CliRunner()
    base = ["run", "--cluster", str(cluster), "--trace", str(philly_small), "--policy", "slurm-tree"]
    for extra, model in (([], "user"), (["--time-limits", "oracle"], "oracle")):
        out = tmp_path / f"{model}.json"
        res = runner.invoke(sim_cli.app, [*base, "--max-jobs", "40", "--seed", "5", "--json", str(out), *extra])
        assert res.exit_code == 0, res.output
        report = json.loads(out.read_text())
        assert report["time_limits"]["model"] == model
        assert f"time limits: {model}" in res.output
        if model == "user":
            assert report["time_limits"]["seed"] == "5" and "seed 5" in res.output
            assert report["time_limits"]["median_limit_over_runtime"] > 2
        else:
            assert math.isclose(report["time_limits"]["median_limit_over_runtime"], 1.0)
    res = runner.invoke(sim_cli.app, [*base, "--time-limits", "exact", "--json", str(tmp_path / "x.json")])
    assert res.exit_code == 2 and "--time-limits: unknown 'exact'" in res.output
