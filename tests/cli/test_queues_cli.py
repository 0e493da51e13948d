"""`oneplus queues` (list), `queues list`, `queues show NAME`, `queues apply --dry-run`: what they print."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from oneplus import client as client_module
from oneplus.cli.app import app

SAMPLES = Path(__file__).parents[1] / "queueing" / "samples"
ROWS = [
    {"queue": "cluster-queue", "depth": 0, "guarantee_gpus": 16.0, "limit_gpus": 16.0, "used_gpus": 0.0},
    {"queue": "user-queue", "depth": 1, "guarantee_gpus": 0.0, "limit_gpus": None, "used_gpus": 1.0},
]


class Fake:
    stored: str | None = None

    async def ops(self, subject: str, payload: dict[str, Any] | None = None) -> Any:
        assert subject == "oneplus.ops.queues.list"
        return ROWS

    async def queue_config_text(self) -> str | None:
        return self.stored


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Fake:
    fake = Fake()

    @asynccontextmanager
    async def connect(nats_url: str | None = None, **_: Any) -> AsyncIterator[Fake]:
        yield fake

    monkeypatch.setattr(client_module.OnePlusClient, "connect", connect)
    return fake


def run(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


def test_queues_and_queues_list_print_the_same_table(fake: Fake) -> None:
    plain, listed = run("queues"), run("queues", "list")
    assert plain.exit_code == listed.exit_code == 0, plain.output
    assert plain.stdout == listed.stdout
    assert plain.stdout.splitlines()[0].split()[:3] == ["QUEUE", "GUARANTEE", "LIMIT"]
    assert "  user-queue" in plain.stdout  # a team under its organisation
    assert json.loads(run("queues", "--json").stdout) == ROWS == json.loads(run("queues", "list", "--json").stdout)


def test_queues_show_gives_the_configured_queue_and_its_use(fake: Fake) -> None:
    from oneplus_queueing.queuefile import load_queue_file

    fake.stored = load_queue_file((SAMPLES / "kueue_single_clusterqueue.yaml").read_text()).yaml_text
    shown = run("queues", "show", "user-queue")
    assert shown.exit_code == 0, shown.output
    assert "path: cluster-queue / user-queue" in shown.stdout and "GPU models: any" in shown.stdout
    assert "config from the `queues` bucket" in shown.stdout
    doc = json.loads(run("queues", "show", "cluster-queue", "--json").stdout)
    assert doc["config"]["guarantee_gpus"] == 16 and doc["config"]["children"] == ["user-queue"]
    missing = run("queues", "show", "nope")
    assert missing.exit_code == 2
    assert missing.stderr.strip() == "error: no queue 'nope'; known queues: cluster-queue, user-queue"
    fake.stored = None
    assert "config from the services' own config" in run("queues", "show", "user-queue").stdout


def test_apply_dry_run_prints_the_config_and_stores_nothing(fake: Fake) -> None:
    result = run("queues", "apply", "-f", str(SAMPLES / "kueue_cohort_flavors.yaml"), "--dry-run", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["format"] == "kueue" and doc["stored"] is False
    assert doc["leaf_queues"] == ["a-queue", "b-queue", "default"]
    missing = run("queues", "apply", "-f", "/nonexistent.yaml")
    assert missing.exit_code == 2 and "cannot read /nonexistent.yaml" in missing.stderr


def test_a_shared_gpu_is_counted_once_as_the_dashboard_counts_it_and_has_no_ring() -> None:
    """4 whole GPUs held and one GPU half held on an 8-GPU node: 3 free (the shared GPU is not free for a whole-GPU
    job), 1 shared; the CLI said 4/8 while the dashboard said 3. A share's placement says so, not "ring 0 GB/s"."""
    from oneplus_contracts import Allocation, GpuInfo, JobRecord, JobSpec, NodeRecord, NodeTopology, RankPlacement

    from oneplus.cli.app import ring_words
    from oneplus.cli.render import gpu_counts, gpu_holds

    node = NodeRecord(topology=NodeTopology(node="n", gpu_model="L40S", gpus=[GpuInfo(index=i) for i in range(8)]))

    def job(job_id: str, gpus: list[int], milli: int = 0) -> JobRecord:
        spec = JobSpec.model_validate({"name": job_id, "resources": {"gpus": milli / 1000 if milli else len(gpus)}})
        alloc = Allocation(ranks=[RankPlacement(rank=0, node="n", gpus=gpus, gpu_milli=milli)])
        return JobRecord(job_id=job_id, spec=spec, state="RUNNING", submitted_ts=0, updated_ts=0, allocation=alloc)

    holds = gpu_holds([job("whole", [0, 1, 2, 3]), job("half", [4], 500)])
    counts = gpu_counts(node, holds["n"])
    assert (counts.total, counts.held, counts.free, counts.shared) == (8, 5, 3, 1)
    assert counts.cell() == "3/8 (1 shared)"
    cordoned = node.model_copy(update={"cordoned": True})
    assert gpu_counts(cordoned, holds["n"]).free == 0  # not schedulable: nothing free, as on the dashboard
    half = job("half", [4], 500).allocation
    assert half is not None
    assert ring_words(half.model_dump(mode="json")) == "a share of one GPU (50%), no ring"
    assert ring_words({"ring_gbps": 0, "ranks": [{"gpus": [0]}]}) == "one GPU, no ring"
    assert ring_words({"ring_gbps": 300.0}) == "ring 300 GB/s"
