"""Bad input of every entry point gets a JobFormatError or WebhookRejected with a message; nothing else escapes."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from oneplus_contracts import JobSpec
from oneplus_jobformats import (
    JobFormatError,
    WebhookRejected,
    WebhookTemplates,
    decode_submission,
    dry_run_summary,
    encode_binary,
    encode_structured,
    load_job_document,
    parse_envelope,
    parse_sbatch,
    verify_signature,
)
from oneplus_jobformats.sbatch_options import ALL

# ONEPLUS_FUZZ_EXAMPLES=5000 for a long hunt; the default keeps the file to seconds.
FUZZ = settings(
    max_examples=int(os.environ.get("ONEPLUS_FUZZ_EXAMPLES", "150")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
_HERE = Path(__file__).resolve()
MANIFESTS = [
    yaml.safe_load(p.read_text())
    for folder in (_HERE.parents[2] / "data" / "manifests", _HERE.parent / "samples")
    for p in sorted(folder.glob("*.yaml"))
]
SPEC = JobSpec.model_validate({"name": "fuzz", "ranks": 2, "resources": {"gpus": 4}})

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**12), 10**12),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(["1", "0", "-1", "8Gi", "500m", "nvidia.com/gpu", "Worker", "", "1e999", "0.5", "NaN"]),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)),
    max_leaves=12,
)


def expect_clean(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Call fn; a failure must be one of ours, with a message a person can read."""
    try:
        return fn(*args, **kwargs)
    except (JobFormatError, WebhookRejected) as exc:
        assert str(exc).strip(), f"{type(exc).__name__} without a message"
        return None


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*prefix, i))
    return out


def _replace(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return doc


@FUZZ
@given(st.text(max_size=300))
def test_any_text_as_a_job_document(text: str) -> None:
    tr = expect_clean(load_job_document, text, filename="fuzz.yaml")
    if tr is not None:
        dry_run_summary(tr.spec, tr.warnings)


@FUZZ
@given(json_values)
def test_any_yaml_value_as_a_job_document(value: Any) -> None:
    expect_clean(load_job_document, yaml.safe_dump(value), filename="fuzz.yaml")


@FUZZ
@given(st.data())
def test_real_manifests_with_one_field_replaced(data: st.DataObject) -> None:
    doc = copy.deepcopy(data.draw(st.sampled_from(MANIFESTS)))
    path = data.draw(st.sampled_from(_paths(doc)[1:]))
    mutated = _replace(doc, path, data.draw(json_values))
    text = data.draw(st.sampled_from(["yaml", "json"]))
    body = yaml.safe_dump(mutated) if text == "yaml" else json.dumps(mutated)
    expect_clean(load_job_document, body, filename="mutated.yaml")


@FUZZ
@given(st.data())
def test_native_specs_with_one_field_replaced(data: st.DataObject) -> None:
    doc = SPEC.model_dump(mode="json")
    path = data.draw(st.sampled_from(_paths(doc)[1:]))
    expect_clean(load_job_document, json.dumps(_replace(doc, path, data.draw(json_values))), filename="spec.json")


directive_values = st.one_of(
    st.text(alphabet="0123456789:-@,gpuhGMKTBR SIGUSR1'\"#=", max_size=14),
    st.sampled_from(["gpu:8", "gpu:h100:4", "1@30:00", "B:USR1@120", "2-00:00:00", "64G", "0", "high", "x"]),
)
option = st.tuples(st.sampled_from(sorted(ALL)), st.one_of(st.none(), directive_values))


def _render(name: str, value: str | None) -> str:
    return f"--{name}" if value is None else f"--{name}={value}"


@FUZZ
@given(st.lists(option, max_size=8), st.lists(option, max_size=3), st.text(max_size=40))
def test_sbatch_scripts_and_command_lines(
    directives: list[tuple[str, str | None]], cli: list[tuple[str, str | None]], tail: str
) -> None:
    script = "#!/bin/bash\n" + "".join(f"#SBATCH {_render(n, v)}\n" for n, v in directives) + tail
    tr = expect_clean(parse_sbatch, script, [_render(n, v) for n, v in cli], filename="fuzz.sh")
    if tr is not None:
        dry_run_summary(tr.spec, tr.warnings)


@FUZZ
@given(st.text(max_size=200), st.lists(st.text(max_size=12), max_size=4))
def test_sbatch_any_text(script: str, cli: list[str]) -> None:
    expect_clean(parse_sbatch, script, cli)


header_names = st.sampled_from(
    [
        "content-type",
        "ce-id",
        "ce-source",
        "ce-type",
        "ce-specversion",
        "ce-time",
        "ce-datacontenttype",
        "ce-data",
        "ce-",
        "CE-ID",
        "ce-Bad_Name",
        "Nats-Msg-Id",
    ]
)
header_values = st.one_of(
    st.text(max_size=30),
    st.sampled_from(
        ["application/cloudevents+json", "1.0", "%C0%A0", "%", '"quoted"', "application/json", "text/plain"]
    ),
)


@FUZZ
@given(st.dictionaries(header_names, header_values, max_size=7), st.binary(max_size=200))
def test_cloudevent_headers_and_bytes(headers: dict[str, str], body: bytes) -> None:
    expect_clean(decode_submission, headers, body)


@FUZZ
@given(st.data())
def test_encoded_events_with_one_attribute_or_data_field_replaced(data: st.DataObject) -> None:
    encode = data.draw(st.sampled_from([encode_structured, encode_binary]))
    headers, body = encode(SPEC, "/ci/fuzz", data.draw(st.text(min_size=1, max_size=10)))
    if encode is encode_structured:
        event = json.loads(body)
        path = data.draw(st.sampled_from(_paths(event)[1:]))
        body = json.dumps(_replace(event, path, data.draw(json_values))).encode()
    else:
        key = data.draw(st.sampled_from(sorted(headers)))
        headers[key] = data.draw(header_values)
    expect_clean(decode_submission, headers, body)


@FUZZ
@given(st.binary(max_size=200))
def test_webhook_bodies_as_bytes(body: bytes) -> None:
    expect_clean(parse_envelope, body)


TEMPLATES = WebhookTemplates.from_yaml(
    "'*':\n  model_version.created:\n"
    "    name: eval-{name}-{version}\n    queue: q-{version}\n    resources: {gpus: 1}\n"
)


@FUZZ
@given(
    st.sampled_from(["model_version", "model_version_alias", "prompt", "x"]),
    st.sampled_from(["created", "set"]),
    json_values,
)
def test_webhook_envelopes_with_any_data(entity: str, action: str, data: Any) -> None:
    body = json.dumps({"entity": entity, "action": action, "timestamp": "t", "data": data}).encode()
    event = expect_clean(parse_envelope, body)
    if event is not None:
        expect_clean(TEMPLATES.jobs_for, event)


@FUZZ
@given(st.text(max_size=20), st.text(max_size=20), st.text(max_size=20), st.binary(max_size=50), st.text(max_size=60))
def test_webhook_signature_inputs(secret: str, delivery: str, stamp: str, body: bytes, header: str) -> None:
    expect_clean(verify_signature, secret, delivery, stamp, body, header, now=1e9)


@FUZZ
@given(st.text(max_size=300))
def test_webhook_template_configs(text: str) -> None:
    expect_clean(WebhookTemplates.from_yaml, text)


@FUZZ
@given(json_values)
def test_webhook_template_configs_as_values(value: Any) -> None:
    expect_clean(WebhookTemplates.from_yaml, yaml.safe_dump({"m": {"model_version.created": value}}))


BIG = "9" * 5000  # past Python's 4300-digit int conversion limit
DEEP = "[" * 900 + "]" * 900


def test_pathological_documents_fail_cleanly() -> None:
    for text in (
        f"name: {BIG}\n",
        '{"name": ' + BIG + "}",
        "apiVersion: kubeflow.org/v1\nkind: PyTorchJob\nmetadata: {name: a}\nspec: " + DEEP + "\n",
        '{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "a"}, "spec": {"x": '
        + DEEP
        + "}}",
        "name: a\nresources: {gpus: 1}\ntime_limit_s: " + BIG + "\n",
        "#!/bin/bash\n#SBATCH --nodes=" + BIG + "\n",
        "#!/bin/bash\n#SBATCH --time=" + BIG + "\n",
        "#!/bin/bash\n#SBATCH --gpus=²\n",
    ):
        assert expect_clean(load_job_document, text) is None, text[:60]
    event = '{"specversion":"1.0","id":"1","source":"/s","type":"t","data":{"name":' + BIG + "}}"
    assert expect_clean(decode_submission, {"content-type": "application/cloudevents+json"}, event.encode()) is None
    assert expect_clean(decode_submission, {"content-type": "application/cloudevents+json"}, DEEP.encode()) is None
    assert expect_clean(parse_envelope, ('{"entity":"a","action":"b","data":{"x":' + BIG + "}}").encode()) is None
    assert expect_clean(WebhookTemplates.from_yaml, f"m: {BIG}\n") is None
