"""A site's QOS, partitions and accounts mapped onto priority classes, queues and teams (ONEPLUS_SITE_FILE)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from oneplus_contracts import NodeRecord
from oneplus_jobformats.errors import JobFormatError
from oneplus_jobformats.sbatch import parse_sbatch
from oneplus_jobformats.site import SiteMap, SiteMapError, load_site, site_from_env
from oneplus_jobformats.slurm_tables import render_sinfo
from oneplus_topology.presets import load_preset
from typer.testing import CliRunner

from oneplus.cli.app import app

# The directives of BigScience's and IDRIS' Jean Zay scripts: site QOS names and an account with '@'.
SCRIPT = """#!/bin/bash
#SBATCH --job-name=tr11-176B
#SBATCH --partition=gpu_p5
#SBATCH --qos=qos_gpu-gc
#SBATCH --account=six@a100
#SBATCH --nodes=2
#SBATCH --gres=gpu:8
srun python train.py
"""

SITE = """\
qos: {qos_gpu-gc: high, qos_gpu-t3: 250}
partitions: {gpu_p5: research}
accounts: {six@a100: bigscience}
"""


def site_file(tmp_path: Path, text: str = SITE) -> Path:
    p = tmp_path / "site.yaml"
    p.write_text(text, encoding="utf-8")
    return p


def test_the_sites_names_become_queue_priority_and_team(tmp_path: Path) -> None:
    spec = parse_sbatch(SCRIPT, site=load_site(site_file(tmp_path))).spec
    assert (spec.queue, spec.priority_class, spec.team) == ("research", "high", "bigscience")
    assert spec.labels["slurm/account"] == "six@a100"
    numeric = parse_sbatch(SCRIPT, ["--qos=qos_gpu-t3"], site=load_site(site_file(tmp_path))).spec
    assert numeric.priority == 250


def test_without_a_site_file_an_unknown_qos_is_refused_and_says_how_to_map_it() -> None:
    with pytest.raises(JobFormatError, match="ONEPLUS_SITE_FILE"):
        parse_sbatch(SCRIPT, site=SiteMap())


def test_the_environment_names_the_site_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONEPLUS_SITE_FILE", str(site_file(tmp_path)))
    assert parse_sbatch(SCRIPT).spec.queue == "research"
    monkeypatch.setenv("ONEPLUS_SITE_FILE", str(tmp_path / "missing.yaml"))
    with pytest.raises(JobFormatError, match=r"missing\.yaml: cannot be read"):
        parse_sbatch(SCRIPT)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("- a\n- b\n", "must be a mapping"),
        ("qos: {regular: nonsense}\n", "unknown priority class 'nonsense'"),
        ("partitions: [a]\n", "partitions"),
        ("qeues: {}\n", "qeues"),
        ("qos: {a: [\n", "not YAML"),
    ],
)
def test_a_bad_site_file_is_refused_naming_the_entry(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(SiteMapError, match=message):
        load_site(site_file(tmp_path, text))


def test_sinfo_lists_the_queues_in_the_sites_names_as_partitions(tmp_path: Path) -> None:
    site = load_site(site_file(tmp_path))
    nodes = [NodeRecord(topology=load_preset("h100_sxm_8gpu_nvswitch_nv18", f"h100-{i}")) for i in range(2)]
    out = render_sinfo(nodes, [], [site.partition_of(q) for q in ("default", "research")])
    lines = out.splitlines()
    assert lines[0].split()[0] == "PARTITION"
    assert {line.split()[0] for line in lines[1:]} == {"default", "gpu_p5"}  # research is the site's gpu_p5
    assert all("h100-[0-1]" in line for line in lines[1:])


def test_sbatch_dry_run_takes_the_site_file(tmp_path: Path) -> None:
    script = tmp_path / "train.sbatch"
    script.write_text(SCRIPT, encoding="utf-8")
    res = CliRunner().invoke(app, ["sbatch", "--site", str(site_file(tmp_path)), "--dry-run", "--json", str(script)])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    spec = out.get("spec", out)
    assert (spec["queue"], spec["team"]) == ("research", "bigscience")
    bad = CliRunner().invoke(app, ["sbatch", "--site", str(tmp_path / "nope.yaml"), "--dry-run", str(script)])
    assert bad.exit_code == 2 and "cannot be read" in bad.output


def test_site_from_env_is_empty_when_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ONEPLUS_SITE_FILE", raising=False)
    assert site_from_env() == SiteMap()
