"""Slurm's ways of showing jobs, shared by `oneplus queue` and the Slurm-style `oneplus squeue`/`sinfo`.

State codes for the lifecycle, elapsed times as squeue prints them, and hostlists
(`h100-0,h100-1,h100-2,h100-3,h100-7` ⇄ `h100-[0-3,7]`).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable

from .events import JobState

# OnePlus lifecycle → squeue's compact state codes (squeue(1), JOB STATE CODES). A job being checkpointed for
# preemption still runs and has been signalled: SI (SIGNALING); PR is Slurm's state after a preemption ended it.
STATE_CODES: dict[JobState, str] = {
    "SUBMITTED": "PD",
    "ACCEPTED": "PD",
    "PLACED": "CF",
    "STARTING": "CF",
    "RUNNING": "R",
    "PREEMPTING": "SI",
    "CHECKPOINTED": "RQ",
    "SUCCEEDED": "CD",
    "FAILED": "F",
    "CANCELLED": "CA",
    "REJECTED": "F",
}


STATE_ALIASES: dict[str, tuple[JobState, ...]] = {
    # Slurm's long names (sacct --state, squeue --states) that are not OnePlus names already.
    "PENDING": ("SUBMITTED", "ACCEPTED"),
    "CONFIGURING": ("PLACED", "STARTING"),
    "COMPLETED": ("SUCCEEDED",),
    "PREEMPTED": ("PREEMPTING", "CHECKPOINTED"),
    "REQUEUED": ("CHECKPOINTED",),
    "SIGNALING": ("PREEMPTING",),
    # Kubernetes pod phases and Kubeflow job conditions (Pending, Running, Succeeded, Failed are the same words).
    "CREATED": ("SUBMITTED", "ACCEPTED"),
    "SUSPENDED": ("SUBMITTED", "ACCEPTED"),  # a Kueue workload not admitted yet
    "RESTARTING": ("CHECKPOINTED",),
}
"""Job states under the names Slurm and Kubernetes users type, each mapped to the OnePlus states it means."""


def format_elapsed(seconds: float | None, *, unlimited: str = "UNLIMITED") -> str:
    """squeue's TIME: `M:SS`, `H:MM:SS` or `D-HH:MM:SS`; `unlimited` for no limit."""
    if seconds is None:
        return unlimited
    s = max(0, int(seconds))
    days, s = divmod(s, 86400)
    hours, s = divmod(s, 3600)
    minutes, s = divmod(s, 60)
    if days:
        return f"{days}-{hours:02d}:{minutes:02d}:{s:02d}"
    if hours:
        return f"{hours}:{minutes:02d}:{s:02d}"
    return f"{minutes}:{s:02d}"


def digits(text: str, max_len: int = 9) -> bool:
    """A short run of ASCII digits: `str.isdigit` also accepts superscripts that `int` refuses."""
    return 0 < len(text) <= max_len and text.isascii() and text.isdigit()


_NUMBERED = re.compile(r"(.*?)(\d{1,18})", re.ASCII | re.DOTALL)
_RANGE = re.compile(r"^(.*?)\[([^\]]+)\](.*)$")


def compress_hostlist(names: Iterable[str]) -> str:
    """Group names by prefix and digit width; consecutive numbers become ranges (zero padding is kept)."""
    groups: dict[tuple[str, int], set[int]] = defaultdict(set)
    plain: set[str] = set()
    for name in names:
        m = _NUMBERED.fullmatch(name)
        if not m:
            plain.add(name)
            continue
        digits = m.group(2)
        width = len(digits) if digits.startswith("0") and len(digits) > 1 else 0
        groups[(m.group(1), width)].add(int(digits))
    _join_padded(groups)
    parts: list[tuple[str, str]] = [(p, p) for p in plain]
    for (prefix, width), numbers in groups.items():
        ordered = sorted(numbers)
        if len(ordered) == 1:
            parts.append((prefix, f"{prefix}{ordered[0]:0{width}d}"))
            continue
        spans: list[str] = []
        start = prev = ordered[0]
        for n in [*ordered[1:], None]:
            if n is not None and n == prev + 1:
                prev = n
                continue
            spans.append(f"{start:0{width}d}" if start == prev else f"{start:0{width}d}-{prev:0{width}d}")
            if n is not None:
                start = prev = n
        parts.append((prefix, f"{prefix}[{','.join(spans)}]"))
    return ",".join(text for _, text in sorted(parts))


def _join_padded(groups: dict[tuple[str, int], set[int]]) -> None:
    """`node10` belongs with `node01`: an unpadded number as wide as a padded group joins it."""
    for (prefix, width), numbers in list(groups.items()):
        if width:
            continue
        for n in list(numbers):
            key = (prefix, len(str(n)))
            if key in groups and key != (prefix, 0):
                groups[key].add(n)
                numbers.discard(n)
        if not numbers:
            del groups[(prefix, 0)]


def expand_hostlist(text: str) -> list[str]:
    """The names a hostlist stands for, in order; ValueError for a malformed range."""
    out: list[str] = []
    for item in _split_top(text):
        m = _RANGE.match(item)
        if not m:
            out.append(item)
            continue
        prefix, body, suffix = m.groups()
        for span in body.split(","):
            lo, dash, hi = span.partition("-")
            if not digits(lo, 18) or (dash and not digits(hi, 18)):
                raise ValueError(f"bad range {span!r} in {text!r}")
            width = len(lo) if lo.startswith("0") and len(lo) > 1 else 0
            end = int(hi) if dash else int(lo)
            if end < int(lo) or end - int(lo) > 100_000:
                raise ValueError(f"bad range {span!r} in {text!r}")
            out.extend(f"{prefix}{n:0{width}d}{suffix}" for n in range(int(lo), end + 1))
    return out


def _split_top(text: str) -> list[str]:
    """Split on commas outside brackets."""
    items: list[str] = []
    depth = 0
    current = ""
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            if current:
                items.append(current)
            current = ""
        else:
            current += ch
    if current:
        items.append(current)
    return items
