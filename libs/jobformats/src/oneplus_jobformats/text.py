"""JSON text that is also valid Unicode: a lone `\\uD800`-`\\uDFFF` escape parses in Python but cannot be sent on."""

from __future__ import annotations

import json
import re
from typing import Any

_MAX_DEPTH = 200
_SURROGATE = re.compile("[\ud800-\udfff]")
# Where a surrogate in the parsed value can come from: an escape of one, or (text not from UTF-8) the character.
_MAY_HOLD_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]|[\ud800-\udfff]")


def lone_surrogate_at(value: Any, path: str = "", depth: int = 0) -> str | None:
    """The field path of the first key or string holding half a surrogate pair, or None when all text is valid."""
    if depth > _MAX_DEPTH:
        return None  # the parsers refuse deeper documents on their own
    if isinstance(value, str):
        return path or "(document)" if _has_surrogate(value) else None
    if isinstance(value, dict):
        for k, v in value.items():
            name = str(k).encode("utf-8", "backslashreplace").decode("utf-8")  # the path must itself be text
            here = f"{path}.{name}" if path else name
            if isinstance(k, str) and _has_surrogate(k):
                return here
            found = lone_surrogate_at(v, here, depth + 1)
            if found:
                return found
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found = lone_surrogate_at(v, f"{path}[{i}]", depth + 1)
            if found:
                return found
    return None


def _has_surrogate(s: str) -> bool:
    return _SURROGATE.search(s) is not None


def loads_unicode(text: str) -> Any:
    """`json.loads`, refusing a lone surrogate escape with a ValueError that names the field."""
    value = json.loads(text)
    if _MAY_HOLD_SURROGATE.search(text) is None:
        return value  # the common case, one scan of the text in C instead of a walk of every string
    where = lone_surrogate_at(value)
    if where is not None:
        raise LoneSurrogate(where)
    return value


class LoneSurrogate(ValueError):
    def __init__(self, where: str) -> None:
        self.where = where
        super().__init__(
            f"{where}: holds a lone UTF-16 surrogate escape (\\ud800-\\udfff without its pair), which is not text"
        )


def decode_document(data: bytes, *, filename: str) -> str:
    """A job file's bytes as text: UTF-8 (a UTF-8 byte-order mark is dropped), or one sentence saying where it is
    not. Kubernetes, Slurm and YAML all read UTF-8; guessing another encoding would change what the job runs."""
    from .errors import JobFormatError

    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        hint = " (it looks like UTF-16: save it as UTF-8)" if data[:2] in (b"\xff\xfe", b"\xfe\xff") else ""
        raise JobFormatError(
            f"is not UTF-8 text: byte 0x{data[exc.start]:02x} at offset {exc.start} cannot be decoded{hint}; "
            "save the file as UTF-8",
            filename=filename,
            where=f"line {line}",
        ) from None
