"""A real MLflow server (SQL backend) delivers signed webhooks to a running intake: its `test_webhook` and a real
`model_version.created` from registering a model version both become the evaluation job of the template.

MLflow is not a project dependency (it is heavy and pins older libraries): the test runs the `mlflow` executable
named by ONEPLUS_MLFLOW_BIN, or the one on PATH, and is skipped without one. Install it beside the project:
    uv venv /tmp/mlflow-venv --python .venv/bin/python && uv pip install --python /tmp/mlflow-venv mlflow
    export ONEPLUS_MLFLOW_BIN=/tmp/mlflow-venv/bin/mlflow
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from intake_process import IntakeProcess, webhook_intake

from oneplus.client import OnePlusClient
from oneplus.devstack import free_port

SECRET = "mlflow-webhook-secret"
TEMPLATES = """\
"*":
  model_version.created:
    name: eval-{name}-v{version}
    team: ml
    resources: {gpus: 1}
    command: [python, eval.py, --model, "models:/{name}/{version}", --source, "{source}"]
"""


def _own_group() -> None:
    os.setsid()
    with contextlib.suppress(Exception):  # and go when pytest goes, even on SIGKILL
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def mlflow_bin() -> str | None:
    named = os.environ.get("ONEPLUS_MLFLOW_BIN")
    if named:
        return named if Path(named).exists() else None
    return shutil.which("mlflow")


class MlflowServer:
    def __init__(self, binary: str, workdir: Path) -> None:
        self.binary = binary
        self.workdir = workdir
        self.port = free_port()
        self.proc: Any = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 240.0) -> MlflowServer:
        env = {
            **os.environ,
            # Our receiver is http on loopback; MLflow refuses both unless told otherwise (SSRF protection).
            "MLFLOW_WEBHOOK_ALLOWED_SCHEMES": "http,https",
            "MLFLOW_WEBHOOK_ALLOW_PRIVATE_IPS": "true",
            "MLFLOW_WEBHOOK_CACHE_TTL": "1",
        }
        argv = [self.binary, "server", "--backend-store-uri", f"sqlite:///{self.workdir / 'mlflow.db'}"]
        argv += ["--host", "127.0.0.1", "--port", str(self.port), "--workers", "1"]
        argv += ["--default-artifact-root", str(self.workdir / "artifacts")]
        log = open(self.workdir / "mlflow.log", "ab")  # noqa: SIM115 - the child owns it
        # Its own process group: the server forks uvicorn and huey workers that must go when it goes.
        self.proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, preexec_fn=_own_group
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited {self.proc.returncode}:\n{self.logs()[-3000:]}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as resp:
                    if resp.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            time.sleep(0.5)
        raise TimeoutError(f"mlflow server not ready in {timeout:.0f}s:\n{self.logs()[-3000:]}")

    def logs(self) -> str:
        log = self.workdir / "mlflow.log"
        return log.read_text(errors="replace") if log.exists() else ""

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(15)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        req = urllib.request.Request(
            f"{self.url}/api/2.0/mlflow/{path}",
            data=json.dumps(body).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                answer: dict[str, Any] = json.loads(resp.read())
                return answer
        except urllib.error.HTTPError as err:
            raise AssertionError(f"MLflow {path}: {err.code} {err.read()[:500]!r}") from None


@pytest.fixture(scope="module")
def mlflow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    binary = mlflow_bin()
    if binary is None:
        pytest.skip("no MLflow server: set ONEPLUS_MLFLOW_BIN or put `mlflow` (full package, >= 3.3) on PATH")
    server = MlflowServer(binary, Path(tmp_path_factory.mktemp("mlflow"))).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
async def intake(mlflow: MlflowServer, servers, tmp_path_factory) -> AsyncIterator[IntakeProcess]:  # type: ignore[no-untyped-def]
    workdir = Path(tmp_path_factory.mktemp("mlflow-intake"))
    async with webhook_intake(servers.nats_url, servers.redis_url, workdir, TEMPLATES, SECRET) as proc:
        yield proc


async def wait_for_job(client: OnePlusClient, name: str, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [r for r in await client.list_jobs() if r.spec.name == name]
        if found:
            return found
        await asyncio.sleep(0.5)
    raise AssertionError(f"no job {name!r} within {timeout:.0f}s")


async def test_mlflow_test_webhook_and_a_real_model_version_start_the_evaluation_job(
    mlflow: MlflowServer, intake: IntakeProcess
) -> None:
    # The webhook exists before the first registry event, so MLflow's per-event webhook cache cannot miss it.
    created = await asyncio.to_thread(
        mlflow.call,
        "webhooks",
        {
            "name": "oneplus",
            "url": f"{intake.base_url}/webhooks/mlflow",
            "events": [{"entity": "MODEL_VERSION", "action": "CREATED"}],
            "secret": SECRET,
        },
    )
    webhook_id = created["webhook"]["webhook_id"]

    tested = await asyncio.to_thread(mlflow.call, f"webhooks/{webhook_id}/test", {})
    result = tested["result"]
    assert result.get("success") is True and result.get("response_status") == 200, (result, intake.logs()[-2000:])
    answer = json.loads(result["response_body"])
    (job,) = answer["jobs"]
    assert answer["event"] == "model_version.created" and job["ok"] and job["name"] == "eval-example_model-v1"

    await asyncio.to_thread(mlflow.call, "registered-models/create", {"name": "resnet50"})
    version = await asyncio.to_thread(
        mlflow.call, "model-versions/create", {"name": "resnet50", "source": "s3://bucket/models/resnet50/1"}
    )
    assert version["model_version"]["version"] == "1"

    async with OnePlusClient.connect(intake.nats_url) as client:
        (rec,) = await wait_for_job(client, "eval-resnet50-v1")
        (example,) = await wait_for_job(client, "eval-example_model-v1")
    assert rec.state == "ACCEPTED" and rec.source == "mlflow" and rec.spec.team == "ml"
    assert rec.spec.command == [
        "python",
        "eval.py",
        "--model",
        "models:/resnet50/1",
        "--source",
        "s3://bucket/models/resnet50/1",
    ]
    assert rec.spec.labels == {
        "mlflow/event": "model_version.created",
        "mlflow/model": "resnet50",
        "mlflow/version": "1",
    }
    assert example.job_id == job["job_id"]
    assert intake.alive()
