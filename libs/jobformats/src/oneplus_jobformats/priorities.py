"""Named priorities (Slurm `--qos`, Kubernetes priorityClass, Kueue priority-class) to OnePlus's number.

The names are a documented convention (docs/submitting.md); a number is taken as it is.
"""

from __future__ import annotations

MAX_PRIORITY = 1_000_000

# Gaps of 10x leave room for a site's own classes in between.
PRIORITY_NAMES: dict[str, int] = {
    "low": 100,
    "normal": 1_000,
    "default": 1_000,
    "high": 10_000,
    "urgent": 100_000,
    "critical": 100_000,
}


def priority_of(name: str) -> int:
    """The priority a class name stands for; ValueError naming the known names otherwise."""
    key = name.strip().lower()
    if key.isascii() and key.isdigit() and len(key) <= 12:
        value = int(key)
        if value > MAX_PRIORITY:
            raise ValueError(f"priority {value} is above the maximum {MAX_PRIORITY}")
        return value
    if key in PRIORITY_NAMES:
        return PRIORITY_NAMES[key]
    # Common Kubernetes spellings: `high-priority`, `priority-low`, `team-a-critical`.
    for word, value in PRIORITY_NAMES.items():
        if key.endswith("-" + word) or key.startswith(word + "-"):
            return value
    known = ", ".join(f"{k} ({v})" for k, v in PRIORITY_NAMES.items())
    raise ValueError(f"unknown priority class {name!r}; use one of {known} or a number 0-{MAX_PRIORITY}")
