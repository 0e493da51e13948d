"""`oneplus place`: the JSON the checks read, the plain output, and every bad input named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from oneplus.cli.place import app

runner = CliRunner()

CLUSTER = """\
name: lab
fabric: {nodes_per_leaf: 4, leaves_per_spine: 2, nic_gbps_per_gpu: 400}
node_groups:
  - {prefix: hgx, count: 8, topology: h100_sxm_8gpu_nvswitch_nv18}
  - {prefix: dgx1, count: 4, topology: dgx1_v100}
"""


@pytest.fixture
def cluster(tmp_path: Path) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(CLUSTER)
    return path


def run_json(*args: str) -> dict[str, object]:
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)  # type: ignore[no-any-return]


def test_gpus_flag_places_and_prints_the_decision_keys(cluster: Path) -> None:
    out = run_json("--cluster", str(cluster), "--gpus", "16", "--gpus-per-rank", "8")
    assert out["placed"] is True
    assert {"placed", "ranks", "ring_gbps", "domain", "solver"} <= set(out)
    assert out["domain"] == "leaf" and out["solver"] == "greedy"
    ranks = out["ranks"]
    assert isinstance(ranks, list) and len(ranks) == 2
    assert all({"rank", "node", "gpus"} <= set(r) and len(r["gpus"]) == 8 for r in ranks)


def test_job_file_with_a_model_restriction_lands_on_that_model(cluster: Path, tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("name: v100-job\nranks: 1\nresources: {gpus: 4, gpu_models: [V100]}\n")
    out = run_json("--cluster", str(cluster), "--job", str(job))
    assert out["placed"] is True
    ranks = out["ranks"]
    assert isinstance(ranks, list) and ranks[0]["node"].startswith("dgx1-")
    assert sorted(ranks[0]["gpus"]) in ([0, 1, 2, 3], [4, 5, 6, 7])


def test_fill_is_seeded_and_an_impossible_job_prints_an_explanation(cluster: Path) -> None:
    a = run_json("--cluster", str(cluster), "--gpus", "4", "--fill", "7:60")
    b = run_json("--cluster", str(cluster), "--gpus", "4", "--fill", "7:60")
    assert a["ranks"] == b["ranks"] and a["fill"] == {"seed": 7, "pct": 60.0, "free_gpus": 38}
    out = run_json("--cluster", str(cluster), "--gpus", "128", "--gpus-per-rank", "8")
    assert out["placed"] is False
    assert isinstance(out["explanation"], str) and out["explanation"].startswith("needs 128 GPUs")


def test_plain_output_shows_ranks_and_ring(cluster: Path) -> None:
    result = runner.invoke(app, ["--cluster", str(cluster), "--gpus", "2"])
    assert result.exit_code == 0, result.output
    assert "ring 450 GB/s" in result.output and "hgx-00" in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gpus", "16", "--gpus-per-rank", "3"], "not a multiple of --gpus-per-rank 3"),
        (["--gpus", "2.5"], "must be a whole number"),
        (["--gpus", "4", "--fill", "60"], "--fill must be SEED:PCT"),
        (["--gpus", "4", "--fill", "1:150"], "between 0 and 100"),
        ([], "give exactly one of --job JOB.yaml or --gpus N"),
        (["--gpus-per-rank", "2", "--job", "x.yaml"], "--gpus-per-rank goes with --gpus"),
    ],
)
def test_bad_flags_exit_2_with_the_reason(cluster: Path, args: list[str], message: str) -> None:
    result = runner.invoke(app, ["--cluster", str(cluster), *args])
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())


def test_bad_job_file_and_bad_cluster_are_named(cluster: Path, tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("name: x\nresources: {gpus: 1}\ncolour: blue\n")
    result = runner.invoke(app, ["--cluster", str(cluster), "--job", str(job)])
    assert result.exit_code == 2 and "colour" in result.output
    missing = runner.invoke(app, ["--cluster", str(tmp_path / "nope.yaml"), "--gpus", "1"])
    assert missing.exit_code == 2 and "cannot read" in missing.output


def test_a_gpu_share_is_one_rank(cluster: Path) -> None:
    out = run_json("--cluster", str(cluster), "--gpus", "0.25")
    ranks = out["ranks"]
    assert out["placed"] is True and isinstance(ranks, list) and ranks[0]["gpu_milli"] == 250


NVL72 = Path(__file__).resolve().parents[2] / "bench" / "clusters" / "nvl72_2rack_h100.yaml"
JOBS = Path(__file__).resolve().parents[2] / "bench" / "jobs"


@pytest.mark.parametrize(("job", "ranks"), [("tp16.yaml", 4), ("rack72.yaml", 18), ("dp2_tp32.yaml", 16)])
def test_tp_groups_over_trays_are_placed_inside_nvl72_domains(job: str, ranks: int) -> None:
    """Issue 41's check: TP-16, a whole-rack 72-GPU gang and DP-2 x TP-32 on two NVL72 racks and eight H100s."""
    out = run_json("--cluster", str(NVL72), "--job", str(JOBS / job))
    assert out["placed"] is True
    assert out["domain"] == "nvlink" and out["ring_gbps"] == 900.0
    assert len(out["ranks"]) == ranks  # type: ignore[arg-type]
