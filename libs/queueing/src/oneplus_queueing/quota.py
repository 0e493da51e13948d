"""Guarantees, borrowing and reclaim over the queue tree (Kueue's cohorts, made hierarchical).

A queue may hold up to `guarantee + borrow_limit` GPUs, at its own level and at every ancestor's. GPUs above the
guarantee are *borrowed*: a sibling that needs its guarantee back may evict them (reclaim), whatever their priority.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from .config import QueueConfig
from .model import PreemptionKind, RunningJob

_EPS = 1e-9


class QuotaLedger:
    """GPUs held per queue (leaf and ancestors), updated as a cycle admits jobs."""

    def __init__(self, config: QueueConfig, held: Mapping[str, float]) -> None:
        self.config = config
        self.held: dict[str, float] = {q.name: float(held.get(q.name, 0.0)) for q in config.queues}

    def copy(self) -> QuotaLedger:
        return QuotaLedger(self.config, self.held)

    def blocking_queue(self, queue: str, gpus: float, freed: Mapping[str, float] | None = None) -> str | None:
        """The first queue on the path whose limit `gpus` more would break (after `freed` per queue), or None."""
        for q in self.config.path(queue):
            after = self.held[q] - (freed.get(q, 0.0) if freed else 0.0) + gpus
            if after > self.config.queue(q).limit_gpus + _EPS:
                return q
        return None

    def quota_message(self, queue: str, gpus: float) -> str:
        q = self.blocking_queue(queue, gpus)
        if q is None:
            return ""
        spec = self.config.queue(q)
        return (
            f"queue {q} holds {self.held[q]:g} GPUs; {gpus:g} more would exceed its limit of {spec.limit_gpus:g} "
            f"(guarantee {spec.guarantee_gpus:g} + borrow limit {spec.borrow_limit_gpus or 0:g})"
        )

    def admit(self, queue: str, gpus: float) -> None:
        for q in self.config.path(queue):
            self.held[q] += gpus

    def release(self, queue: str, gpus: float) -> None:
        for q in self.config.path(queue):
            self.held[q] -= gpus

    def borrowing(self, queue: str) -> bool:
        return self.held[queue] > self.config.queue(queue).guarantee_gpus + _EPS

    def borrowed_gpus(self, queue: str) -> float:
        return max(0.0, self.held[queue] - self.config.queue(queue).guarantee_gpus)

    def within_guarantee(self, queue: str, gpus: float) -> bool:
        """Would `queue` still be inside its guarantee with `gpus` more, at every level of its path?"""
        return all(self.held[q] + gpus <= self.config.queue(q).guarantee_gpus + _EPS for q in self.config.path(queue))

    # -- who may evict whom ---------------------------------------------------------------------------------------

    def sibling_levels(self, preemptor_queue: str, victim_queue: str) -> tuple[str, str] | None:
        """The two children of the lowest common ancestor on each path; None when both are the same leaf."""
        pp, vp = self.config.path(preemptor_queue), self.config.path(victim_queue)
        i = 0
        while i < len(pp) and i < len(vp) and pp[i] == vp[i]:
            i += 1
        if i >= len(pp) or i >= len(vp):
            return None  # same queue (jobs are only queued on leaves, so one path cannot contain the other)
        return pp[i], vp[i]

    def preemption_kind(
        self, preemptor_queue: str, preemptor_priority: int, preemptor_gpus: float, victim: RunningJob, victim_prio: int
    ) -> PreemptionKind | None:
        """Whether `victim` may be evicted for the preemptor, and on what grounds."""
        levels = self.sibling_levels(preemptor_queue, victim.queue)
        if levels is None:
            return "priority" if victim_prio < preemptor_priority else None
        mine, theirs = levels
        if not self.borrowing(theirs):
            return None  # a queue inside its guarantee is never evicted by another queue
        if self.held[mine] + preemptor_gpus <= self.config.queue(mine).guarantee_gpus + _EPS:
            return "reclaim"
        return "priority" if victim_prio < preemptor_priority else None

    def victims_keep_quota_rules(
        self, preemptor_queue: str, preemptor_gpus: float, victims: Sequence[RunningJob]
    ) -> bool:
        """The preemptor fits its limits once the victims are gone, and no other queue is pushed below guarantee.

        Each victim taken from another queue must be taken while that queue still borrows: removing all of a
        queue's victims but the largest must leave it above its guarantee.
        """
        freed: dict[str, float] = {}
        largest: dict[str, float] = {}
        for v in victims:
            for q in self.config.path(v.queue):
                freed[q] = freed.get(q, 0.0) + v.gpus
            levels = self.sibling_levels(preemptor_queue, v.queue)
            if levels is not None:
                theirs = levels[1]
                largest[theirs] = max(largest.get(theirs, 0.0), v.gpus)
        for theirs, big in largest.items():
            left_before_last = self.held[theirs] - freed[theirs] + big
            if left_before_last <= self.config.queue(theirs).guarantee_gpus + _EPS:
                return False
        return self.blocking_queue(preemptor_queue, preemptor_gpus, freed) is None


def held_by_queue(running: Iterable[RunningJob], config: QueueConfig) -> dict[str, float]:
    held: dict[str, float] = {q.name: 0.0 for q in config.queues}
    paths = config.tree.paths
    for job in running:
        path = paths.get(job.queue)
        if path is None:
            continue  # a queue since removed from the config holds nothing it can be charged for
        gpus = job.gpus
        for q in path:
            held[q] += gpus
    return held
