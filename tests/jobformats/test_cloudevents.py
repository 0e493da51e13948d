"""CloudEvents over NATS: structured, binary and plain bodies decode to a submission; bad ones say why."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime

import pytest
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent
from oneplus_contracts import JobSpec
from oneplus_jobformats import JobFormatError, decode_submission, encode_binary, encode_structured
from oneplus_jobformats.cloudevents import decode_header_value, encode_header_value

SPEC = JobSpec.model_validate({"name": "ci-eval", "team": "ml", "ranks": 2, "resources": {"gpus": 4}})
WHEN = datetime(2026, 12, 2, 13, 52, 4, tzinfo=UTC)


def test_structured_round_trip_keeps_id_source_type_and_spec():
    headers, body = encode_structured(SPEC, "/ci/github/acme/repo", "run-42-1", time=WHEN)
    assert headers == {"content-type": "application/cloudevents+json"}
    sub = decode_submission(headers, body)
    assert (sub.event_id, sub.source, sub.type, sub.mode) == (
        "run-42-1",
        "/ci/github/acme/repo",
        "io.oneplus.job.submit",
        "structured",
    )
    assert sub.spec == SPEC
    assert sub.attributes["time"].startswith("2026-12-02T13:52:04")


def test_binary_round_trip_with_percent_encoded_header_values():
    headers, body = encode_binary(SPEC, "/ci/gitlab/group a/projekt-ü", "pipe 7", time=WHEN)
    assert headers["ce-source"] == "/ci/gitlab/group%20a/projekt-%C3%BC"
    assert headers["ce-id"] == "pipe%207"
    assert headers["ce-time"] == "2026-12-02T13:52:04Z"
    sub = decode_submission(headers, body)
    assert (sub.event_id, sub.source, sub.mode) == ("pipe 7", "/ci/gitlab/group a/projekt-ü", "binary")
    assert sub.spec == SPEC


def test_binary_event_from_the_nats_binding_example_with_mixed_case_headers():
    headers = {
        "Ce-Specversion": "1.0",
        "CE-TYPE": "com.example.someevent",
        "ce-time": "2018-04-05T03:56:24Z",
        "ce-id": "1234-1234-1234",
        "ce-source": "/mycontext/subcontext",
        "ce-datacontenttype": "application/json",
        "ce-traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    }
    sub = decode_submission(headers, SPEC.model_dump_json().encode())
    assert (sub.event_id, sub.type) == ("1234-1234-1234", "com.example.someevent")
    assert sub.attributes["traceparent"].startswith("00-0af76519")


def test_an_event_built_by_the_cloudevents_sdk_decodes():
    event = CloudEvent({"id": "sdk-1", "source": "/sdk", "type": "t"}, SPEC.model_dump(mode="json"))
    sub = decode_submission({"Content-Type": "application/cloudevents+json; charset=utf-8"}, JSONFormat().write(event))
    assert sub.event_id == "sdk-1"
    assert sub.spec == SPEC


def test_data_base64_and_a_kubeflow_manifest_as_data():
    manifest = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "pt"},
        "spec": {
            "pytorchReplicaSpecs": {
                "Worker": {
                    "replicas": 2,
                    "template": {
                        "spec": {
                            "containers": [
                                {"name": "pytorch", "image": "i", "resources": {"limits": {"nvidia.com/gpu": 2}}}
                            ]
                        }
                    },
                }
            }
        },
    }
    event = {
        "specversion": "1.0",
        "id": "b64",
        "source": "/s",
        "type": "t",
        "data_base64": base64.b64encode(json.dumps(manifest).encode()).decode(),
    }
    sub = decode_submission({"content-type": "application/cloudevents+json"}, json.dumps(event).encode())
    assert (sub.kind, sub.spec.ranks, sub.spec.total_gpus) == ("PyTorchJob", 2, 4.0)


def test_an_sbatch_script_as_binary_data():
    script = b"#!/bin/bash\n#SBATCH --gpus-per-node=8\n#SBATCH --nodes=2\nsrun train\n"
    headers = {
        "ce-specversion": "1.0",
        "ce-id": "s1",
        "ce-source": "/ci",
        "ce-type": "t",
        "ce-datacontenttype": "text/x-shellscript",
    }
    sub = decode_submission(headers, script)
    assert (sub.kind, sub.spec.total_gpus) == ("sbatch", 16.0)


def test_a_plain_job_spec_body_has_no_event_id():
    sub = decode_submission(None, SPEC.model_dump_json().encode())
    assert (sub.event_id, sub.mode, sub.spec) == (None, "plain", SPEC)
    assert decode_submission({"Nats-Msg-Id": "x"}, SPEC.model_dump_json().encode()).event_id is None


@pytest.mark.parametrize(
    ("headers", "body", "message"),
    [
        ({"content-type": "application/cloudevents+json"}, b"{not json", "structured event is not JSON"),
        ({"content-type": "application/cloudevents+json"}, b"[1]", "must be a JSON object"),
        (
            {"content-type": "application/cloudevents+json"},
            b'{"specversion":"1.0","source":"/s","type":"t","data":{}}',
            "required attribute 'id' is missing",
        ),
        (
            {"content-type": "application/cloudevents+json"},
            b'{"specversion":"0.3","id":"1","source":"/s","type":"t","data":{}}',
            "specversion '0.3' is not supported",
        ),
        (
            {"content-type": "application/cloudevents+json"},
            b'{"specversion":"1.0","id":"1","source":"/s","type":"t"}',
            "the event has no data",
        ),
        (
            {"content-type": "application/cloudevents+json"},
            b'{"specversion":"1.0","id":"1","source":"/s","type":"t","time":"yesterday","data":{}}',
            "is not an RFC 3339 timestamp",
        ),
        (
            {"content-type": "application/cloudevents+json"},
            b'{"specversion":"1.0","id":"1","source":"/s","type":"t","data_base64":"***"}',
            "data_base64 is not valid base64",
        ),
        (
            {"content-type": "application/cloudevents+json"},
            b'{"specversion":"1.0","id":"1","source":"/s","type":"t","Bad-Name":"x","data":{}}',
            "attribute name 'Bad-Name'",
        ),
        ({"content-type": "application/cloudevents-batch+json"}, b"[]", "batched CloudEvents are not supported"),
        ({"ce-specversion": "1.0", "ce-id": "1", "ce-source": "/s"}, b"{}", "required attribute 'type' is missing"),
        ({"ce-specversion": "1.0", "ce-id": "%C0%A0", "ce-source": "/s", "ce-type": "t"}, b"{}", "not valid UTF-8"),
        (
            {"ce-specversion": "1.0", "ce-id": "50%", "ce-source": "/s", "ce-type": "t"},
            b"{}",
            "malformed percent-encoding",
        ),
        (
            {"ce-specversion": "1.0", "ce-id": "1", "ce-source": "/s", "ce-type": "t"},
            b'{"name": "x", "resources": {"gpus": -1}}',
            "resources.gpus: must be > 0",
        ),
        (None, b"\xff\xfe", "body is not UTF-8"),
        (
            {"content-type": "application/cloudevents+json"},
            b'{"specversion":"1.0","id":"1","source":"/s","type":"t","data":{"name":"x","labels":{"\\ud83d":"y"}}}',
            "data.labels.\\ud83d: holds a lone UTF-16 surrogate escape",  # the message is itself valid text
        ),
        (None, b'{"name": "x", "resources": {"gpus": 1}, "env": {"A": "\\ud800"}}', "env.A: holds a lone UTF-16"),
        (None, b"", "the document is empty"),
    ],
)
def test_bad_events_get_a_clear_error(headers, body, message):
    with pytest.raises(JobFormatError) as info:
        decode_submission(headers, body)
    assert message in str(info.value)


def test_header_values_follow_the_binding_encoding_rules():
    assert encode_header_value('a b"c%d/é') == "a%20b%22c%25d/%C3%A9"
    assert decode_header_value("ce-x", "a%20b%22c%25d/%C3%A9") == 'a b"c%d/é'
    assert decode_header_value("ce-x", "%2f%3A") == "/:"  # lower-case and needless encoding are accepted
    assert decode_header_value("ce-x", '"quoted \\"value\\""') == 'quoted "value"'
