"""Job arrays in the cycle (pure): the `%N` throttle, and an array's tasks as one row of `queue`.

`--array=0-999%50`: at most 50 tasks of the array hold GPUs at once. The cycle counts the array's tasks that hold
GPUs (placed, starting, running, being preempted) and those it places or nominates GPUs for, and a task past the
limit waits with Slurm's reason `JobArrayTaskLimit`; it is neither served, nor the protected head, nor a preemptor.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from oneplus_contracts import ArrayTask, JobRecord
from oneplus_contracts.arrays import compact

from .model import PendingJob, PendingReason, RunningJob


def tasks_running(running: Iterable[RunningJob], in_flight: Mapping[str, int] | None = None) -> dict[str, int]:
    """Array id → how many of its tasks hold GPUs (`in_flight`: those placed but not recorded yet, counted too)."""
    out: dict[str, int] = dict(in_flight or {})
    for r in running:
        count_task(r.spec.array_task, out)
    return out


def count_task(task: ArrayTask | None, counts: dict[str, int]) -> None:
    if task is not None and task.max_running is not None:
        counts[task.array_job_id] = counts.get(task.array_job_id, 0) + 1


def throttle_message(task: ArrayTask | None, counts: dict[str, int]) -> str | None:
    """Why the task waits for its array's `%N`, or None when it may be served."""
    if task is None or task.max_running is None:
        return None
    running = counts.get(task.array_job_id, 0)
    if running < task.max_running:
        return None
    return (
        f"array {task.array_job_id} has its limit of {task.max_running} task(s) running or starting "
        f"(--array=...%{task.max_running}); the next starts when one ends"
    )


def hold_throttled(
    pending: Sequence[PendingJob], counts: Mapping[str, int], reasons: dict[str, PendingReason]
) -> list[PendingJob]:
    """The pending jobs the cycle considers: of an array with `%N`, only as many tasks as N leaves room for (the first
    in `pending`'s order, which is the order they were accepted or requeued in); the others get `JobArrayTaskLimit`
    here and are not ranked at all (a 10,000-task array at %50 is ranked as 50 jobs, not 10,000, every cycle). The
    cycle's own check still holds N among those it considers. One pass, no sort: this runs every cycle.
    `counts`: array id → its tasks holding GPUs (`tasks_running`)."""
    room: dict[str, int] = {}
    why: dict[str, str] = {}
    kept: list[PendingJob] = []
    for job in pending:
        task = job.spec.array_task
        if task is None or task.max_running is None:
            kept.append(job)
            continue
        array_id = task.array_job_id
        left = room.get(array_id)
        if left is None:
            left = max(0, task.max_running - counts.get(array_id, 0))
            why[array_id] = throttle_message(task, {array_id: task.max_running}) or ""
        if left > 0:
            room[array_id] = left - 1
            kept.append(job)
        else:
            room[array_id] = 0
            reasons[job.job_id] = PendingReason(job.job_id, "JobArrayTaskLimit", why[array_id])
    return kept


def fold_pending_tasks(records: Iterable[JobRecord], rank: Mapping[str, int]) -> tuple[dict[str, str], set[str]]:
    """squeue's view of an array: its pending tasks as one row, `j-abc_[7-999%50]`, in the place of the first of them
    in serving order (`rank`, then submission, then id); running tasks keep a row each. Returns {that task's id: the
    row's id} and the ids of the pending tasks the row stands for (no row of their own)."""
    best: dict[str, tuple[tuple[int, float, str], JobRecord]] = {}
    ids: dict[str, list[int]] = {}
    never = len(rank)
    for rec in records:
        task = rec.spec.array_task
        if task is None or rec.state != "ACCEPTED":
            continue
        key = (rank.get(rec.job_id, never), rec.submitted_ts, rec.job_id)
        array_id = task.array_job_id
        ids.setdefault(array_id, []).append(task.task_id)
        got = best.get(array_id)
        if got is None or key < got[0]:
            best[array_id] = (key, rec)
    shown: dict[str, str] = {}
    folded: set[str] = set()
    for array_id, task_ids in ids.items():
        if len(task_ids) < 2:
            continue
        first = best[array_id][1]
        task = first.spec.array_task
        assert task is not None
        limit = f"%{task.max_running}" if task.max_running else ""
        shown[first.job_id] = f"{array_id}_[{compact(sorted(task_ids))}{limit}]"
        prefix = array_id + "_"
        folded.update(prefix + str(t) for t in task_ids)
    folded.difference_update(shown)
    return shown, folded
