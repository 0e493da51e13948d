"""`oneplus sim run` and `oneplus sim fgd` end to end on tiny inputs, and their errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from oneplus_queueing.config import default_config
from typer.testing import CliRunner, Result

from oneplus.cli.sim import app

runner = CliRunner()
CLUSTER = """name: tiny
fabric: {nodes_per_leaf: 2, leaves_per_spine: 2, nic_gbps_per_gpu: 400, oversubscription: 2.0}
node_groups:
  - {prefix: h100, count: 4, topology: h100_sxm_8gpu_nvswitch_nv18}
"""


@pytest.fixture
def cluster(tmp_path: Path) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(CLUSTER)
    return path


def run(cluster: Path, trace: Path, *options: str) -> Result:
    """`oneplus sim run --cluster C --trace T OPTIONS…`."""
    return runner.invoke(app, ["run", "--cluster", str(cluster), "--trace", str(trace), *options])


def test_run_writes_the_report_and_four_plots(tmp_path: Path, cluster: Path, philly_small: Path) -> None:
    out, plots = tmp_path / "r.json", tmp_path / "plots"
    options = ["--policy", "oneplus,k8s-default", "--max-jobs", "60", "--seed", "3", "--json", str(out)]
    res = run(cluster, philly_small, *options, "--plot", str(plots))
    assert res.exit_code == 0, res.output
    report = json.loads(out.read_text())
    assert list(report["policies"]) == ["oneplus", "k8s-default"]
    assert report["policies"]["oneplus"]["jobs"] == 60
    assert set(report["rules"]) == {"seed", "priority", "checkpoint", "ranks", "comm_fraction"}
    assert sorted(p.name for p in plots.iterdir()) == [
        "gpu_heatmap.png",
        "gpus_allocated.png",
        "queue_length.png",
        "wait_cdf_by_size.png",
    ]
    assert all(p.stat().st_size > 5000 for p in plots.iterdir())


def test_run_refuses_unknown_policies_and_missing_files(tmp_path: Path, cluster: Path, philly_small: Path) -> None:
    out = str(tmp_path / "r.json")
    res = run(cluster, philly_small, "--policy", "yarn", "--json", out)
    assert res.exit_code == 2 and "unknown yarn" in res.output
    missing = tmp_path / ("a-folder-with-a-name-long-enough-to-fold-an-eighty-column-line" * 2) / "none.csv"
    res = run(cluster, missing, "--json", out)
    # One line however long the path: a folded error cannot be grepped or copied.
    assert res.exit_code == 2 and f"{missing}: no such trace file" in res.output
    res = run(cluster, philly_small, "--window", "9:3", "--json", out)
    assert res.exit_code == 2 and "START < END" in res.output


def test_fgd_writes_the_mean_allocation_and_the_series(tmp_path: Path) -> None:
    nodes = tmp_path / "n.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,32000,65536,2,T4\nn1,64000,131072,4,V100M16\n")
    pods = tmp_path / "p.csv"
    pods.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,"
        "scheduled_time\na,2000,1024,1,300,,LS,Running,0,1,0\nb,4000,1024,1,1000,,BE,Running,0,1,0\n"
    )
    out = tmp_path / "f.json"
    res = runner.invoke(app, ["fgd", "--nodes", str(nodes), "--pods", str(pods), "--seeds", "1-3", "--json", str(out)])
    assert res.exit_code == 0, res.output
    rep = json.loads(out.read_text())
    assert rep["policy"] == "oneplus" and rep["seeds"] == [1, 2, 3]
    assert rep["gpu_alloc_pct"] == rep["policies"]["oneplus"]["gpu_alloc_pct"]
    assert rep["policies"]["fgd"]["series"]
    idle = rep["policies"]["oneplus"]["idle_at_end_pct"]
    assert set(idle) == {"shared_gpu_remainders", "whole_gpus", "stranded", "remainders_no_share_fits"}
    assert "stranded" in res.output  # the table's column (rich may wrap its header)
    bad = runner.invoke(app, ["fgd", "--nodes", str(nodes), "--pods", str(pods), "--seeds", "x", "--json", str(out)])
    assert bad.exit_code == 2 and "--seeds" in bad.output


def test_a_queue_config_file_is_merged_over_the_oneplus_policys_own_and_recorded_in_the_report(
    tmp_path: Path, cluster: Path, philly_small: Path
) -> None:
    base = ["--policy", "oneplus", "--max-jobs", "40"]
    res = run(cluster, philly_small, *base, "--json", str(tmp_path / "default.json"))
    assert res.exit_code == 0, res.output
    default = json.loads((tmp_path / "default.json").read_text())["oneplus_queue_config"]
    assert set(default["priority_classes"]) == {"low", "normal", "high"}
    # Everything but the trace's priority classes is the live solver's default queue config.
    live = default_config().model_dump(mode="json")
    assert {k: v for k, v in default.items() if k not in ("priority_classes", "default_priority_class")} == {
        k: v for k, v in live.items() if k not in ("priority_classes", "default_priority_class")
    }

    knobs = tmp_path / "knobs.yaml"
    knobs.write_text("job_size: {weight: 0}\nbackfill: {min_age_reserve_s: 3600}\n")
    res = run(cluster, philly_small, *base, "--queue-config", str(knobs), "--json", str(tmp_path / "tuned.json"))
    assert res.exit_code == 0, res.output
    tuned = json.loads((tmp_path / "tuned.json").read_text())["oneplus_queue_config"]
    assert tuned["job_size"]["weight"] == 0 and tuned["backfill"]["min_age_reserve_s"] == 3600
    assert tuned["backfill"]["scan_limit"] == default["backfill"]["scan_limit"], "keys not named keep their value"
    assert tuned["priority_classes"] == default["priority_classes"]


def test_a_bad_queue_config_file_is_refused_before_anything_runs(
    tmp_path: Path, cluster: Path, philly_small: Path
) -> None:
    out = str(tmp_path / "r.json")
    cases = {
        "job_size: {weight: -1}\n": "job_size.weight: Input should be greater than or equal to 0",
        "queues: [{name: research}]\n": "unknown queue 'default'; known queues: research",
        "default_priority_class: urgent\n": "default_priority_class 'urgent' is not one of the priority_classes",
        "- 1\n": "must hold a mapping of queue-config keys, got list",
        "job_size: {weight: [\n": "is not valid YAML",
    }
    for i, (text, message) in enumerate(cases.items()):
        path = tmp_path / f"bad{i}.yaml"
        path.write_text(text)
        res = run(cluster, philly_small, "--json", out, "--queue-config", str(path))
        assert res.exit_code == 2 and message in res.output, (text, res.output)
    res = run(cluster, philly_small, "--json", out, "--queue-config", str(tmp_path / "none.yaml"))
    assert res.exit_code == 2 and "cannot read" in res.output
    assert not (tmp_path / "r.json").exists()
