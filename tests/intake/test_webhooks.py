"""`POST /webhooks/mlflow` on an intake process: signature, replay window, repeated deliveries, templates → jobs."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from intake_process import IntakeProcess, webhook_intake
from oneplus_bus.streams import ensure_kv
from oneplus_contracts import subjects
from oneplus_intake.deliveries import NatsDeliveryLedger
from oneplus_jobformats.mlflow import sign

from oneplus.client import OnePlusClient

SECRET = "s3cret-for-tests"
TEMPLATES = """\
resnet50:
  model_version.created:
    name: eval-{name}-v{version}
    team: vision
    resources: {gpus: 1}
    command: [python, eval.py, --model, "models:/{name}/{version}", --source, "{source}"]
  model_version_tag.set:
    - match: {key: stage, value: candidate}
      name: bench-{name}-{version}
      team: vision
      ranks: 2
      resources: {gpus: 8}
"*":
  model_version_alias.created:
    match: {alias: champion}
    name: canary-{name}-{alias}
    resources: {gpus: 2}
broken:
  model_version.created:
    name: eval-{name}
    queue: no-such-queue
    resources: {gpus: 1}
"""


@pytest.fixture(scope="module")
async def intake(servers, tmp_path_factory) -> AsyncIterator[IntakeProcess]:  # type: ignore[no-untyped-def]
    workdir = Path(tmp_path_factory.mktemp("intake-webhooks"))
    async with webhook_intake(servers.nats_url, servers.redis_url, workdir, TEMPLATES, SECRET) as proc:
        yield proc


def envelope(entity: str, action: str, data: dict[str, Any]) -> bytes:
    # Exactly as MLflow serialises it (json.dumps with default separators).
    return json.dumps(
        {"entity": entity, "action": action, "timestamp": "2026-12-02T13:52:04+00:00", "data": data}
    ).encode()


def signed(
    body: bytes, *, delivery_id: str | None = None, ts: int | None = None, secret: str = SECRET
) -> dict[str, str]:
    delivery_id = delivery_id or str(uuid.uuid4())
    stamp = str(int(time.time()) if ts is None else ts)
    return {
        "X-MLflow-Delivery-Id": delivery_id,
        "X-MLflow-Timestamp": stamp,
        "X-MLflow-Signature": sign(SECRET, delivery_id, stamp, body),
    }


async def deliver(intake: IntakeProcess, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
    return await asyncio.to_thread(intake.post, "/webhooks/mlflow", body, headers)


VERSION_CREATED: dict[str, Any] = {
    "name": "resnet50",
    "version": "3",
    "source": "s3://models/resnet50/3",
    "run_id": None,
    "tags": {},
}


async def test_a_new_model_version_starts_its_evaluation_job(intake: IntakeProcess) -> None:
    body = envelope("model_version", "created", VERSION_CREATED)
    headers = signed(body)
    status, answer = await deliver(intake, body, headers)
    assert status == 200 and answer["ok"], answer
    (job,) = answer["jobs"]
    assert job["name"] == "eval-resnet50-v3" and job["ok"] and not job["duplicate"]
    async with OnePlusClient.connect(intake.nats_url) as c:
        rec = await c.get_job(job["job_id"])
    assert rec.state == "ACCEPTED" and rec.source == "mlflow" and rec.spec.team == "vision"
    assert rec.spec.command[-1] == "s3://models/resnet50/3"
    assert rec.spec.labels["mlflow/model"] == "resnet50" and rec.spec.labels["mlflow/version"] == "3"

    status, again = await deliver(intake, body, headers)
    assert status == 409 and again["code"] == "duplicate_delivery", again


async def test_a_tag_event_starts_a_job_only_when_the_template_matches(intake: IntakeProcess) -> None:
    data = {"name": "resnet50", "version": "3", "key": "stage", "value": "candidate"}
    body = envelope("model_version_tag", "set", data)
    status, answer = await deliver(intake, body, signed(body))
    assert status == 200 and [j["name"] for j in answer["jobs"]] == ["bench-resnet50-3"], answer
    other = envelope("model_version_tag", "set", {**data, "value": "archived"})
    status, answer = await deliver(intake, other, signed(other))
    assert status == 200 and answer["jobs"] == [] and answer["ok"]


async def test_a_wildcard_template_serves_every_model(intake: IntakeProcess) -> None:
    body = envelope(
        "model_version_alias", "created", {"name": "bert base/uncased", "alias": "champion", "version": "7"}
    )
    status, answer = await deliver(intake, body, signed(body))
    assert status == 200 and [j["name"] for j in answer["jobs"]] == ["canary-bert-base-uncased-champion"], answer


async def test_an_event_no_template_names_is_accepted_with_no_job(intake: IntakeProcess) -> None:
    body = envelope("registered_model", "created", {"name": "resnet50", "tags": {}, "description": None})
    status, answer = await deliver(intake, body, signed(body))
    assert status == 200 and answer["jobs"] == []


async def test_a_template_job_the_platform_refuses_is_422_with_the_reason(intake: IntakeProcess) -> None:
    body = envelope("model_version", "created", {**VERSION_CREATED, "name": "broken"})
    status, answer = await deliver(intake, body, signed(body))
    assert status == 422 and not answer["ok"]
    assert "no-such-queue" in answer["jobs"][0]["error"], answer


def _wrong_secret(h: dict[str, str], b: bytes) -> tuple[dict[str, str], bytes]:
    return {**h, "X-MLflow-Signature": sign("wrong", h["X-MLflow-Delivery-Id"], h["X-MLflow-Timestamp"], b)}, b


def _in_milliseconds(h: dict[str, str], b: bytes) -> tuple[dict[str, str], bytes]:
    return {**h, "X-MLflow-Timestamp": h["X-MLflow-Timestamp"] + "000"}, b


def _without(name: str) -> Any:
    return lambda h, b: ({k: v for k, v in h.items() if k != name}, b)


TAMPERED = {
    "wrong-secret": (_wrong_secret, 401, "signature_mismatch"),
    "body-changed": (lambda h, b: (h, b + b" "), 401, "signature_mismatch"),
    "unsigned": (_without("X-MLflow-Signature"), 401, "missing_signature"),
    "other-scheme": (lambda h, b: ({**h, "X-MLflow-Signature": "sha256=abcdef"}, b), 400, "bad_signature_format"),
    "milliseconds": (
        lambda h, b: ({**h, "X-MLflow-Timestamp": h["X-MLflow-Timestamp"] + "000"}, b),
        400,
        "bad_timestamp",
    ),
    "no-delivery-id": (_without("X-MLflow-Delivery-Id"), 400, "missing_delivery_id"),
}


@pytest.mark.parametrize(("tamper", "status", "code"), list(TAMPERED.values()), ids=list(TAMPERED))
async def test_a_delivery_that_fails_verification_is_refused_with_its_reason(
    intake: IntakeProcess, tamper: Any, status: int, code: str
) -> None:
    body = envelope("model_version", "created", VERSION_CREATED)
    headers, sent = tamper(signed(body), body)
    got, answer = await deliver(intake, sent, headers)
    assert (got, answer["code"]) == (status, code), answer
    assert answer["error"]


async def test_a_stale_delivery_is_400_and_names_the_replay_window(intake: IntakeProcess) -> None:
    body = envelope("model_version", "created", VERSION_CREATED)
    status, answer = await deliver(intake, body, signed(body, ts=int(time.time()) - 3600))
    assert status == 400 and answer["code"] == "stale_timestamp" and "replay window is 300 s" in answer["error"]


async def test_a_signed_body_that_is_not_an_envelope_is_400(intake: IntakeProcess) -> None:
    for body, words in (
        (b"[1, 2]", "JSON object"),
        (b'{"entity": "model_version"}', "no 'action'"),
        (b"\xff", "UTF-8"),
    ):
        status, answer = await deliver(intake, body, signed(body))
        assert status == 400 and answer["code"] == "bad_body" and words in answer["error"], (body, answer)


async def test_the_delivery_ledger_is_shared_by_replicas_and_a_released_claim_can_be_retried(bus) -> None:  # type: ignore[no-untyped-def]
    kv = (await ensure_kv(bus.jetstream()))[subjects.WEBHOOK_DELIVERIES_KV]
    ttl = (await kv.status()).ttl
    assert ttl is not None and ttl >= 2 * 300, "ids must outlive MLflow's replay window on both sides of now"
    one, two = NatsDeliveryLedger(kv), NatsDeliveryLedger(kv)
    delivery = str(uuid.uuid4())
    assert await one.claim(delivery) is True
    assert await two.claim(delivery) is False
    await one.release(delivery)
    assert await two.claim(delivery) is True
    assert await one.claim("id with spaces and / slashes ✓") is True, "any delivery id is a valid key"


async def test_a_body_over_the_limit_is_413_before_anything_reads_it(intake: IntakeProcess) -> None:
    body = b"x" * (3 * 1024 * 1024)
    status, answer = await deliver(intake, body, signed(body))
    assert status == 413 and answer["ok"] is False and answer["error"], answer


async def test_an_intake_with_a_broken_templates_file_does_not_start_and_says_why(servers, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "templates.yaml").write_text("resnet50:\n  model_version.created:\n    name: eval-{nme}\n")
    env = {"ONEPLUS_MLFLOW_SECRET": SECRET, "ONEPLUS_MLFLOW_TEMPLATES": str(tmp_path / "templates.yaml")}
    proc = IntakeProcess(servers.nats_url, tmp_path, env=env, redis_url=servers.redis_url)
    with pytest.raises(RuntimeError, match="intake exited") as err:
        await proc.start(timeout=60)
    assert "templates.yaml: resnet50.model_version.created[0]: placeholder(s) {nme}" in str(err.value)
    assert proc.owner.poll() is not None, "the job owner started beside it is stopped too"
