"""`oneplus queues apply -f`: a Kueue file stored in the `queues` bucket is followed by a running intake without a
restart, so a Kueue job's `kueue.x-k8s.io/queue-name` finds its queue and gets its queue's GPU models; a bad file is
refused one line per problem and stores nothing."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from intake_process import IntakeProcess, fresh_bus
from nats.aio.client import Client
from oneplus_contracts import JobSpec, subjects
from oneplus_jobformats.load import load_job_document
from oneplus_stores.clusterview import QUEUES_KEY
from typer.testing import CliRunner

from oneplus import client as client_module
from oneplus.cli.app import app as cli
from oneplus.client import OnePlusClient

SAMPLES = Path(__file__).parents[1] / "queueing" / "samples"
KUEUE_JOB = """apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata:
  name: pytorch-simple
  labels: {kueue.x-k8s.io/queue-name: %s}
spec:
  pytorchReplicaSpecs:
    Master:
      replicas: 1
      template:
        spec:
          containers:
          - {name: pytorch, image: pytorch:1, command: [torchrun, train.py], resources: {limits: {nvidia.com/gpu: 1}}}
"""


@pytest.fixture(scope="module")
async def intake(servers, tmp_path_factory) -> AsyncIterator[IntakeProcess]:  # type: ignore[no-untyped-def]
    await fresh_bus(servers.nats_url)
    proc = await IntakeProcess(
        servers.nats_url,
        Path(tmp_path_factory.mktemp("intake-queues")),
        env={"ONEPLUS_METRICS_PORT": "0"},
        redis_url=servers.redis_url,
    ).start()
    try:
        yield proc
    finally:
        proc.stop()


def kueue_job(queue: str) -> JobSpec:
    return load_job_document(KUEUE_JOB % queue, filename="job.yaml").spec


async def submit(url: str, spec: JobSpec) -> tuple[bool, str | None, JobSpec | None]:
    async with OnePlusClient.connect(url, timeout=10) as c:
        reply = await c.submit(spec, msg_id=uuid.uuid4().hex)
        if not reply.ok:
            return False, reply.error, None
        assert reply.job_id
        return True, None, (await c.get_job(reply.job_id)).spec


async def test_a_kueue_file_applied_makes_a_kueue_jobs_queue_exist_at_once(intake: IntakeProcess, bus: Client) -> None:
    ok, error, _ = await submit(intake.nats_url, kueue_job("user-queue"))
    assert not ok and error == "unknown queue 'user-queue'; known queues: default"
    result = await asyncio.to_thread(
        CliRunner().invoke,
        cli,
        ["queues", "apply", "-f", str(SAMPLES / "kueue_single_clusterqueue.yaml"), "--nats", intake.nats_url],
    )
    assert result.exit_code == 0, result.output
    assert "applied: Kueue objects" in result.stdout and "jobs go to user-queue, default" in result.stdout
    assert "note: " in result.stderr and "spec.namespaceSelector: not used by OnePlus" in result.stderr
    stored = await (await bus.jetstream().key_value(subjects.QUEUES_KV)).get(QUEUES_KEY)
    assert b"name: user-queue" in stored.value
    for _ in range(50):  # the intake follows the bucket; no restart
        ok, error, _ = await submit(intake.nats_url, kueue_job("user-queue"))
        if ok:
            break
        await asyncio.sleep(0.1)
    assert ok, error
    # Flavors: a queue whose ClusterQueue has an A100 flavor gives its jobs that model.
    result = await asyncio.to_thread(
        CliRunner().invoke,
        cli,
        ["queues", "apply", "-f", str(SAMPLES / "kueue_cohort_flavors.yaml"), "--nats", intake.nats_url],
    )
    assert result.exit_code == 0, result.output
    for _ in range(50):
        ok, error, spec = await submit(intake.nats_url, kueue_job("b-queue"))
        if ok:
            break
        await asyncio.sleep(0.1)
    assert ok and spec is not None, error
    assert spec.resources.gpu_models == ["A100"]


async def test_a_bad_queue_file_is_one_line_per_problem_and_stores_nothing(
    intake: IntakeProcess, bus: Client, tmp_path: Path
) -> None:
    kv = await bus.jetstream().key_value(subjects.QUEUES_KV)
    before = await kv.get(QUEUES_KEY)
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: kueue.x-k8s.io/v1beta1\nkind: ClusterQueue\nmetadata: {name: cq}\n"
        "spec: {cohrt: x, queueingStrategy: Random}\n"
    )
    result = await asyncio.to_thread(CliRunner().invoke, cli, ["queues", "apply", "-f", str(bad), "--nats", "x"])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 2 and all(line.startswith(f"error: {bad}: document 1 (ClusterQueue cq): ") for line in lines)
    assert (await kv.get(QUEUES_KEY)).revision == before.revision


def test_the_cli_and_the_services_use_the_same_bucket_key() -> None:
    assert client_module.QUEUES_CONFIG_KEY == QUEUES_KEY


async def test_the_intake_counts_submissions_http_requests_and_jobs_by_state_and_queue(intake: IntakeProcess) -> None:
    """What a Prometheus user looks for: submissions accepted/refused by reason and source, HTTP requests by route
    and code, jobs by state and queue (after the tests above: refusals for an unknown queue, then acceptances)."""
    import re
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    assert (await asyncio.to_thread(intake.get, "/healthz"))[0] == 200
    assert (await asyncio.to_thread(intake.get, "/v1/jobs/j-nope"))[0] == 404
    url = re.search(r"metrics on (http://\S+/metrics)", intake.logs())
    assert url, intake.logs()[-2000:]
    text = await asyncio.to_thread(lambda: urllib.request.urlopen(url.group(1), timeout=10).read().decode())
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }

    def value(name: str, **labels: str) -> float:
        return samples.get((name, tuple(sorted(labels.items()))), 0.0)

    refused = value("oneplus_submissions_total", outcome="refused", reason="unknown_queue", source="cli")
    assert refused >= 1
    assert value("oneplus_submissions_total", outcome="accepted", reason="none", source="cli") >= 2
    assert value("oneplus_http_requests_total", route="/healthz", method="GET", code="200") >= 1
    assert value("oneplus_http_requests_total", route="/v1/jobs/{job_id}", method="GET", code="404") == 1
    by_queue = {dict(k[1]).get("queue") for k in samples if k[0] == "oneplus_jobs"}
    assert {"user-queue", "b-queue"} <= by_queue, by_queue
