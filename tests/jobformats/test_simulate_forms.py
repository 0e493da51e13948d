"""A simulated duration set with the inputs users have: `--simulate-s` on `submit` and `sbatch`, `#ONEPLUS
--simulate-s=N` in a batch script, the `oneplus.io/simulate-s` annotation of a Kubeflow manifest; bad values are one
line naming the value and where it was."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from oneplus_jobformats.errors import JobFormatError
from oneplus_jobformats.load import load_job_document
from typer.testing import CliRunner

from oneplus.cli.app import app

SCRIPT = """#!/bin/bash
#SBATCH --gpus=2
#ONEPLUS --simulate-s=30
srun python train.py
#ONEPLUS --simulate-s=99
"""

PYTORCHJOB = """apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata:
  name: mnist
  labels: {kueue.x-k8s.io/queue-name: user-queue}
  annotations: {oneplus.io/simulate-s: "%s"}
spec:
  pytorchReplicaSpecs:
    Master:
      replicas: 1
      template:
        spec:
          containers:
          - name: pytorch
            image: pytorch:latest
            command: [torchrun, train.py]
            resources: {limits: {nvidia.com/gpu: 1}}
"""


def test_the_sbatch_comment_form_sets_the_duration_and_only_before_the_first_command() -> None:
    spec = load_job_document(SCRIPT, filename="ft.sh").spec
    assert spec.simulate is not None and spec.simulate.duration_s == 30  # the line after `srun` is not a directive
    plain = load_job_document(SCRIPT.replace("#ONEPLUS --simulate-s=30\n", ""), filename="ft.sh").spec
    assert plain.simulate is None
    spaced = load_job_document(SCRIPT.replace("--simulate-s=30", "--simulate-s 45"), filename="ft.sh").spec
    assert spaced.simulate is not None and spaced.simulate.duration_s == 45


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("#ONEPLUS --simulate-s=soon", "ft.sh: line 3: #ONEPLUS --simulate-s: 'soon' is not a number of seconds"),
        ("#ONEPLUS --simulate-s=-1", "ft.sh: line 3: #ONEPLUS --simulate-s: '-1' must be between 0 and 604800 seconds"),
        ("#ONEPLUS --simulate-s", "ft.sh: line 3: --simulate-s needs a value (seconds)"),
        ("#ONEPLUS --sim=3", "ft.sh: line 3: unknown #ONEPLUS option '--sim=3'; the one known is --simulate-s=SECONDS"),
    ],
)
def test_a_bad_sbatch_comment_is_one_line_naming_it(line: str, message: str) -> None:
    with pytest.raises(JobFormatError) as exc:
        load_job_document(SCRIPT.replace("#ONEPLUS --simulate-s=30", line), filename="ft.sh")
    assert str(exc.value) == message


def test_the_kubeflow_annotation_sets_the_duration_and_is_not_reported_unused() -> None:
    tr = load_job_document(PYTORCHJOB % "12.5", filename="job.yaml")
    assert tr.spec.simulate is not None and tr.spec.simulate.duration_s == 12.5
    assert not [w for w in tr.warnings if "simulate" in w]
    with pytest.raises(JobFormatError) as exc:
        load_job_document(PYTORCHJOB % "ten", filename="job.yaml")
    assert "metadata.annotations" in str(exc.value) and "'ten' is not a number of seconds" in str(exc.value)


def test_submit_and_sbatch_take_simulate_s_and_it_wins(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(PYTORCHJOB % "12.5")
    script = tmp_path / "ft.sh"
    script.write_text(SCRIPT)
    out = CliRunner().invoke(app, ["submit", "-f", str(job), "--simulate-s", "300", "--dry-run", "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["spec"]["simulate"]["duration_s"] == 300
    out = CliRunner().invoke(app, ["sbatch", "--simulate-s", "7", "--dry-run", "--json", str(script)])
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["spec"]["simulate"]["duration_s"] == 7
    out = CliRunner().invoke(app, ["sbatch", "--dry-run", "--json", str(script)])
    assert json.loads(out.stdout)["spec"]["simulate"]["duration_s"] == 30
    bad = CliRunner().invoke(app, ["submit", "-f", str(job), "--simulate-s", "1e9", "--dry-run"])
    assert bad.exit_code == 2
    assert bad.stderr.strip() == "error: --simulate-s: '1e9' must be between 0 and 604800 seconds"
    bad = CliRunner().invoke(app, ["sbatch", "--simulate-s", "x", "--dry-run", str(script)])
    assert bad.exit_code == 2 and bad.stderr.strip() == "sbatch: error: --simulate-s: 'x' is not a number of seconds"
