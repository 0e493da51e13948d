"""How a rank ended, in words a user can act on, from the engine's container state."""

from __future__ import annotations

import signal as _signal
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RankEnd:
    rank: int
    exit_code: int
    oom_killed: bool = False
    error: str | None = None
    memory_mb: int | None = None
    restarts: int = 0


def rank_end(rank: int, state: dict[str, Any], *, memory_mb: int | None = None, restarts: int = 0) -> RankEnd:
    """Read a container's `State` (from inspect) into a RankEnd."""
    return RankEnd(
        rank=rank,
        exit_code=int(state.get("ExitCode") or 0),
        oom_killed=bool(state.get("OOMKilled")),
        error=(state.get("Error") or None),
        memory_mb=memory_mb,
        restarts=restarts,
    )


def describe_end(end: RankEnd) -> str:
    """One rank's end: 'rank 1 exited with code 3', 'rank 0 was killed: out of memory (limit 512 MB)', ..."""
    if end.oom_killed:
        limit = f" (limit {end.memory_mb} MB)" if end.memory_mb else ""
        text = f"rank {end.rank} was killed: out of memory{limit}"
    elif end.error:
        text = f"rank {end.rank} failed: {end.error}"
    elif end.exit_code > 128:
        try:
            name = _signal.Signals(end.exit_code - 128).name
        except ValueError:
            name = f"signal {end.exit_code - 128}"
        text = f"rank {end.rank} was killed by {name} (exit code {end.exit_code})"
    else:
        text = f"rank {end.rank} exited with code {end.exit_code}"
    if end.restarts:
        text += f" after {end.restarts} restart(s)"
    return text


def summarize(ends: list[RankEnd], *, stopped_reason: str | None = None) -> tuple[int, str]:
    """The job's exit code on this node and its reason: the lowest failing rank decides, 0 when all succeeded."""
    ordered = sorted(ends, key=lambda e: e.rank)
    failed = [e for e in ordered if e.exit_code != 0 or e.oom_killed or e.error]
    if stopped_reason is not None:
        code = failed[0].exit_code if failed else 0
        return code, f"stopped by the executor: {stopped_reason}"
    if not failed:
        return 0, f"all {len(ordered)} local rank(s) exited 0"
    first = failed[0]
    more = f" ({len(failed) - 1} more rank(s) failed)" if len(failed) > 1 else ""
    return (first.exit_code or 1), describe_end(first) + more


def should_restart(policy: str, end: RankEnd, restarts: int, max_restarts: int) -> bool:
    """The job's restart policy for one rank: Never, OnFailure (non-zero exit) or Always, bounded by max_restarts."""
    if restarts >= max_restarts:
        return False
    if policy == "Always":
        return True
    if policy == "OnFailure":
        return end.exit_code != 0 or end.oom_killed
    return False
