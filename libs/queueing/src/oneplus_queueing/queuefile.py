"""A queue file as users write it: the OnePlus queue config (the `ONEPLUS_QUEUES_FILE` format) or Kueue objects
(`ClusterQueue`, `LocalQueue`, `ResourceFlavor`, `Cohort`, `WorkloadPriorityClass`), read into one `QueueConfig` and
the YAML text the `queues` bucket stores. Pure: `oneplus queues apply -f` and `oneplus dev up --queues` share it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import yaml

from .config import QueueConfig, QueueConfigError, load_queue_config
from .kueue import is_kueue, kueue_config


@dataclass
class QueueFile:
    config: QueueConfig
    yaml_text: str  # what is stored: the OnePlus form, whatever the file's
    kind: Literal["oneplus", "kueue"]
    notes: list[str] = field(default_factory=list)  # fields read and not used, one line each


def yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML error on one line: where (line, column) and what, without PyYAML's multi-line excerpt."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return f"not valid YAML: {where}{problem}"


def load_queue_file(text: str, *, filename: str = "<queues>") -> QueueFile:
    """Read a queue file of either form; `QueueConfigError` (one line per problem, each naming the file) otherwise."""
    try:
        docs: list[Any] = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise QueueConfigError(f"{filename}: {yaml_problem(exc)}") from None
    if not docs:
        raise QueueConfigError(f"{filename}: empty: give a `queues:` list or Kueue ClusterQueue/LocalQueue objects")
    if is_kueue(docs):
        imported = kueue_config(docs, filename=filename)
        return QueueFile(imported.config, imported.yaml_text, "kueue", imported.notes)
    if len(docs) > 1:
        raise QueueConfigError(
            f"{filename}: {len(docs)} YAML documents: a OnePlus queue config is one document (Kueue objects may be "
            "several, each with apiVersion kueue.x-k8s.io/...)"
        )
    if isinstance(docs[0], dict) and "apiVersion" in docs[0]:
        raise QueueConfigError(
            f"{filename}: apiVersion {docs[0]['apiVersion']!r} is not Kueue's (kueue.x-k8s.io/...): "
            "give Kueue objects or a OnePlus `queues:` config"
        )
    try:
        config = load_queue_config(text)
    except QueueConfigError as exc:
        raise QueueConfigError(f"{filename}: {exc}") from None
    return QueueFile(config, text, "oneplus")


def dump_queue_config(config: QueueConfig) -> str:
    """The config as the YAML `load_queue_config` reads back to the same config (defaults left out)."""
    return yaml.safe_dump(config.model_dump(mode="json", exclude_defaults=True), sort_keys=False)
