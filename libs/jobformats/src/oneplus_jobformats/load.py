"""One entry point for a job document of any kind: detect the format, translate it, name what was not used."""

from __future__ import annotations

import json
from typing import Any

import yaml

from .errors import JobFormatError, Translation
from .kubeflow import RUNTIME_KINDS, RuntimeDefaults, read_runtime, translate_manifest, translate_trainjob
from .native import translate_native
from .sbatch import parse_sbatch
from .simulate import sbatch_simulate_s, with_simulated_duration
from .text import LoneSurrogate, loads_unicode

MAX_DOCUMENT_BYTES = 1024 * 1024
TRAINJOB_API = "trainer.kubeflow.org/v1alpha1"


def looks_like_sbatch(text: str) -> bool:
    return "#SBATCH" in text and text.lstrip("\ufeff").startswith("#!")


def load_job_document(text: str, *, filename: str = "<stdin>", submit_dir: str | None = None) -> Translation:
    """A native JobSpec (YAML/JSON), a PyTorchJob, MPIJob, TrainJob or an sbatch script, as a JobSpec.

    `submit_dir`: an sbatch script's SLURM_SUBMIT_DIR (default: this process's working directory; "" unknown)."""
    if len(text) > MAX_DOCUMENT_BYTES:
        raise JobFormatError(f"document is larger than {MAX_DOCUMENT_BYTES} bytes", filename=filename)
    stripped = text.lstrip("\ufeff")
    if looks_like_sbatch(stripped):
        tr = parse_sbatch(stripped, filename=filename, submit_dir=submit_dir)
        seconds = sbatch_simulate_s(stripped, filename=filename)
        if seconds is not None:
            tr.spec = with_simulated_duration(tr.spec, seconds)
        return tr
    if stripped.lstrip().startswith("#SBATCH"):
        # Slurm's own words for this mistake.
        raise JobFormatError(
            "this does not look like a batch script: the first line must start with #! followed by the path to an "
            "interpreter (e.g. #!/bin/bash)",
            filename=filename,
            where="line 1",
        )
    if not stripped.strip():
        raise JobFormatError("the document is empty", filename=filename)
    docs = _parse_documents(stripped, filename)
    if len(docs) > 1:
        return translate_documents(docs, filename=filename)
    return translate_mapping(_one_mapping(docs, filename), filename=filename)  # parsed once, not again


def translate_documents(docs: list[Any], *, filename: str) -> Translation:
    """Several YAML documents, as `kubectl apply -f` takes them: exactly one job (PyTorchJob, MPIJob, TrainJob) and
    any number of training runtimes, which a TrainJob in the file takes its defaults from."""
    jobs: list[tuple[int, dict[str, Any]]] = []
    runtimes: dict[str, RuntimeDefaults] = {}
    for i, doc in enumerate(docs, start=1):
        where = f"document {i}"
        if not isinstance(doc, dict):
            raise JobFormatError(f"expected a mapping, got {type(doc).__name__}", filename=filename, where=where)
        kind = doc.get("kind")
        if kind in RUNTIME_KINDS:
            rt = read_runtime(doc, f"{filename} ({where})")
            runtimes[rt.name] = rt
        elif "apiVersion" in doc or "kind" in doc:
            jobs.append((i, doc))
        else:
            raise JobFormatError(
                "a file of several documents holds Kubernetes manifests only (apiVersion and kind)",
                filename=filename,
                where=where,
            )
    if len(jobs) != 1:
        found = ", ".join(f"document {i} ({d.get('kind')})" for i, d in jobs) or "none"
        raise JobFormatError(
            f"holds {len(docs)} YAML documents with {len(jobs)} jobs ({found}); give one job per file, with any "
            "training runtimes it uses",
            filename=filename,
        )
    index, doc = jobs[0]
    name = f"{filename} (document {index})"
    if doc.get("kind") == "TrainJob" and str(doc.get("apiVersion")) == TRAINJOB_API:
        tr = translate_trainjob(doc, name, runtimes)
        ref = (doc.get("spec") or {}).get("runtimeRef") or {}
        used = runtimes.get(str(ref.get("name"))) if isinstance(ref, dict) else None
        if used is not None:
            tr.warnings += [f"runtime {used.name}: {w}" for w in used.warnings]
        for rt in runtimes.values():
            if rt is not used:
                tr.warnings.append(f"runtime {rt.name}: not referenced by the TrainJob; not used")
        return tr
    tr = translate_manifest(doc, name)
    tr.warnings += [f"runtime {rt.name}: only a TrainJob uses a training runtime; not used" for rt in runtimes.values()]
    return tr


def translate_mapping(document: dict[str, Any], *, filename: str = "<stdin>") -> Translation:
    """An already-parsed document: a Kubernetes manifest if it has apiVersion and kind, else a native JobSpec."""
    if "apiVersion" in document or "kind" in document:
        return translate_manifest(document, filename)
    return translate_native(document, filename=filename)


def parse_mapping(text: str, *, filename: str) -> dict[str, Any]:
    """JSON or YAML text holding exactly one mapping."""
    if not text.strip():
        raise JobFormatError("the document is empty", filename=filename)
    return _one_mapping(_parse_documents(text, filename), filename)


def _one_mapping(docs: list[Any], filename: str) -> dict[str, Any]:
    if len(docs) > 1:
        raise JobFormatError(f"holds {len(docs)} YAML documents; submit one job per file", filename=filename)
    document = docs[0] if docs else None
    if not isinstance(document, dict):
        kind = "empty" if document is None else type(document).__name__
        raise JobFormatError(f"expected a mapping (a job spec or a Kubernetes manifest), got {kind}", filename=filename)
    return document


def _parse_documents(text: str, filename: str) -> list[Any]:
    try:
        if text.lstrip().startswith("{"):
            return [loads_unicode(text)]
        return [d for d in yaml.safe_load_all(text) if d is not None]
    except json.JSONDecodeError as exc:
        raise JobFormatError(f"invalid JSON: {exc.msg}", filename=filename, where=f"line {exc.lineno}") from None
    except LoneSurrogate as exc:
        raise JobFormatError(str(exc), filename=filename) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else None
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise JobFormatError(f"invalid YAML: {problem}", filename=filename, where=where) from None
    except RecursionError:
        raise JobFormatError("the document is nested too deeply", filename=filename) from None
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        raise JobFormatError(f"unreadable value: {str(exc).split(';')[0]}", filename=filename) from None
