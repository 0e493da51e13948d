"""One entry point for a job document of any kind: detect the format, translate it, name what was not used."""

from __future__ import annotations

import json
from typing import Any

import yaml

from .errors import JobFormatError, Translation
from .kubeflow import translate_manifest
from .native import translate_native
from .sbatch import parse_sbatch
from .text import LoneSurrogate, loads_unicode

MAX_DOCUMENT_BYTES = 1024 * 1024


def looks_like_sbatch(text: str) -> bool:
    return "#SBATCH" in text and text.lstrip("\ufeff").startswith("#!")


def load_job_document(text: str, *, filename: str = "<stdin>") -> Translation:
    """A native JobSpec (YAML/JSON), a PyTorchJob, MPIJob, TrainJob or an sbatch script, as a JobSpec."""
    if len(text) > MAX_DOCUMENT_BYTES:
        raise JobFormatError(f"document is larger than {MAX_DOCUMENT_BYTES} bytes", filename=filename)
    stripped = text.lstrip("\ufeff")
    if looks_like_sbatch(stripped):
        return parse_sbatch(stripped, filename=filename)
    if stripped.lstrip().startswith("#SBATCH"):
        # Slurm's own words for this mistake.
        raise JobFormatError(
            "this does not look like a batch script: the first line must start with #! followed by the path to an "
            "interpreter (e.g. #!/bin/bash)",
            filename=filename,
            where="line 1",
        )
    document = parse_mapping(stripped, filename=filename)
    return translate_mapping(document, filename=filename)


def translate_mapping(document: dict[str, Any], *, filename: str = "<stdin>") -> Translation:
    """An already-parsed document: a Kubernetes manifest if it has apiVersion and kind, else a native JobSpec."""
    if "apiVersion" in document or "kind" in document:
        return translate_manifest(document, filename)
    return translate_native(document, filename=filename)


def parse_mapping(text: str, *, filename: str) -> dict[str, Any]:
    """JSON or YAML text holding exactly one mapping."""
    if not text.strip():
        raise JobFormatError("the document is empty", filename=filename)
    docs = _parse_documents(text, filename)
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
