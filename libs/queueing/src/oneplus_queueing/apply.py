"""Carrying out a cycle's decision: the same steps for the solver, the simulator and the test harness.

The victims of each preemption choice that still hold GPUs and are not already leaving are evicted once each, and
counted against the preemption rate limit by their own GPUs; placements start on the cluster state. Every driver
calls `apply_decision`, then does what its world does with a start or an eviction: the simulator and the test
harness keep one `ClusterState` and start the jobs at once; the live solver passes its binder, which assumes each
placement in the working set (kube-scheduler's assume) until the reservation store binds it or refuses it (forget).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from oneplus_contracts import Allocation
from oneplus_placement.snapshot import ClusterState

from .elastic import running_size
from .fairshare import UsageHistory
from .model import CycleDecision, PendingJob, RunningJob


@dataclass(frozen=True, slots=True)
class Eviction:
    victim: RunningJob  # as it ran before this decision
    preemptor: str
    resize_to: Allocation | None = None  # an elastic victim that restarts at once on this allocation (checkpoint first)

    @property
    def grows(self) -> bool:
        """The elastic job is its own victim: it steps aside only to come back larger."""
        return self.victim.job_id == self.preemptor

    @property
    def freed_gpus(self) -> float:
        """What the eviction gives the preemptor: a shrinking victim keeps the ranks of `resize_to`."""
        kept = len(self.resize_to.ranks) * self.victim.spec.resources.gpus if self.resize_to is not None else 0.0
        return self.victim.gpus - kept


@dataclass(frozen=True, slots=True)
class Applied:
    started: list[RunningJob]
    evicted: list[Eviction]


class Assumes(Protocol):
    """A world that takes a decision's placements by job (the live solver's binder): held at once, bound later."""

    def assume(self, job_id: str, alloc: Allocation) -> None: ...


def evictions(decision: CycleDecision, running: Mapping[str, RunningJob]) -> list[Eviction]:
    """Each victim of the decision once, in decision order; one already leaving or no longer running is skipped."""
    out: list[Eviction] = []
    seen: set[str] = set()
    for choice in decision.preemptions:
        for job_id in choice.victims:
            run = running.get(job_id)
            if run is None or run.preempting or job_id in seen:
                continue
            seen.add(job_id)
            out.append(Eviction(run, choice.preemptor, choice.resized.get(job_id)))
    return out


def record_evictions(usage: UsageHistory, now: float, evicted: Iterable[Eviction]) -> None:
    """The rate limit counts every eviction, with the victim's GPUs; an elastic job growing evicts nobody."""
    for e in evicted:
        if e.grows:
            continue
        usage.record_preemption(now, e.victim.job_id, e.preemptor, e.freed_gpus)


def apply_decision(
    decision: CycleDecision,
    state: ClusterState | Assumes,
    pending: Mapping[str, PendingJob],
    running: dict[str, RunningJob],
    usage: UsageHistory,
) -> Applied:
    """Apply `decision` to a world kept in memory: victims marked preempting (they hold their GPUs until they have
    checkpointed and the driver releases them) and counted; placements applied to `state` (or assumed by it) and
    running from now."""
    evicted = evictions(decision, running)
    for e in evicted:
        running[e.victim.job_id] = dataclasses.replace(e.victim, preempting=True)
    record_evictions(usage, decision.now, evicted)
    started: list[RunningJob] = []
    for job_id, alloc in decision.placements.items():
        job = pending[job_id]
        if isinstance(state, ClusterState):
            state.apply(alloc)
        else:
            state.assume(job_id, alloc)
        spec = running_size(job.spec, alloc)  # an elastic job runs with the ranks it was placed with
        run = running[job_id] = RunningJob(job_id, spec, alloc, decision.now, None, job.preemptions)
        started.append(run)
    return Applied(started, evicted)
