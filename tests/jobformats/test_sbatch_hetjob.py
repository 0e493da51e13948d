"""Heterogeneous sbatch jobs (`#SBATCH hetjob`, `sbatch [options0] : [options1] script`): one job of components,
each with its own shape; an empty component refused in one line naming it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from oneplus_jobformats import JobFormatError
from oneplus_jobformats.sbatch import parse_sbatch
from oneplus_jobformats.sbatch_options import split_command_line
from oneplus_jobformats.summary import dry_run_summary
from typer.testing import CliRunner

from oneplus.cli.slurm import app

SCRIPT = """#!/bin/bash
#SBATCH --job-name=rl --time=1:00:00 --partition=train
#SBATCH --ntasks=1 --cpus-per-task=4 --mem=16G
#SBATCH hetjob
#SBATCH --nodes=2 --ntasks-per-node=8 --gpus-per-node=8 --switches=1 --time=2:00:00
#SBATCH -C h100
srun --het-group=1 python train.py
"""


def parse(script: str = SCRIPT, cli: list[str] | None = None) -> Any:
    return parse_sbatch(script, cli or [], filename="rl.sh", submit_dir="")


def shape(spec: Any, n: int) -> tuple[int, float, float, int]:
    c = spec.components[n]
    return c.ranks, c.resources.gpus, c.resources.cpus, c.resources.memory_mb


def test_script_components_each_keep_their_own_shape_and_topology() -> None:
    tr = parse()
    spec = tr.spec
    assert spec.components is not None and len(spec.components) == 2
    assert shape(spec, 0) == (1, 0.001, 4, 16384)
    assert shape(spec, 1) == (16, 1, 1, 2048)  # --mem (per node) propagates to the next component, as Slurm does
    assert spec.components[1].topology.nodes == 2 and spec.components[1].topology.max_leaves == 1
    assert spec.components[1].constraint == "h100" and spec.components[0].constraint is None
    assert spec.ranks == 17 and spec.resources == spec.components[0].resources and spec.total_gpus == 16.001
    assert (spec.name, spec.queue, spec.time_limit_s) == ("rl", "train", 3600)
    assert spec.slurm is not None and (spec.slurm.ntasks, spec.slurm.cpus_per_task) == (1, 4)
    assert spec.components[1].slurm is not None and spec.components[1].slurm.ntasks_per_node == 8
    # A job option a later component gives again, differently, is named: the job has one time limit.
    assert any(w.startswith("line 5: --time=2:00:00: OnePlus runs a heterogeneous job as one job") for w in tr.warnings)
    assert "component 0 asks for no GPU" in " ".join(tr.warnings)


def test_packjob_is_the_old_name_of_hetjob() -> None:
    spec = parse(SCRIPT.replace("#SBATCH hetjob", "#SBATCH packjob")).spec
    assert spec.components is not None and [c.ranks for c in spec.components] == [1, 16]


def test_command_line_components_are_split_at_colons() -> None:
    argv = ["--parsable", "-n1", ":", "-N2", "--gpus-per-node=8", "job.sh", "a", ":", "b"]
    options, script, args = split_command_line(argv)
    assert (options, script, args) == (
        ["--parsable", "-n1", ":", "-N2", "--gpus-per-node=8"],
        "job.sh",
        ["a", ":", "b"],
    )
    spec = parse("#!/bin/sh\nsrun x\n", options).spec
    assert spec.components is not None and [(c.ranks, c.resources.gpus) for c in spec.components] == [
        (1, 0.001),
        (2, 8),
    ]


def test_command_line_components_override_the_scripts_of_the_same_index() -> None:
    spec = parse(SCRIPT, ["--ntasks=2", ":", "--nodes=1"]).spec
    assert spec.components is not None
    assert spec.components[0].ranks == 2 and spec.components[1].ranks == 8  # 1 node x 8 tasks of one GPU


@pytest.mark.parametrize(
    ("script", "cli", "said"),
    [
        ("#!/bin/sh\n#SBATCH -n1\n#SBATCH hetjob\n#SBATCH hetjob\n#SBATCH -n2\nsrun x\n", [],
         r"rl.sh: line 3: #SBATCH hetjob: heterogeneous job component 1 is empty: give it its #SBATCH options"),
        ("#!/bin/sh\n#SBATCH -n1\n#SBATCH hetjob\nsrun x\n", [],
         r"line 3: #SBATCH hetjob: heterogeneous job component 1 is empty"),
        ("#!/bin/sh\n#SBATCH hetjob\n#SBATCH -n2\nsrun x\n", [], r"heterogeneous job component 0 is empty"),
        ("#!/bin/sh\nsrun x\n", ["-n1", ":"], r"command line: heterogeneous job component 1 is empty: give its "
         r"options between the ':' words"),
        ("#!/bin/sh\nsrun x\n", ["-n1", ":", ":", "-n2"], r"heterogeneous job component 1 is empty"),
        ("#!/bin/sh\n#SBATCH -n1\n#SBATCH hetjob -n2\nsrun x\n", [],
         r"line 3: #SBATCH hetjob stands alone on its line \(found '-n2'\)"),
        ("#!/bin/sh\n#SBATCH -n1 --array=0-3\n#SBATCH hetjob\n#SBATCH -n2\nsrun x\n", [],
         r"line 2: --array=0-3: a heterogeneous job cannot be a job array"),
        ("#!/bin/sh\n#SBATCH -n1\n#SBATCH hetjob\n#SBATCH --nodes=0\nsrun x\n", [],
         r"line 4: --nodes=0: the node count must be at least 1"),
    ],
)  # fmt: skip
def test_bad_components_are_refused_in_one_line_naming_them(script: str, cli: list[str], said: str) -> None:
    with pytest.raises(JobFormatError, match=said) as caught:
        parse(script, cli)
    assert "\n" not in str(caught.value)


def test_a_plain_job_has_no_components_and_its_record_is_unchanged() -> None:
    plain = parse("#!/bin/sh\n#SBATCH -N2 --gpus-per-node=8\nsrun x\n").spec
    assert plain.components is None and "components" not in plain.model_dump(mode="json")
    assert "components" not in dry_run_summary(plain, [])


def test_dry_run_shows_each_component(tmp_path: Path) -> None:
    summary = dry_run_summary(parse().spec, [])
    got = [(c["component"], c["ranks"], c["first_rank"], c["gpus_per_rank"], c["total_gpus"]) for c in
           summary["components"]]  # fmt: skip
    assert got == [(0, 1, 0, 0.001, 0.001), (1, 16, 1, 1, 16)]
    assert summary["components"][1]["topology"]["max_leaves"] == 1 and summary["components"][1]["constraint"] == "h100"
    path = tmp_path / "h.sh"
    path.write_text("#!/bin/sh\nsrun --het-group=1 hostname\n")
    result = CliRunner().invoke(
        app, ["sbatch", "--dry-run", "--json", "-n1", ":", "-N2", "--gpus-per-node=8", str(path)]
    )
    assert result.exit_code == 0, result.output
    line = next(x for x in result.output.splitlines() if x.startswith("{"))
    shown = json.loads(line)["components"]
    assert [(c["ranks"], c["gpus_per_rank"]) for c in shown] == [(1, 0.001), (2, 8)]
    bad = CliRunner().invoke(app, ["sbatch", "--dry-run", "-n1", ":", str(path)])
    assert bad.exit_code == 2 and "heterogeneous job component 1 is empty" in bad.output
