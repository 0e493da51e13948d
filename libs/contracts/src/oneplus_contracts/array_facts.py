"""How the job owner turns one fact about an array into facts about its tasks (pure).

An array is accepted as one fact, under the array's job id; the owner folds it as one `accepted` event per task, in
the same commit (so a 10,000-task array costs one submission round trip and one fact, then the owner's pipelined
writes: an event and a hot-view record per task). A cancel of the array's id is one fact too, folded as a cancel of
every task still in the owner's working set.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from .arrays import array_tasks, fill_pattern, task_job_id
from .events import JobAccepted, JobCancelRequested, JobEvent
from .jobspec import Dependency, JobSpec

OUTPUT_LABELS = ("slurm/output", "slurm/error")  # sbatch's filename patterns, where %A and %a are filled in


def task_specs(array_job_id: str, spec: JobSpec) -> list[tuple[str, JobSpec]]:
    """(task job id, task spec) for every task of the array `spec` asks for."""
    assert spec.array is not None
    corr = [d for d in spec.dependencies if d.type == "aftercorr"]
    plain = [d for d in spec.dependencies if d.type != "aftercorr"]
    patterned = {k: v for k, v in spec.labels.items() if k in OUTPUT_LABELS and "%" in v}
    out: list[tuple[str, JobSpec]] = []
    for task in array_tasks(array_job_id, spec.array):
        update: dict[str, object] = {"array": None, "array_task": task}
        if corr:
            # aftercorr: this task waits for the task of the same id of each named array to succeed.
            own = [Dependency(type="afterok", job_ids=[task_job_id(j, task.task_id) for j in d.job_ids]) for d in corr]
            update["dependencies"] = [*plain, *own]
        if patterned:
            update["labels"] = {
                **spec.labels,
                **{k: fill_pattern(v, array_job_id, task.task_id) for k, v in patterned.items()},
            }
        out.append((task_job_id(array_job_id, task.task_id), spec.model_copy(update=update)))
    return out


def expand_fact(event: JobEvent, tasks_of: Callable[[str], Iterable[str]]) -> list[JobEvent] | None:
    """The task facts that stand for `event`, or None when it is about one job (folded as it is).

    `tasks_of(array id)` lists the array's tasks the owner holds live (none for an id that names no array)."""
    if isinstance(event, JobAccepted) and event.spec.array is not None:
        return [
            JobAccepted(
                event_id=f"accepted-{job_id}",
                job_id=job_id,
                ts=event.ts,
                spec=spec,
                source=event.source,
                warnings=event.warnings,
            )
            for job_id, spec in task_specs(event.job_id, event.spec)
        ]
    if isinstance(event, JobCancelRequested):
        tasks = list(tasks_of(event.job_id))
        if tasks:
            return [
                JobCancelRequested(
                    event_id=f"{event.event_id}-{job_id}", job_id=job_id, ts=event.ts, reason=event.reason, by=event.by
                )
                for job_id in tasks
            ]
    return None
