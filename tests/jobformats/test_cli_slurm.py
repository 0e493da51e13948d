"""`oneplus sbatch/squeue/scancel/sinfo`: dry runs print the normalised spec; live commands go through the client."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from oneplus_contracts import GpuInfo, JobRecord, JobSpec, NodeRecord, NodeTopology, SubmitReply
from typer.testing import CliRunner

from oneplus import client as client_module
from oneplus.cli.slurm import app

SCRIPT = """#!/bin/bash
#SBATCH --job-name=ft
#SBATCH --nodes=2
#SBATCH --gpus-per-node=8
#SBATCH --time=1:00:00
#SBATCH --partition=train
#SBATCH --qos=high
#SBATCH --switches=1
#SBATCH --signal=USR1@90
#SBATCH --mail-user=a@b
srun python ft.py
"""


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "ft.sh"
    path.write_text(SCRIPT)
    return path


def run(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


def test_sbatch_dry_run_json_prints_the_documented_keys(script: Path):
    result = run("sbatch", str(script), "--dry-run", "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["name"] == "ft"
    assert (summary["ranks"], summary["gpus_per_rank"], summary["total_gpus"]) == (2, 8, 16)
    assert (summary["queue"], summary["priority"], summary["max_leaves"]) == ("train", 10_000, 1)
    assert (summary["time_limit_s"], summary["checkpoint_signal"], summary["checkpoint_grace_s"]) == (
        3600,
        "SIGUSR1",
        90,
    )
    assert summary["warnings"] == ["line 10: --mail-user=a@b: not used by OnePlus"]


def test_sbatch_options_on_the_command_line_override_the_script(script: Path):
    result = run("sbatch", "-N4", "--time", "10", "--gpus-per-node=4", str(script), "--dry-run", "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert (summary["ranks"], summary["gpus_per_rank"], summary["time_limit_s"]) == (4, 4, 600)


def test_sbatch_bad_script_exits_2_with_the_line(tmp_path: Path):
    bad = tmp_path / "bad.sh"
    bad.write_text("#!/bin/bash\n#SBATCH --gres=gpu:2\n#SBATCH --gpus-per-node=2\n")
    result = run("sbatch", str(bad), "--dry-run")
    assert result.exit_code == 2
    assert "line 3: --gpus-per-node=2: --gres=gpu and --gpus-per-node are mutually exclusive" in result.stderr


def test_sbatch_missing_file_is_reported():
    result = run("sbatch", "/nonexistent/x.sh", "--dry-run")
    assert result.exit_code == 2
    assert "Unable to open file /nonexistent/x.sh" in result.stderr


class FakeClient:
    def __init__(self) -> None:
        self.submitted: list[JobSpec] = []
        self.cancelled: list[str] = []
        self.listed: list[dict[str, Any]] = []

    async def submit(self, spec: JobSpec, *, msg_id: str | None = None, source: str = "cli") -> SubmitReply:
        self.submitted.append(spec)
        return SubmitReply(ok=True, job_id="j-0001")

    async def list_jobs(self, team: str | None = None, **filters: Any) -> list[JobRecord]:
        self.listed.append(filters)
        spec = JobSpec.model_validate({"name": "wait", "user": "ann", "queue": "train", "resources": {"gpus": 1}})
        return [
            JobRecord(job_id="j-0001", spec=spec, state="ACCEPTED", submitted_ts=0, updated_ts=0, reason="Priority")
        ]

    async def queue(self) -> list[dict[str, Any]]:
        # The solver's queue rows: squeue takes a pending job's reason from here, as `oneplus queue` does.
        return [{"job_id": "j-0001", "st": "PD", "reason": "Priority", "message": "behind higher-priority jobs"}]

    async def cancel(self, job_id: str, team: str | None = None) -> dict[str, Any]:
        if job_id == "nope":
            raise client_module.PlatformError("no job 'nope'")
        self.cancelled.append(job_id)
        return {"job_id": job_id, "state": "ACCEPTED"}

    async def nodes(self) -> list[NodeRecord]:
        topo = NodeTopology(node="h100-0", gpu_model="H100", gpus=[GpuInfo(index=0)])
        return [NodeRecord(topology=topo)]

    async def ops(self, subject: str, payload: dict[str, Any] | None = None) -> Any:
        assert subject == "oneplus.ops.queues.list"  # sinfo's partitions are the queues
        return [{"queue": "default"}, {"queue": "train"}]


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeClient:
    fake = FakeClient()

    @asynccontextmanager
    async def connect(nats_url: str | None = None, **_: Any) -> AsyncIterator[FakeClient]:
        yield fake

    monkeypatch.setattr(client_module.OnePlusClient, "connect", connect)
    return fake


def test_sbatch_submits_and_prints_slurms_line(script: Path, fake: FakeClient):
    result = run("sbatch", str(script))
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "Submitted batch job j-0001"
    assert fake.submitted[0].total_gpus == 16
    assert run("sbatch", "--parsable", str(script)).stdout.strip() == "j-0001"


def test_squeue_scancel_sinfo_through_the_client(fake: FakeClient):
    out = run("squeue").stdout.splitlines()
    assert out[0].split() == ["JOBID", "PARTITION", "NAME", "USER", "ST", "TIME", "NODES", "NODELIST(REASON)"]
    assert out[1].split() == ["j-0001", "train", "wait", "ann", "PD", "0:00", "1", "(Priority)"]
    assert run("squeue", "-u", "someone-else").stdout.count("\n") == 1
    # squeue asks for the live jobs only (like Slurm's, it does not read the accounting archive) unless -t says more.
    assert "RUNNING" in fake.listed[0]["state"] and "SUCCEEDED" not in fake.listed[0]["state"]
    run("squeue", "-t", "all")
    assert fake.listed[-1]["state"] is None
    for pending in ("PD", "PENDING", "pending"):  # Slurm's code and its long name
        assert "j-0001" in run("squeue", "-t", pending).stdout
    assert "j-0001" not in run("squeue", "-t", "RUNNING").stdout
    result = run("scancel", "j-0001", "nope")
    assert result.exit_code == 1
    assert fake.cancelled == ["j-0001"]
    assert "Kill job error on job id nope" in result.stderr
    sinfo = [line.split() for line in run("sinfo").stdout.splitlines()[1:]]
    assert sinfo == [
        ["default", "up", "infinite", "1", "idle", "h100-0"],
        ["train", "up", "infinite", "1", "idle", "h100-0"],
    ]
    assert "unrecognized argument(s): --bogus" in run("squeue", "--bogus").stderr
