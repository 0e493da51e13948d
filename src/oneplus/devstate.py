"""Where a running `oneplus dev up` describes itself, and how the CLI finds the NATS server to talk to.

Standard library only: every CLI command reads it before connecting (start-up time, tests/cli/test_cli_views.py).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_NATS_URL = "nats://127.0.0.1:4222"


def dev_state_path(env: Mapping[str, str] | None = None) -> Path:
    """Where a running `oneplus dev up` describes itself: $ONEPLUS_STATE_HOME/dev.json, else
    $XDG_STATE_HOME/oneplus/dev.json, else ~/.local/state/oneplus/dev.json."""
    env = os.environ if env is None else env
    home = env.get("ONEPLUS_STATE_HOME")
    if home:
        return Path(home) / "dev.json"
    xdg = env.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(xdg) / "oneplus" / "dev.json"


def pid_alive(pid: int) -> bool:
    """The process runs (a zombie, exited but not yet reaped, does not)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def running_dev_state(path: Path) -> dict[str, Any] | None:
    """The state file's document when its `dev up` still runs; None when there is none, it is unreadable or stale."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict):
        return None
    try:
        pid = int(doc.get("pid", 0))
    except (TypeError, ValueError):
        return None
    return doc if pid_alive(pid) else None


@dataclass(frozen=True)
class NatsTarget:
    """The NATS URL a command connects to and where that URL came from, for its error messages."""

    url: str
    source: str  # "--nats", "NATS_URL", "the state file of `oneplus dev up` ...", "the default ..."

    def describe(self) -> str:
        return f"{self.url} (from {self.source})"


def locate_nats(explicit: str | None = None, env: Mapping[str, str] | None = None) -> NatsTarget:
    """The URL given (`--nats`, or NATS_URL, which typer passes in as the same value), else the running `oneplus
    dev up`'s (its state file), else the default. NATS_URL wins over the state file: a user who set it means it."""
    env = os.environ if env is None else env
    from_env = (env.get("NATS_URL") or "").strip()
    if explicit:
        return NatsTarget(explicit, "NATS_URL" if explicit == from_env else "--nats")
    if from_env:
        return NatsTarget(from_env, "NATS_URL")
    path = dev_state_path(env)
    doc = running_dev_state(path)
    url = str(((doc or {}).get("urls") or {}).get("nats") or "")
    if doc is not None and url:
        return NatsTarget(url, f"the running `oneplus dev up` (pid {doc.get('pid')}, {path})")
    why = f"a stale {path}" if path.exists() else f"no {path}"
    return NatsTarget(DEFAULT_NATS_URL, f"the default: NATS_URL is unset and no `oneplus dev up` runs ({why})")
