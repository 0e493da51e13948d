"""The one error every translator raises, the result every translator returns, and pydantic errors made readable."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from oneplus_contracts import JobSpec
from pydantic import ValidationError


class JobFormatError(ValueError):
    """Input that cannot become a JobSpec.

    The message names the file, where in it (a field path such as `spec.pytorchReplicaSpecs.Worker.replicas`
    or `line 7`) and what is wrong, so a person can fix the input without reading our code.
    """

    def __init__(self, problem: str, *, filename: str | None = None, where: str | None = None) -> None:
        self.problem = problem
        self.filename = filename
        self.where = where
        parts = [p for p in (filename, where) if p]
        super().__init__(": ".join([*parts, problem]))


@dataclass
class Translation:
    """A job spec translated from some input format, with every remark on fields that were not used."""

    spec: JobSpec
    warnings: list[str] = field(default_factory=list)
    kind: str = "JobSpec"


def _loc_to_path(loc: Sequence[int | str]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _describe(err: Mapping[str, Any]) -> str:
    """One pydantic error as a short sentence in our words."""
    kind = str(err.get("type", ""))
    ctx = err.get("ctx") or {}
    value = err.get("input")
    if kind == "extra_forbidden":
        return "unknown field"
    if kind == "missing":
        return "missing required field"
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        op = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}[kind]
        bound = next(iter(ctx.values()), "?")
        if isinstance(bound, float) and bound.is_integer():
            bound = int(bound)
        return f"must be {op} {bound} (got {value!r})"
    if kind == "literal_error":
        return f"must be {ctx.get('expected', 'one of the allowed values')} (got {value!r})"
    if kind.startswith("int_") or kind == "int_type":
        return f"must be a whole number (got {value!r})"
    if kind.startswith("float_"):
        return f"must be a number (got {value!r})"
    if kind.startswith("bool_"):
        return f"must be true or false (got {value!r})"
    if kind in ("string_type", "string_unicode"):
        return f"must be a string (got {type(value).__name__})"
    if kind in ("list_type", "tuple_type"):
        return f"must be a list (got {type(value).__name__})"
    if kind in ("dict_type", "model_type", "model_attributes_type"):
        return f"must be a mapping (got {type(value).__name__})"
    if kind == "value_error":
        return str(err.get("msg", "invalid value")).removeprefix("Value error, ")
    return str(err.get("msg", "invalid value"))


def validation_problems(exc: ValidationError, *, origin: Mapping[str, str] | None = None) -> list[str]:
    """Each pydantic error as `path: problem`; `origin` maps a JobSpec field to where it came from in the input."""
    problems: list[str] = []
    for err in exc.errors():
        loc = list(err.get("loc", ()))
        if err.get("type") == "extra_forbidden" and loc:
            name, parent = loc[-1], _loc_to_path(loc[:-1])
            problems.append(f"{parent + ': ' if parent else ''}unknown field {name!r}")
            continue
        path = _loc_to_path(loc)
        if origin:
            path = origin.get(path) or origin.get(path.split(".")[0]) or path
        problems.append(f"{path or '(document)'}: {_describe(err)}")
    return problems


def spec_from_fields(
    fields: Mapping[str, Any], *, filename: str | None, origin: Mapping[str, str] | None = None
) -> JobSpec:
    """Build a JobSpec, turning a validation failure into a JobFormatError that names the input's fields."""
    try:
        return JobSpec.model_validate(dict(fields))
    except ValidationError as exc:
        raise JobFormatError("; ".join(validation_problems(exc, origin=origin)), filename=filename) from None
