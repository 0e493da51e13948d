"""A document that already is a OnePlus JobSpec (YAML or JSON of the contracts' model)."""

from __future__ import annotations

from typing import Any

from .errors import JobFormatError, Translation, spec_from_fields


def translate_native(document: dict[str, Any], *, filename: str) -> Translation:
    bad = [k for k in document if not isinstance(k, str)]
    if bad:
        raise JobFormatError(f"field names must be strings (got {bad[0]!r})", filename=filename)
    if "name" not in document:
        raise JobFormatError(
            "name: missing required field (a OnePlus job spec needs at least `name` and `resources.gpus`; "
            "a Kubernetes manifest needs `apiVersion` and `kind`)",
            filename=filename,
        )
    spec = spec_from_fields(document, filename=filename)
    return Translation(spec=spec, warnings=[], kind="JobSpec")
