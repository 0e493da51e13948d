"""The order pending jobs are served in: priority class, fair share and age (Slurm's multifactor, simplified)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .config import QueueConfig, QueueConfigError
from .model import PendingJob, PendingReason


@dataclass(frozen=True, slots=True)
class RankedJob:
    job: PendingJob
    priority: int  # static: decides who may preempt whom; ageing never lets a job evict another
    preemptible: bool
    score: float  # dynamic: decides the order

    @property
    def job_id(self) -> str:
        return self.job.job_id

    @property
    def gpus(self) -> float:
        return self.job.gpus


def job_score(now: float, job: PendingJob, priority: int, config: QueueConfig, factors: Mapping[str, float]) -> float:
    """Priority + fair-share bonus + age bonus (growing with the wait, so the oldest job ends up first)."""
    age = max(0.0, now - job.submitted_ts)
    fair = config.fairshare.weight * factors.get(job.queue, 0.0)
    pol = config.ageing
    ageing = pol.weight * age / pol.period_s
    if pol.max_bonus is not None:
        ageing = min(ageing, pol.max_bonus)
    return priority + fair + ageing - size_penalty(job, config)


def size_penalty(job: PendingJob, config: QueueConfig) -> float:
    pol = config.job_size
    if pol.weight <= 0:
        return 0.0
    hours = job.spec.time_limit_s / 3600 if job.spec.time_limit_s is not None else pol.no_limit_hours
    return pol.weight * math.log10(max(1.0, job.gpus * hours))


def rank_pending(
    now: float, pending: Sequence[PendingJob], config: QueueConfig, factors: Mapping[str, float]
) -> tuple[list[RankedJob], dict[str, PendingReason]]:
    """Pending jobs in serving order, and the reason for each job the config cannot queue."""
    ranked: list[RankedJob] = []
    invalid: dict[str, PendingReason] = {}
    for job in pending:
        try:
            config.validate_job(job.spec)
            prio = config.priority_of(job.spec)
            preemptible = config.preemptible(job.spec)
        except QueueConfigError as exc:
            invalid[job.job_id] = PendingReason(job.job_id, "InvalidQueue", str(exc))
            continue
        ranked.append(RankedJob(job, prio, preemptible, job_score(now, job, prio, config, factors)))
    ranked.sort(key=_serving_key)
    return ranked, invalid


def keep_protected_first(ranked: list[RankedJob], protected: str | None) -> list[RankedJob]:
    """The job protected last cycle goes before every job of its priority or lower, whatever their scores now.

    Without this a newcomer that scores higher (a small request under `job_size`) would be served before the
    protected job and could take the GPUs of its block, so the promised start would slip at every arrival. A job of
    a higher priority still goes first, as it may evict the protected one anyway.
    """
    if protected is None:
        return ranked
    at = next((i for i, r in enumerate(ranked) if r.job_id == protected), None)
    if at is None:
        return ranked
    head = ranked[at]
    for i in range(at):
        if ranked[i].priority <= head.priority:
            return [*ranked[:i], head, *ranked[i:at], *ranked[at + 1 :]]
    return ranked


def _serving_key(r: RankedJob) -> tuple[float, float, str, int]:
    """Score, then submission, then id; an array's tasks by task id (as Slurm starts them), not as their ids sort
    as text (`a_10` before `a_2`)."""
    task = r.job.spec.array_task
    if task is None:
        return (-r.score, r.job.submitted_ts, r.job_id, 0)
    return (-r.score, r.job.submitted_ts, task.array_job_id, task.task_id)
