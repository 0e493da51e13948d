"""Format detection, native job specs, readable validation errors and the dry-run summary."""

from __future__ import annotations

import json

import pytest
from oneplus_jobformats import JobFormatError, dry_run_summary, load_job_document

NATIVE_YAML = """
name: bert-large
team: nlp
queue: research
priority: 500
ranks: 4
resources: {gpus: 8, cpus: 32, memory_mb: 262144}
topology: {domain: leaf, mode: required, max_leaves: 1}
checkpoint: {signal: SIGUSR2, grace_s: 300}
time_limit_s: 86400
"""

DRY_RUN_KEYS = {
    "name",
    "queue",
    "priority",
    "ranks",
    "gpus_per_rank",
    "total_gpus",
    "cpus_per_rank",
    "memory_mb_per_rank",
    "time_limit_s",
    "checkpoint_signal",
    "checkpoint_grace_s",
    "max_leaves",
    "warnings",
}


def test_native_yaml_job_spec_is_taken_as_it_is():
    tr = load_job_document(NATIVE_YAML, filename="bert.yaml")
    assert tr.kind == "JobSpec"
    assert tr.warnings == []
    assert (tr.spec.name, tr.spec.ranks, tr.spec.total_gpus, tr.spec.topology.max_leaves) == ("bert-large", 4, 32, 1)


def test_native_json_job_spec_is_read_too():
    tr = load_job_document(json.dumps({"name": "a", "resources": {"gpus": 0.5}}), filename="a.json")
    assert tr.spec.resources.gpu_milli == 500


@pytest.mark.parametrize(
    "text", [json.dumps({"name": "once", "resources": {"gpus": 1}}), "name: once\nresources: {gpus: 1}\n"]
)
def test_a_document_is_parsed_once(text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Every submission goes through here: the intake parsed each JSON body twice (2,000 a burst, 19 us each).
    from oneplus_jobformats import load

    real = load._parse_documents
    calls: list[str] = []

    def counted(t: str, filename: str) -> list[object]:
        calls.append(t)
        return real(t, filename)

    monkeypatch.setattr(load, "_parse_documents", counted)
    assert load_job_document(text).spec.name == "once"
    assert len(calls) == 1


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("name: a\nresources: {gpus: 0}\n", "resources.gpus: must be > 0 (got 0)"),
        ("name: a\nresources: {gpus: 1}\nfoo: 1\n", "unknown field 'foo'"),
        ("name: a\nresources: {gpus: 1, vram: 80}\n", "resources: unknown field 'vram'"),
        ("name: a\n", "resources: missing required field"),
        ("name: a\nresources: {gpus: 1}\nranks: lots\n", "ranks: must be a whole number (got 'lots')"),
        ("name: a\nresources: {gpus: 1.5}\n", "resources.gpus: gpus=1.5: more than one GPU must be a whole number"),
        ("name: a\nresources: {gpus: 1}\nrestart_policy: Sometimes\n", "restart_policy: must be 'Never', 'OnFailure'"),
        (
            "name: a\nresources: {gpus: 1}\ncheckpoint: {signal: SIGFOO}\n",
            "checkpoint.signal: unknown checkpoint signal",
        ),
        ("resources: {gpus: 1}\n", "name: missing required field"),
    ],
)
def test_native_validation_errors_are_sentences_naming_the_field(text, message):
    with pytest.raises(JobFormatError) as info:
        load_job_document(text, filename="job.yaml")
    assert str(info.value).startswith("job.yaml: ")
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "the document is empty"),
        ("name: [unclosed\n", "job.yaml: line 2, column 1: invalid YAML"),
        ('{"name": ', "job.yaml: line 1: invalid JSON"),
        ("- a\n- b\n", "expected a mapping (a job spec or a Kubernetes manifest), got list"),
        ("name: a\n---\nname: b\n", "several documents holds Kubernetes manifests only"),
        ("#SBATCH --nodes=2\nsrun hostname\n", "job.yaml: line 1: this does not look like a batch script"),
        ("a: &a [*a]\n", None),
        ('{"name": "a", "env": {"X": "\\ud800"}}', "job.yaml: env.X: holds a lone UTF-16 surrogate escape"),
        ('{"name": "a", "command": ["run", "\\udfff!"]}', "job.yaml: command[1]: holds a lone UTF-16 surrogate"),
    ],
)
def test_unreadable_documents_fail_with_a_clear_error(text, message):
    with pytest.raises(JobFormatError) as info:
        load_job_document(text, filename="job.yaml")
    assert str(info.value)
    if message:
        assert message in str(info.value)


def test_alias_bombs_are_refused_before_they_are_walked():
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
    for i, prev in zip("bcdefgh", "abcdefg", strict=True):
        bomb += f"{i}: &{i} [*{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}]\n"
    bomb += "apiVersion: kubeflow.org/v1\nkind: PyTorchJob\n"
    with pytest.raises(JobFormatError, match="more than 20000 values"):
        load_job_document(bomb, filename="bomb.yaml")


def test_a_script_with_shebang_and_sbatch_directives_is_read_as_sbatch():
    tr = load_job_document("#!/bin/bash\n#SBATCH --gpus-per-node=4\nsrun hostname\n", filename="run.sh")
    assert tr.kind == "sbatch"
    assert tr.spec.name == "run.sh"
    assert tr.spec.resources.gpus == 4


def test_dry_run_summary_has_the_documented_keys_and_numbers():
    tr = load_job_document(NATIVE_YAML, filename="bert.yaml")
    summary = dry_run_summary(tr.spec, ["w1"], kind=tr.kind)
    assert set(summary) >= DRY_RUN_KEYS
    assert summary["gpus_per_rank"] == 8 and isinstance(summary["gpus_per_rank"], int)
    assert summary["total_gpus"] == 32
    assert summary["cpus_per_rank"] == 32
    assert summary["memory_mb_per_rank"] == 262144
    assert (summary["checkpoint_signal"], summary["checkpoint_grace_s"]) == ("SIGUSR2", 300)
    assert summary["time_limit_s"] == 86400
    assert summary["max_leaves"] == 1
    assert summary["warnings"] == ["w1"]
    assert summary["team"] == "nlp"
    assert summary["format"] == "JobSpec"
    assert summary["spec"]["resources"]["gpus"] == 8
    json.dumps(summary)  # the CLI prints it as JSON


def test_dry_run_summary_keeps_shares_fractional_and_max_leaves_null_when_unconstrained():
    tr = load_job_document("name: small\nranks: 3\nresources: {gpus: 0.25}\n", filename="s.yaml")
    summary = dry_run_summary(tr.spec, [])
    assert summary["gpus_per_rank"] == 0.25
    assert summary["total_gpus"] == 0.75
    assert summary["max_leaves"] is None
    assert summary["time_limit_s"] is None


def test_text_that_only_looks_like_a_surrogate_escape_is_text_and_a_pair_is_one_character() -> None:
    from oneplus_jobformats.text import LoneSurrogate, loads_unicode

    assert loads_unicode('{"a": "\\\\ud800"}') == {"a": "\\ud800"}, "an escaped backslash, then the letters"
    assert loads_unicode('{"a": "\\uD83D\\uDE00"}') == {"a": "\U0001f600"}
    with pytest.raises(LoneSurrogate, match=r"^b\[1\]: holds a lone"):
        loads_unicode('{"b": ["ok", "\\udc00"]}')
