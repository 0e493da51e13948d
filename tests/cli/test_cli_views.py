"""The CLI starts fast and reads well: lazy imports, uncut tables, one-line connection errors, --json in the same
place, one pending-reason word for every view, one submitting user for every format."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from oneplus_contracts import GpuInfo, JobRecord, JobSpec, NodeRecord, NodeTopology, SubmitReply, subjects
from rich.console import Console
from typer.testing import CliRunner

from oneplus import client as client_module
from oneplus.cli import sim
from oneplus.cli.app import app
from oneplus.cli.render import Columns, pending_reason, reason_cell
from oneplus.client import submitting_user, with_submitter

LONG_ID = "j-8175dc9a1b2c3d4e5f60"

HEAVY = ("ortools", "pandas", "numpy", "matplotlib", "oneplus_sim", "oneplus_placement", "faststream", "opentelemetry")


def test_importing_the_cli_pulls_in_nothing_heavy():
    """A deterministic stand-in for start-up time: `oneplus --help` must not import the solver, pandas, the sim,
    nats-py or the pydantic models."""
    code = "import sys, json, oneplus.cli.app; print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded = set(json.loads(out))
    assert not loaded & {*HEAVY, "nats", "pydantic", "oneplus_contracts", "oneplus_jobformats", "aiohttp"}


def test_the_cli_copies_of_library_constants_are_current():
    from oneplus_jobformats.cloudevents import SUBMIT_EVENT_TYPE
    from oneplus_sim.fgd import POLICIES
    from oneplus_sim.policies import POLICY_NAMES

    assert tuple(POLICY_NAMES) == sim.POLICY_NAMES
    assert POLICIES == sim.SCORERS
    assert client_module.SUBMIT_EVENT_TYPE == SUBMIT_EVENT_TYPE
    lazily = client_module._load_subjects()
    for name in ("SUBMIT", "OPS_JOB_SHOW", "OPS_QUEUE_LIST", "OPS_JOB_EXPLAIN", "OPS_NODE_LIST", "OPS_NODE_DRAIN"):
        assert getattr(lazily, name) == getattr(subjects, name)


def test_submitting_user_order():
    assert submitting_user({"ONEPLUS_USER": "ops", "USER": "alice", "LOGNAME": "x"}) == "ops"
    assert submitting_user({"USER": "alice", "LOGNAME": "x"}) == "alice"
    assert submitting_user({"USER": " ", "LOGNAME": "bob"}) == "bob"
    spec = JobSpec.model_validate({"name": "a", "resources": {"gpus": 1}})
    assert with_submitter(spec, {"USER": "alice"}).user == "alice"
    named = JobSpec.model_validate({"name": "a", "user": "carol", "resources": {"gpus": 1}})
    assert with_submitter(named, {"USER": "alice"}).user == "carol"


def test_pending_reason_is_one_word_for_every_view():
    assert pending_reason("Topology", "Topology: no leaf has 16 free GPUs") == "Topology"
    assert pending_reason(None, "whatever") == "None"
    assert reason_cell({"reason": "Priority", "message": "behind j-1"}) == "(Priority)"
    assert reason_cell({}) == "(None)"


def test_columns_never_cut_ids_piped_or_on_a_narrow_terminal():
    t = Columns("queue", ("JOBID", "STATE", "NODELIST(REASON)"))
    t.add_row(LONG_ID, "SUCCEEDED", "h100-0,h100-1,a100-0,l40s-0 and a long reason " * 2)
    for console in (
        Console(width=80, record=True, force_terminal=False),
        Console(width=40, record=True, force_terminal=True),
    ):
        t.print(console)
        text = console.export_text()
        assert LONG_ID in text and "SUCCEEDED" in text and "…" not in text
    wide = Console(width=300, record=True, force_terminal=True)
    t.print(wide)
    assert "┃" in wide.export_text() or "│" in wide.export_text()  # a rich table where it fits


def _record(job_id: str, state: str, user: str = "ann", reason: str | None = None, **extra: Any) -> JobRecord:
    spec = JobSpec.model_validate({"name": "wait", "user": user, "queue": "train", "resources": {"gpus": 8}})
    return JobRecord(job_id=job_id, spec=spec, state=state, submitted_ts=0, updated_ts=0, reason=reason, **extra)


class FakeClient:
    """The client as the CLI sees it: a pending job the solver says waits for Topology."""

    def __init__(self) -> None:
        self.submitted: list[JobSpec] = []
        self.ops_calls: list[str] = []

    async def queue(self) -> list[dict[str, Any]]:
        return [
            {
                "job_id": LONG_ID,
                "queue": "train",
                "name": "wait",
                "user": "ann",
                "st": "PD",
                "time": "0:00",
                "gpus": "8",
                "where": "(Topology)",
                "reason": "Topology",
                "message": "no NVLink domain has 8 free GPUs",
            }
        ]

    async def list_jobs(self, team: str | None = None, **_: Any) -> list[JobRecord]:
        return [_record(LONG_ID, "ACCEPTED")]

    async def reservations(self) -> list[dict[str, Any]]:
        row = {"nodes": "gpu[01-02]", "start": "2027-01-15T09:00:00Z", "end": "2027-01-15T11:00:00Z", "users": "",
               "teams": "ops", "accounts": "", "maint": True}  # fmt: skip
        return [
            row | {"name": "maint", "state": "WAITING", "gpus": 16},
            row | {"name": "old", "state": "ENDED", "gpus": None},
        ]

    async def ops(self, subject: str, payload: dict[str, Any] | None = None) -> Any:
        self.ops_calls.append(subject)
        if subject == subjects.OPS_JOB_SHOW:
            if (payload or {}).get("job_id") != LONG_ID:
                raise client_module.PlatformError(f"no job {(payload or {}).get('job_id')!r}")
            return _record(LONG_ID, "ACCEPTED").model_dump(mode="json")
        raise AssertionError(subject)

    async def explain(self, job_id: str) -> dict[str, Any]:
        return {
            "job_id": job_id,
            "pending": True,
            "reason": "Topology",
            "message": "Topology: no NVLink domain has 8 free GPUs",
        }

    async def submit(self, spec: JobSpec, **_: Any) -> SubmitReply:
        self.submitted.append(spec)
        return SubmitReply(ok=True, job_id="j-0001")

    async def nodes(self) -> list[NodeRecord]:
        topo = NodeTopology(node="h100-0", gpu_model="H100", gpus=[GpuInfo(index=0)])
        return [NodeRecord(topology=topo)]


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeClient:
    fake = FakeClient()

    @asynccontextmanager
    async def connect(nats_url: str | None = None, **_: Any) -> AsyncIterator[FakeClient]:
        yield fake

    monkeypatch.setattr(client_module.OnePlusClient, "connect", connect)
    return fake


def run(*args: str, env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(app, list(args), env=env)


def test_queue_squeue_and_jobs_show_agree_on_the_reason_and_keep_the_id_whole(fake: FakeClient):
    queue = run("queue")
    assert queue.exit_code == 0, queue.output
    squeue = run("squeue")
    assert squeue.exit_code == 0, squeue.output
    show = run("jobs", "show", LONG_ID)
    assert show.exit_code == 0, show.output
    for out in (queue.stdout, squeue.stdout, show.stdout):
        assert LONG_ID in out and "(Topology)" in out and "…" not in out
    # Then the reservations active or to come (an ENDED one is not), and how many pending jobs wait on each.
    section = queue.stdout.split("RESERVATION", 1)[1].splitlines()
    assert [line.split() for line in section[1:] if line.strip()] == [
        ["maint", "WAITING", "gpu[01-02]", "16", "2027-01-15T09:00:00Z", "2027-01-15T11:00:00Z", "yes", "0"]
    ]
    assert "reason: Topology: no NVLink domain has 8 free GPUs" in show.stdout
    assert json.loads(run("jobs", "show", LONG_ID, "--json").stdout)["job_id"] == LONG_ID


def test_jobs_show_of_an_unknown_job_is_one_error_line(fake: FakeClient):
    result = run("jobs", "show", "nope")
    assert result.exit_code == 2
    assert result.stderr.strip() == "error: no job 'nope'"


def test_submit_and_sbatch_record_the_same_user(fake: FakeClient, tmp_path: Path):
    job = tmp_path / "job.yaml"
    job.write_text("name: a\nresources: {gpus: 1}\n")
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\n#SBATCH --gpus=1\nsrun true\n")
    env = {"USER": "alice", "ONEPLUS_USER": ""}
    assert run("submit", "-f", str(job), env=env).exit_code == 0
    assert run("sbatch", str(script), env=env).exit_code == 0
    assert [s.user for s in fake.submitted] == ["alice", "alice"]
    dry = run("submit", "-f", str(job), "--dry-run", "--json", env={"ONEPLUS_USER": "ops"})
    assert dry.exit_code == 0, dry.output


def test_json_is_accepted_after_the_subcommand_and_before_it(fake: FakeClient):
    after = run("nodes", "show", "h100-0", "--json")
    assert after.exit_code == 0, after.output
    before = run("nodes", "--json", "show", "h100-0")
    assert before.exit_code == 0, before.output
    assert json.loads(after.stdout)["topology"]["node"] == "h100-0" == json.loads(before.stdout)["topology"]["node"]
    missing = run("nodes", "show", "h200-9", "--json")
    assert missing.exit_code == 2 and "no node 'h200-9'" in missing.stderr


def test_an_unreachable_nats_is_one_line():
    for args in (["queue"], ["jobs", "show", "x"], ["squeue"]):
        result = run(*args, "--nats", "nats://127.0.0.1:1")
        assert result.exit_code != 0
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        assert "cannot reach NATS at nats://127.0.0.1:1" in lines[0]
        assert "Traceback" not in result.output


def test_jobs_show_says_how_each_share_runs_and_names_mig_instances(fake: FakeClient, monkeypatch: pytest.MonkeyPatch):
    from oneplus_contracts import Allocation, RankPlacement

    alloc = Allocation(
        ranks=[
            RankPlacement(rank=0, node="l40s-0", gpus=[3], gpu_milli=500, sharing="time-slice"),
            RankPlacement(rank=1, node="l40s-1", gpus=[0], gpu_milli=250, sharing="mps"),
            RankPlacement(rank=2, node="a100-0", gpus=[], mig=["MIG-0c4e8f6d-2a5b-5d3e-9f1c-7b2a4d6e8f01"]),
        ]
    )
    running = _record(LONG_ID, "RUNNING", allocation=alloc).model_dump(mode="json")

    async def ops(subject: str, payload: dict[str, Any] | None = None) -> Any:
        return running

    monkeypatch.setattr(fake, "ops", ops)
    out = run("jobs", "show", LONG_ID).stdout
    assert "rank 0: l40s-0 GPUs [3] (500/1000 each, time-slice: no isolation)" in out
    assert "rank 1: l40s-1 GPUs [0] (250/1000 each, MPS-isolated)" in out
    assert "rank 2: a100-0 MIG MIG-0c4e8f6d-2a5b-5d3e-9f1c-7b2a4d6e8f01" in out
