"""Reading a parsed manifest field by field, remembering which fields were used.

Every field a translator reads is marked; whatever was never read is reported by its path, so a manifest
field OnePlus does not understand becomes a warning instead of vanishing.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from oneplus_contracts.slurm import digits

from .errors import JobFormatError

_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
MAX_NODES = 20_000  # YAML aliases can make a small file a huge tree; refuse before walking it
MAX_DEPTH = 64


def child(path: str, key: str | int) -> str:
    """The path of `key` under `path`: `a.b`, `a[0]`, or `a["kueue.x-k8s.io/queue-name"]` for keys with dots."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    if _PLAIN_KEY.fullmatch(key):
        return f"{path}.{key}" if path else key
    quoted = '"' + key.replace('"', '\\"') + '"'
    return f"{path}[{quoted}]"


def type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "mapping"
    return type(value).__name__


class FieldReader:
    """Typed access to a manifest with errors that name the field, and a record of what was used."""

    def __init__(self, document: dict[str, Any], *, filename: str) -> None:
        self.document = document
        self.filename = filename
        self.used: set[str] = set()
        self.warnings: list[str] = []
        _count_nodes(document, filename)

    def error(self, path: str, problem: str) -> JobFormatError:
        return JobFormatError(problem, filename=self.filename, where=path)

    def warn(self, path: str, remark: str) -> None:
        self.warnings.append(f"{path}: {remark}")

    def use(self, path: str) -> None:
        self.used.add(path)

    def opt(self, obj: dict[str, Any], key: str, path: str) -> Any:
        """The raw value at `obj[key]` (None if absent), marked as used."""
        p = child(path, key)
        if key in obj:
            self.used.add(p)
            return obj[key]
        return None

    def mapping(self, obj: dict[str, Any], key: str, path: str, *, required: bool = False) -> dict[str, Any]:
        p = child(path, key)
        value = obj.get(key)
        if value is None:
            if required:
                raise self.error(p, "missing required field")
            return {}
        if not isinstance(value, dict):
            raise self.error(p, f"must be a mapping (got {type_name(value)})")
        bad = [k for k in value if not isinstance(k, str)]
        if bad:
            raise self.error(p, f"keys must be strings (got {bad[0]!r})")
        return value

    def sequence(self, obj: dict[str, Any], key: str, path: str) -> list[Any]:
        value = obj.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            raise self.error(child(path, key), f"must be a list (got {type_name(value)})")
        return value

    def string(self, obj: dict[str, Any], key: str, path: str, *, required: bool = False) -> str | None:
        p = child(path, key)
        value = self.opt(obj, key, path)
        if value is None:
            if required:
                raise self.error(p, "missing required field")
            return None
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise self.error(p, f"must be a string (got {type_name(value)})")
        return str(value)

    def integer(self, obj: dict[str, Any], key: str, path: str, *, minimum: int = 0) -> int | None:
        p = child(path, key)
        value = self.opt(obj, key, path)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, str) and digits(value.strip()):
                value = int(value.strip())
            else:
                raise self.error(p, f"must be a whole number (got {value!r})")
        if value < minimum:
            raise self.error(p, f"must be >= {minimum} (got {value})")
        return value

    def boolean(self, obj: dict[str, Any], key: str, path: str) -> bool | None:
        value = self.opt(obj, key, path)
        if value is None:
            return None
        if not isinstance(value, bool):
            raise self.error(child(path, key), f"must be true or false (got {value!r})")
        return value

    def string_list(self, obj: dict[str, Any], key: str, path: str) -> list[str]:
        p = child(path, key)
        items = self.sequence(obj, key, path)
        if key in obj:
            self.used.add(p)
        out: list[str] = []
        for i, item in enumerate(items):
            if isinstance(item, bool) or not isinstance(item, (str, int, float)):
                raise self.error(child(p, i), f"must be a string (got {type_name(item)})")
            out.append(str(item))
        return out

    def unused(self) -> list[str]:
        """Paths of every field nobody read (a list nobody opened is named as a whole)."""
        found: list[str] = []
        _walk_unused(self.document, "", self.used, found)
        return found

    def report_unused(self) -> list[str]:
        return [*self.warnings, *(f"{p}: not used by OnePlus" for p in self.unused())]


def _count_nodes(document: Any, filename: str) -> None:
    count = 0
    stack: list[tuple[Any, int]] = [(document, 0)]
    while stack:
        node, depth = stack.pop()
        count += 1
        if depth > MAX_DEPTH:
            raise JobFormatError(f"document is nested more than {MAX_DEPTH} levels deep", filename=filename)
        if count > MAX_NODES:
            raise JobFormatError(
                f"document has more than {MAX_NODES} values; that is not a job manifest", filename=filename
            )
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)


def _has_used_below(path: str, used: set[str]) -> bool:
    return any(u.startswith(path + ".") or u.startswith(path + "[") for u in used)


def _walk_unused(node: Any, path: str, used: set[str], found: list[str]) -> None:
    """Unread mappings are opened down to their scalar fields, so each warning names one field."""
    if path and path in used:
        return
    opens = (isinstance(node, dict) and node) or (isinstance(node, list) and node and _has_used_below(path, used))
    if path and not opens:
        found.append(path)
        return
    for key, value in _children(node):
        _walk_unused(value, child(path, key), used, found)


def _children(node: Any) -> Iterator[tuple[str | int, Any]]:
    if isinstance(node, dict):
        for k, v in node.items():
            yield str(k), v
    elif isinstance(node, list):
        yield from enumerate(node)
