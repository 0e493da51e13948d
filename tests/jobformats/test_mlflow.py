"""MLflow webhooks: the signature recipe, the replay window, delivery dedupe, envelopes and job templates."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json

import pytest
from oneplus_jobformats import JobFormatError, WebhookRejected, WebhookTemplates, parse_envelope, verify_signature
from oneplus_jobformats.mlflow import MemoryDeliveryLedger, claim_delivery, sign, verify_request

SECRET = "whsec-test"
DELIVERY = "0b4d5e3c-8a1f-4c55-9d2e-7f1a2b3c4d5e"
TIMESTAMP = "1796219524"
ENVELOPE = {
    "entity": "model_version",
    "action": "created",
    "timestamp": "2026-12-02T13:52:04.683620+00:00",
    "data": {
        "name": "resnet50",
        "version": "1",
        "source": "s3://bucket/models/resnet50/1",
        "run_id": None,
        "tags": {"gpu": "h100"},
        "description": "v1",
    },
}
BODY = json.dumps(ENVELOPE).encode()  # MLflow sends json.dumps(envelope) with default separators
# Computed once with MLflow's _generate_hmac_signature recipe for the values above.
VECTOR = "v1,Kkx1M5eMihIoLPgiFU8qI9wzvb/WYLaQXyyMChKFiwA="
NOW = float(TIMESTAMP) + 5


def mlflow_signature(secret: str, delivery_id: str, timestamp: str, payload: str) -> str:
    """mlflow/webhooks/delivery.py, written out independently of the code under test."""
    signed_content = f"{delivery_id}.{timestamp}.{payload}"
    digest = hmac.new(secret.encode("utf-8"), signed_content.encode("utf-8"), hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode("utf-8")


def test_the_known_vector_matches_the_recipe_and_verifies():
    assert mlflow_signature(SECRET, DELIVERY, TIMESTAMP, BODY.decode()) == VECTOR
    assert sign(SECRET, DELIVERY, TIMESTAMP, BODY) == VECTOR
    verify_signature(SECRET, DELIVERY, TIMESTAMP, BODY, VECTOR, now=NOW)


def test_any_of_several_space_separated_signatures_may_match():
    verify_signature(SECRET, DELIVERY, TIMESTAMP, BODY, "v1,AAAA " + VECTOR, now=NOW)


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"signature_header": ""}, "missing_signature"),
        ({"delivery_id": ""}, "missing_delivery_id"),
        ({"timestamp": ""}, "missing_timestamp"),
        ({"secret": ""}, "no_secret"),
        ({"timestamp": "1.5e9"}, "bad_timestamp"),
        ({"signature_header": "sha256=abcdef"}, "bad_signature_format"),
        ({"signature_header": "v1,not base64!"}, "bad_signature_format"),
        ({"signature_header": "v1,AAAA"}, "signature_mismatch"),
        ({"secret": "other"}, "signature_mismatch"),
        ({"raw_body": BODY.replace(b'"1"', b'"2"')}, "signature_mismatch"),
        ({"raw_body": json.dumps(ENVELOPE, separators=(",", ":")).encode()}, "signature_mismatch"),
    ],
)
def test_each_failure_has_its_own_reason(change, code):
    args = {
        "secret": SECRET,
        "delivery_id": DELIVERY,
        "timestamp": TIMESTAMP,
        "raw_body": BODY,
        "signature_header": VECTOR,
    }
    args.update(change)
    with pytest.raises(WebhookRejected) as info:
        verify_signature(**args, now=NOW)
    assert info.value.code == code
    assert info.value.reason


def test_stale_and_future_timestamps_are_outside_the_replay_window():
    with pytest.raises(
        WebhookRejected, match=r"stale_timestamp: timestamp 1796219524 is 301 s old; the replay window is 300 s"
    ):
        verify_signature(SECRET, DELIVERY, TIMESTAMP, BODY, VECTOR, now=float(TIMESTAMP) + 301)
    with pytest.raises(WebhookRejected, match="in the future"):
        verify_signature(SECRET, DELIVERY, TIMESTAMP, BODY, VECTOR, now=float(TIMESTAMP) - 400)
    verify_signature(SECRET, DELIVERY, TIMESTAMP, BODY, VECTOR, now=float(TIMESTAMP) + 3000, tolerance_s=3600)


def test_verify_request_reads_the_headers_case_insensitively():
    headers = {"x-mlflow-delivery-id": DELIVERY, "X-MLFLOW-TIMESTAMP": TIMESTAMP, "X-MLflow-Signature": VECTOR}
    assert verify_request(SECRET, headers, BODY, now=NOW) == DELIVERY
    with pytest.raises(WebhookRejected, match="missing_signature"):
        verify_request(SECRET, {"X-MLflow-Delivery-Id": DELIVERY, "X-MLflow-Timestamp": TIMESTAMP}, BODY, now=NOW)


async def test_a_repeated_delivery_id_is_refused_until_the_ledger_forgets_it():
    clock = [1000.0]
    ledger = MemoryDeliveryLedger(retention_s=60, clock=lambda: clock[0])
    await claim_delivery(ledger, DELIVERY)
    with pytest.raises(WebhookRejected) as info:
        await claim_delivery(ledger, DELIVERY)
    assert (info.value.code, info.value.http_status) == ("duplicate_delivery", 409)
    clock[0] += 61
    await claim_delivery(ledger, DELIVERY)


def test_parse_envelope_reads_the_real_payload():
    event = parse_envelope(BODY)
    assert (event.event, event.data["name"], event.data["version"]) == ("model_version.created", "resnet50", "1")
    assert event.workspace is None


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"not json", "body is not JSON"),
        (b"[]", "must be a JSON object"),
        (b'{"entity": "model_version", "action": "created"}', "envelope has no 'data'"),
        (b'{"entity": "Model Version", "action": "created", "data": {}}', "envelope entity must be a lower-case word"),
        (b'{"entity": "model_version", "action": "created", "data": []}', "envelope data must be an object"),
        (
            b'{"entity": "model_version", "action": "created", "data": {"name": "m"}}',
            "model_version.created data has no 'version'",
        ),
        (
            b'{"entity": "model_version_alias", "action": "created", '
            b'"data": {"name": "m", "alias": {}, "version": "1"}}',
            "'alias' must be a string",
        ),
        (b"\xff", "body is not UTF-8"),
        (b'{"entity": "model_version", "action": "created", "data": {"name": "m\\ud800"}}', "data.name: holds a lone"),
    ],
)
def test_bad_envelopes_are_rejected_with_the_reason(body, message):
    with pytest.raises(WebhookRejected) as info:
        parse_envelope(body)
    assert info.value.code == "bad_body"
    assert message in str(info.value)


def test_an_unknown_event_type_parses_but_starts_no_job():
    event = parse_envelope(b'{"entity": "experiment", "action": "created", "data": {"name": "e"}}')
    assert event.event == "experiment.created"
    assert WebhookTemplates.from_yaml(TEMPLATES).jobs_for(event) == []


TEMPLATES = """
resnet50:
  model_version.created:
    name: eval-{name}-v{version}
    queue: eval
    priority: 1000
    resources: {gpus: 1}
    image: ghcr.io/acme/eval:1
    command: [python, eval.py, --model, "models:/{name}/{version}", --source, "{source}",
              --run, "{run_id}", --home, "${HOME}"]
  model_version_tag.set:
    - match: {key: stage, value: candidate}
      name: bench-{name}-{version}
      ranks: 2
      resources: {gpus: 8}
"*":
  model_version_alias.created:
    match: {alias: champion}
    name: canary-{name}-{alias}
    resources: {gpus: 2}
"""


def test_a_new_version_starts_the_evaluation_job_of_its_model():
    jobs = WebhookTemplates.from_yaml(TEMPLATES).jobs_for(parse_envelope(BODY))
    assert len(jobs) == 1
    job = jobs[0]
    assert (job.name, job.queue, job.priority, job.resources.gpus) == ("eval-resnet50-v1", "eval", 1000, 1.0)
    assert job.command == [
        "python",
        "eval.py",
        "--model",
        "models:/resnet50/1",
        "--source",
        "s3://bucket/models/resnet50/1",
        "--run",
        "",
        "--home",
        "${HOME}",
    ]
    assert job.labels == {"mlflow/event": "model_version.created", "mlflow/model": "resnet50", "mlflow/version": "1"}


def test_match_filters_tag_events_and_wildcard_models_apply_to_every_model():
    templates = WebhookTemplates.from_yaml(TEMPLATES)
    tag = {
        "entity": "model_version_tag",
        "action": "set",
        "timestamp": "t",
        "data": {"name": "resnet50", "version": "3", "key": "stage", "value": "candidate"},
    }
    assert [j.name for j in templates.jobs_for(parse_envelope(json.dumps(tag).encode()))] == ["bench-resnet50-3"]
    tag["data"]["value"] = "archived"
    assert templates.jobs_for(parse_envelope(json.dumps(tag).encode())) == []
    alias = {
        "entity": "model_version_alias",
        "action": "created",
        "timestamp": "t",
        "data": {"name": "my model/v2", "alias": "champion", "version": "9"},
    }
    jobs = templates.jobs_for(parse_envelope(json.dumps(alias).encode()))
    assert [j.name for j in jobs] == ["canary-my-model-v2-champion"]  # made a valid job name


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "m:\n  model_version.created:\n    name: x-{alias}\n    resources: {gpus: 1}\n",
            "placeholder(s) {alias} are not fields of model_version.created",
        ),
        ("m:\n  model_version.exploded:\n    name: x\n    resources: {gpus: 1}\n", "unknown MLflow event type"),
        (
            "m:\n  model_version.created:\n    name: x\n    resources: {gpus: 0}\n",
            "m.model_version.created[0]: resources.gpus: must be > 0",
        ),
        (
            "m:\n  model_version.created:\n    name: x\n    resources: {gpus: 1}\n    match: {stage: x}\n",
            "match on ['stage']",
        ),
        ("m:\n  model_version.created: [1]\n", "a job template must be a mapping"),
        ("- a\n", "expected registered model name"),
        ("m: [\n", "invalid YAML"),
    ],
)
def test_bad_template_configs_fail_when_loaded(text, message):
    with pytest.raises(JobFormatError) as info:
        WebhookTemplates.from_yaml(text, filename="hooks.yaml")
    assert message in str(info.value)
