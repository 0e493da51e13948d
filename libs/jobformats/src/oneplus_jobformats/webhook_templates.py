"""Per registered model, which MLflow events start which jobs: a YAML of JobSpec templates with placeholders.

```yaml
resnet50:                          # registered model name, or "*" for every model
  model_version.created:           # MLflow event type (entity.action)
    name: eval-{name}-v{version}   # a JobSpec; {placeholders} are the event's data fields
    resources: {gpus: 1}
    command: [python, eval.py, --model, "models:/{name}/{version}"]
  model_version_tag.set:
    - match: {key: stage, value: candidate}   # only when these data fields are equal
      name: promote-{name}-{version}
      resources: {gpus: 8}
```
Placeholders are lower-case names in braces; `${VAR}` and upper-case names are left alone for shells.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import yaml
from oneplus_contracts import JobSpec
from pydantic import ValidationError

from .errors import JobFormatError, validation_problems

if TYPE_CHECKING:
    from .mlflow import MlflowEvent

# mlflow/webhooks/types.py (MLflow 3.17): event → (required data fields, optional data fields).
EVENT_FIELDS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "registered_model.created": (("name",), ("tags", "description")),
    "model_version.created": (("name", "version", "source"), ("run_id", "tags", "description")),
    "model_version_tag.set": (("name", "version", "key", "value"), ()),
    "model_version_tag.deleted": (("name", "version", "key"), ()),
    "model_version_alias.created": (("name", "alias", "version"), ()),
    "model_version_alias.deleted": (("name", "alias"), ()),
    "prompt.created": (("name",), ("tags", "description")),
    "prompt_version.created": (("name", "version"), ("template", "tags", "description")),
    "prompt_tag.set": (("name", "key", "value"), ()),
    "prompt_tag.deleted": (("name", "key"), ()),
    "prompt_version_tag.set": (("name", "version", "key", "value"), ()),
    "prompt_version_tag.deleted": (("name", "version", "key"), ()),
    "prompt_alias.created": (("name", "alias", "version"), ()),
    "prompt_alias.deleted": (("name", "alias"), ()),
    "budget_policy.exceeded": (
        (
            "budget_policy_id",
            "budget_unit",
            "budget_amount",
            "current_spend",
            "duration_unit",
            "duration_value",
            "target_scope",
            "target_value",
        ),
        ("workspace", "window_start"),
    ),
}
COMMON_PLACEHOLDERS = ("event", "entity", "action", "timestamp")
ANY_MODEL = "*"
_PLACEHOLDER = re.compile(r"(?<!\$)\{([a-z_][a-z0-9_]*)\}")
_NAME_BAD = re.compile(r"[^A-Za-z0-9._-]+")
LABEL_PREFIX = "mlflow/"


def placeholders_for(event_type: str) -> set[str]:
    required, optional = EVENT_FIELDS[event_type]
    return {*required, *optional, *COMMON_PLACEHOLDERS} - {"tags"}


def _render(node: Any, values: dict[str, str]) -> Any:
    if isinstance(node, str):
        return _PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), node)
    if isinstance(node, list):
        return [_render(x, values) for x in node]
    if isinstance(node, dict):
        return {k: _render(v, values) for k, v in node.items()}
    return node


def _used_placeholders(node: Any) -> set[str]:
    if isinstance(node, str):
        return set(_PLACEHOLDER.findall(node))
    if isinstance(node, list):
        return set().union(*(_used_placeholders(x) for x in node)) if node else set()
    if isinstance(node, dict):
        return set().union(*(_used_placeholders(v) for v in node.values())) if node else set()
    return set()


def job_name(text: str) -> str:
    """A rendered name made valid: model names may hold spaces or slashes; JobSpec names may not."""
    cleaned = _NAME_BAD.sub("-", text).lstrip("-._")
    return (cleaned or "mlflow-job")[:128]


@dataclass(frozen=True)
class JobTemplate:
    model: str
    event: str
    match: dict[str, str]
    body: dict[str, Any]
    where: str
    filename: str = "<webhook templates>"

    def applies(self, event: MlflowEvent) -> bool:
        return all(str(event.data.get(k)) == v for k, v in self.match.items())

    def render(self, values: dict[str, str]) -> JobSpec:
        fields = _render(self.body, values)
        fields["name"] = job_name(str(fields.get("name", "")))
        labels = dict(fields.get("labels") or {})
        labels.setdefault(LABEL_PREFIX + "event", values["event"])
        for key in ("name", "version", "alias"):
            if values.get(key):
                labels.setdefault(LABEL_PREFIX + ("model" if key == "name" else key), values[key])
        fields["labels"] = labels
        try:
            return JobSpec.model_validate(fields)
        except ValidationError as exc:
            raise JobFormatError(
                "; ".join(validation_problems(exc)), filename=self.filename, where=self.where
            ) from None


class WebhookTemplates:
    """The configured templates; `jobs_for(event)` renders every one that applies."""

    def __init__(self, templates: list[JobTemplate]) -> None:
        self.templates = templates

    @classmethod
    def from_yaml(cls, text: str, *, filename: str = "<webhook templates>") -> WebhookTemplates:
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise JobFormatError(f"invalid YAML: {str(exc).splitlines()[0]}", filename=filename) from None
        except RecursionError:
            raise JobFormatError("the document is nested too deeply", filename=filename) from None
        except ValueError as exc:  # e.g. an integer of more than 4300 digits
            raise JobFormatError(f"unreadable value: {str(exc).split(';')[0]}", filename=filename) from None
        if doc is None:
            return cls([])
        if not isinstance(doc, dict):
            raise JobFormatError("expected registered model name → event type → job template", filename=filename)
        templates: list[JobTemplate] = []
        for model, events in doc.items():
            if not isinstance(events, dict):
                raise JobFormatError("expected event type → job template", filename=filename, where=str(model))
            for event_type, entries in events.items():
                where = f"{model}.{event_type}"
                if event_type not in EVENT_FIELDS:
                    raise JobFormatError(
                        f"unknown MLflow event type; use one of {', '.join(EVENT_FIELDS)}",
                        filename=filename,
                        where=where,
                    )
                items = entries if isinstance(entries, list) else [entries]
                for i, entry in enumerate(items):
                    templates.append(_template(str(model), str(event_type), entry, f"{where}[{i}]", filename))
        return cls(templates)

    def jobs_for(self, event: MlflowEvent) -> list[JobSpec]:
        model = str(event.data.get("name", ""))
        values = {k: "" if v is None else str(v) for k, v in event.data.items() if not isinstance(v, (dict, list))}
        values.update(event=event.event, entity=event.entity, action=event.action, timestamp=event.timestamp)
        return [
            t.render(values)
            for t in self.templates
            if t.event == event.event and t.model in (model, ANY_MODEL) and t.applies(event)
        ]


def _template(model: str, event_type: str, entry: Any, where: str, filename: str) -> JobTemplate:
    if not isinstance(entry, dict):
        raise JobFormatError("a job template must be a mapping (a JobSpec)", filename=filename, where=where)
    body = {str(k): v for k, v in entry.items() if k != "match"}
    match_raw = entry.get("match") or {}
    allowed = placeholders_for(event_type)
    if not isinstance(match_raw, dict):
        raise JobFormatError("match must map data fields to values", filename=filename, where=where)
    match = {str(k): str(v) for k, v in match_raw.items()}
    bad_match = sorted(set(match) - allowed)
    if bad_match:
        raise JobFormatError(f"match on {bad_match}: {event_type} has no such field", filename=filename, where=where)
    unknown = sorted(_used_placeholders(body) - allowed)
    if unknown:
        raise JobFormatError(
            f"placeholder(s) {', '.join('{' + u + '}' for u in unknown)} are not fields of {event_type} "
            f"(available: {', '.join(sorted(allowed))})",
            filename=filename,
            where=where,
        )
    template = JobTemplate(model=model, event=event_type, match=match, body=body, where=where, filename=filename)
    sample = {name: "1" for name in allowed}
    sample.update(name=model if model != ANY_MODEL else "model", event=event_type)
    template.render(sample)  # a template that cannot make a valid JobSpec fails now, not at the first delivery
    return template
