"""A running intake (its own process, real NATS) fed hypothesis-made bad submissions and webhook deliveries:
every answer is a clear error, the process lives on, and a job accepted before is untouched afterwards."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
import uuid
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import nats
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from intake_process import IntakeProcess, fresh_bus
from nats.aio.client import Client
from nats.js.api import DeliverPolicy
from oneplus_contracts import JobSpec, SubmitReply, subjects
from oneplus_jobformats import encode_binary, encode_structured
from oneplus_jobformats.mlflow import sign

T = TypeVar("T")
SECRET = "fuzz-secret"
TEMPLATES = "fuzzed:\n  model_version.created:\n    name: eval-{name}-{version}\n    resources: {gpus: 1}\n"
# ONEPLUS_FUZZ_EXAMPLES raises every count for a long hunt; the defaults keep the file to seconds on 2 cores.
SCALE = float(os.environ.get("ONEPLUS_FUZZ_EXAMPLES", "150")) / 150


def fuzz(n: int) -> settings:
    return settings(max_examples=max(5, int(n * SCALE)), deadline=None, suppress_health_check=list(HealthCheck))


class LoopThread:
    """An event loop of its own, so hypothesis's synchronous examples can talk NATS."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 15.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


class Harness:
    def __init__(self, intake: IntakeProcess, runner: LoopThread, nc: Client) -> None:
        self.intake = intake
        self.runner = runner
        self.nc = nc

    def submit(self, body: bytes, headers: dict[str, str] | None = None) -> SubmitReply:
        msg = self.runner.run(self.nc.request(subjects.SUBMIT, body, timeout=10, headers=headers))
        return SubmitReply.model_validate_json(msg.data)

    def ops(self, subject: str, payload: dict[str, Any]) -> dict[str, Any]:
        msg = self.runner.run(self.nc.request(subject, json.dumps(payload).encode(), timeout=10))
        answer: dict[str, Any] = json.loads(msg.data)
        return answer

    def history(self, job_id: str) -> list[bytes]:
        async def read() -> list[bytes]:
            js = self.nc.jetstream()
            sub = await js.subscribe(
                subjects.job_events_of(job_id), ordered_consumer=True, deliver_policy=DeliverPolicy.ALL
            )
            out = []
            try:
                while True:
                    try:
                        out.append((await sub.next_msg(timeout=0.5)).data)
                    except nats.errors.TimeoutError:
                        return out
            finally:
                await sub.unsubscribe()

        return self.runner.run(read())

    def snapshot(self, job_id: str) -> tuple[dict[str, Any], list[bytes]]:
        return self.ops(subjects.OPS_JOB_SHOW, {"job_id": job_id})["result"], self.history(job_id)


@pytest.fixture(scope="module")
def harness(servers, tmp_path_factory) -> Iterator[Harness]:  # type: ignore[no-untyped-def]
    workdir = Path(tmp_path_factory.mktemp("fuzz-intake"))
    (workdir / "templates.yaml").write_text(TEMPLATES)
    env = {"ONEPLUS_MLFLOW_SECRET": SECRET, "ONEPLUS_MLFLOW_TEMPLATES": str(workdir / "templates.yaml")}
    runner = LoopThread()
    runner.run(fresh_bus(servers.nats_url))
    intake = runner.run(
        IntakeProcess(servers.nats_url, workdir, env=env, redis_url=servers.redis_url).start(), timeout=90
    )
    nc = runner.run(nats.connect(servers.nats_url))
    try:
        yield Harness(intake, runner, nc)
    finally:
        runner.run(nc.close())
        intake.stop()
        runner.close()


VALID_ID = f"ci-valid-{uuid.uuid4().hex}"
VALID = JobSpec.model_validate({"name": "keep-me", "ranks": 2, "resources": {"gpus": 4}, "command": ["run"]})


@pytest.fixture(scope="module")
def valid_job(harness: Harness) -> str:
    headers, body = encode_structured(VALID, "/ci/valid", VALID_ID)
    reply = harness.submit(body, headers)
    assert reply.ok and reply.job_id, reply.error
    return reply.job_id


def assert_clear(error: str | None) -> None:
    assert error and error.strip(), "an error reply must say what is wrong"
    assert "Traceback" not in error and len(error) < 4000, error


# --- strategies ------------------------------------------------------------------------------------

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**20), 10**20),
    st.floats(allow_nan=False),
    st.text(max_size=16),
    st.sampled_from(["1.0", "0.3", "", "%", "%C0%A0", "1e999", "application/json", "text/x-shellscript", "✓"]),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
)
FIELDS = ["name", "team", "ranks", "resources", "queue", "priority", "topology", "image", "command", "bogus"]
spec_fields = st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=6)


@st.composite
def structured_events(draw: st.DrawFn) -> tuple[dict[str, str], bytes]:
    event: dict[str, Any] = {
        "specversion": draw(st.sampled_from(["1.0", "0.3", 1, None])),
        "id": draw(st.one_of(st.text(max_size=12), st.integers(), st.just(VALID_ID))),
        "source": draw(st.one_of(st.text(max_size=12), st.none())),
        "type": draw(st.text(max_size=12)),
    }
    for key in draw(st.lists(st.sampled_from(list(event)), max_size=2)):
        event.pop(key, None)
    choice = draw(st.sampled_from(["fields", "json", "b64", "both", "extra"]))
    if choice == "fields":
        event["data"] = draw(spec_fields)
    elif choice == "json":
        event["data"] = draw(json_values)
    elif choice == "b64":
        event["data_base64"] = draw(st.one_of(st.text(max_size=12), st.integers()))
    elif choice == "both":
        event["data"], event["data_base64"] = {}, ""
    else:
        event[draw(st.text(min_size=1, max_size=25))] = draw(json_values)
    content_type = draw(st.sampled_from(["application/cloudevents+json", "application/cloudevents-batch+json"]))
    return {"content-type": content_type}, json.dumps(event).encode()


@st.composite
def binary_events(draw: st.DrawFn) -> tuple[dict[str, str], bytes]:
    headers, _ = encode_binary(VALID, "/ci/fuzz", draw(st.text(min_size=1, max_size=12)))
    for _ in range(draw(st.integers(1, 3))):
        name = draw(st.sampled_from([*headers, "ce-x", "ce-BadName", "ce-averyveryverylongattributename"]))
        value = draw(
            st.one_of(
                st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), max_size=12),
                st.sampled_from(["%", "%zz", "%C0%A0", '"quoted"', "2026-13-45T99:99:99Z"]),
            )
        )
        headers[name] = value
    if draw(st.booleans()):
        headers.pop(draw(st.sampled_from(["ce-id", "ce-source", "ce-type", "ce-specversion"])), None)
    body = draw(st.one_of(st.binary(max_size=64), st.builds(lambda d: json.dumps(d).encode(), spec_fields)))
    return headers, body


sbatch_scripts = st.builds(
    lambda lines, cmd: ("#!/bin/bash\n" + "\n".join(f"#SBATCH {line}" for line in lines) + f"\n{cmd}\n").encode(),
    st.lists(
        st.one_of(
            st.sampled_from(
                [
                    "--nodes=0",
                    "--gpus-per-node=abc",
                    "--gres=gpu:2 --gpus-per-node=2",
                    "--time=99:99:99:99",
                    "--mem=1Z",
                    "--ntasks=-1",
                    "--array=1-3",
                    "--frobnicate",
                    "-N",
                    "--switches=x@y",
                ]
            ),
            st.text(max_size=20),
        ),
        min_size=1,
        max_size=4,
    ),
    st.text(max_size=10),
)
plain_bodies = st.one_of(
    st.binary(max_size=80),
    st.text(max_size=80).map(str.encode),
    st.builds(lambda d: json.dumps(d).encode(), spec_fields),
    st.builds(lambda d: ("name: x\n" + "\n".join(f"{k}: {json.dumps(v)}" for k, v in d.items())).encode(), spec_fields),
    sbatch_scripts,
    st.sampled_from([b"apiVersion: kubeflow.org/v1\nkind: PyTorchJob\nspec: {}\n", b"[1, 2", b"- - - -", b"{}", b""]),
)
submissions = st.one_of(structured_events(), binary_events(), plain_bodies.map(lambda b: ({}, b)))


@st.composite
def envelopes(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["bytes", "json", "envelope"]))
    if kind == "bytes":
        return draw(st.binary(max_size=64))
    if kind == "json":
        return json.dumps(draw(json_values)).encode()
    envelope: dict[str, Any] = {
        "entity": draw(st.one_of(st.sampled_from(["model_version", "prompt", "Model", ""]), scalars)),
        "action": draw(st.one_of(st.sampled_from(["created", "set", "exploded"]), scalars)),
        "timestamp": draw(st.one_of(st.text(max_size=8), scalars)),
        "data": draw(
            st.one_of(
                spec_fields,
                json_values,
                st.fixed_dictionaries(
                    {"name": st.sampled_from(["fuzzed", "other"]), "version": st.text(max_size=6), "source": scalars}
                ),
            )
        ),
    }
    for key in draw(st.lists(st.sampled_from(list(envelope)), max_size=1)):
        envelope.pop(key)
    return json.dumps(envelope).encode()


# --- the fuzz ---------------------------------------------------------------------------------------


def test_bad_nats_submissions_get_clear_errors_and_leave_the_valid_job_alone(harness: Harness, valid_job: str) -> None:
    before = harness.snapshot(valid_job)

    @fuzz(80)
    @given(case=submissions)
    def one(case: tuple[dict[str, str], bytes]) -> None:
        headers, body = case
        reply = harness.submit(body, headers)
        if reply.ok:
            assert reply.job_id, "an accepted submission names its job"
            assert reply.job_id != valid_job or reply.duplicate, "the valid job may only be answered as a duplicate"
        else:
            assert_clear(reply.error)

    one()
    assert harness.intake.alive(), harness.intake.logs()[-2000:]
    assert harness.snapshot(valid_job) == before, "the job accepted before the fuzz must be unchanged"


def test_bad_http_submissions_are_4xx_with_the_reason_never_500(harness: Harness, valid_job: str) -> None:
    before = harness.snapshot(valid_job)

    @fuzz(50)
    @given(case=submissions, team=st.one_of(st.none(), st.sampled_from(["nlp", "bad team", ""])))
    def one(case: tuple[dict[str, str], bytes], team: str | None) -> None:
        headers, body = case
        if team is not None:
            headers = {**headers, "Oneplus-Team": team}
        status, answer = harness.intake.post("/v1/jobs", body, headers)
        assert status in (200, 201, 400, 403, 422), (status, answer)
        if status >= 400:
            assert answer["ok"] is False
            assert_clear(answer["error"])

    one()
    assert harness.intake.alive(), harness.intake.logs()[-2000:]
    assert harness.snapshot(valid_job) == before


def test_bad_webhook_deliveries_are_refused_with_a_code_and_reason(harness: Harness, valid_job: str) -> None:
    before = harness.snapshot(valid_job)

    @fuzz(60)
    @given(body=envelopes(), signed=st.booleans(), skew=st.sampled_from([0, 0, 30, -30, 400, -400]))
    def one(body: bytes, signed: bool, skew: int) -> None:
        delivery = str(uuid.uuid4())
        stamp = str(int(time.time()) + skew)
        signature = sign(SECRET if signed else "not-the-secret", delivery, stamp, body)
        headers = {"X-MLflow-Delivery-Id": delivery, "X-MLflow-Timestamp": stamp, "X-MLflow-Signature": signature}
        status, answer = harness.intake.post("/webhooks/mlflow", body, headers)
        assert status in (200, 400, 401, 409, 413, 422), (status, answer)
        if status == 200:
            assert answer["ok"] and signed and abs(skew) < 300
        else:
            assert answer["ok"] is False and answer.get("code"), answer
            assert_clear(answer["error"])
        if not signed:
            assert status == 401 or (status == 400 and abs(skew) >= 300), answer

    one()
    assert harness.intake.alive(), harness.intake.logs()[-2000:]
    assert harness.snapshot(valid_job) == before


def test_the_valid_job_can_still_be_cancelled_after_the_fuzz(harness: Harness, valid_job: str) -> None:
    answer = harness.ops(subjects.OPS_JOB_CANCEL, {"job_id": valid_job, "by": "fuzz"})
    assert answer["ok"] and answer["result"]["cancel_requested"], answer
