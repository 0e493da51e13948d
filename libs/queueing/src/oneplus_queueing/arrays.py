"""Job arrays in the cycle (pure): the `%N` throttle, and an array's tasks as one row of `queue`.

`--array=0-999%50`: at most 50 tasks of the array hold GPUs at once. The cycle counts the array's tasks that hold
GPUs (placed, starting, running, being preempted) and those it places or nominates GPUs for, and a task past the
limit waits with Slurm's reason `JobArrayTaskLimit`; it is neither served, nor the protected head, nor a preemptor.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from oneplus_contracts import ArrayTask
from oneplus_contracts.arrays import compact

from .model import RunningJob

if TYPE_CHECKING:
    from .report import QueueRow


def tasks_running(running: Iterable[RunningJob]) -> dict[str, int]:
    """Array id → how many of its tasks hold GPUs."""
    out: dict[str, int] = {}
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
        f"array {task.array_job_id} has {running} task(s) running, its limit (--array=...%{task.max_running}); "
        "the next starts when one ends"
    )


def compact_pending_tasks(rows: Sequence[QueueRow], tasks: Mapping[str, ArrayTask]) -> list[QueueRow]:
    """squeue's view of an array: its pending tasks as one row, `j-abc_[7-999%50]`, where the first of them stands
    (serving order); running tasks keep a row each (`j-abc_3`). `tasks`: job id → its ArrayTask, for array tasks."""
    pending: dict[str, list[int]] = {}
    for row in rows:
        task = tasks.get(row.job_id)
        if task is not None and row.state == "PD":
            pending.setdefault(task.array_job_id, []).append(task.task_id)
    if not any(len(ids) > 1 for ids in pending.values()):
        return list(rows)
    out: list[QueueRow] = []
    shown: set[str] = set()
    for row in rows:
        task = tasks.get(row.job_id)
        if task is None or row.state != "PD" or len(pending[task.array_job_id]) < 2:
            out.append(row)
            continue
        if task.array_job_id in shown:
            continue  # folded into its array's row
        shown.add(task.array_job_id)
        ids = sorted(pending[task.array_job_id])
        limit = f"%{task.max_running}" if task.max_running else ""
        out.append(replace(row, job_id=f"{task.array_job_id}_[{compact(ids)}{limit}]"))
    return out
