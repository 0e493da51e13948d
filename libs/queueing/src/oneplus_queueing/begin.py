"""Slurm --begin: a job is not considered before its begin time (pure; Slurm's `BeginTime` reason)."""

from __future__ import annotations

from collections.abc import Sequence

from .explain import fmt_ts
from .model import PendingJob, PendingReason


def begin_message(begin_at: float, now: float) -> str:
    left = max(0.0, begin_at - now)
    h, rest = divmod(int(left + 0.999), 3600)
    wait = f"{h}h {rest // 60:02d}m" if h else f"{rest // 60}m {rest % 60:02d}s"
    return f"waiting for its begin time {fmt_ts(begin_at)} (in {wait})"


def hold_until_begin(now: float, pending: Sequence[PendingJob], reasons: dict[str, PendingReason]) -> list[PendingJob]:
    """The pending jobs whose begin time has come (or that set none); the others get `BeginTime` and are not ranked,
    so they neither run nor hold a block ahead of jobs that may run now."""
    if not any(p.spec.begin_at is not None for p in pending):
        return list(pending)
    kept: list[PendingJob] = []
    for p in pending:
        at = p.spec.begin_at
        if at is not None and at > now:
            reasons[p.job_id] = PendingReason(p.job_id, "BeginTime", begin_message(at, now))
        else:
            kept.append(p)
    return kept
