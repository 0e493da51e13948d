"""Slurm's job dependencies (`--dependency`): which pending jobs may be considered this cycle (pure).

A job's dependencies name other OnePlus jobs by id. Per dependency, given the other job's state:

| type | satisfied when the job | never satisfiable when it |
|---|---|---|
| `after` | has left the queue (placed, running, or ended) | is unknown |
| `afterany` | has ended (SUCCEEDED, FAILED, CANCELLED) | is unknown |
| `afterok` | SUCCEEDED | FAILED or CANCELLED, or is unknown |
| `afternotok` | FAILED or CANCELLED | SUCCEEDED, or is unknown |

All dependencies must be satisfied (Slurm's `,`); with `dependency_any` (Slurm's `?`) one is enough, and the job
is doomed only when every one is never satisfiable. `singleton`: at most one job per (name, user) holds GPUs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

from oneplus_contracts import JobSpec

Verdict = Literal["ready", "wait", "never"]
_ENDED = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})
_NOT_OK = frozenset({"FAILED", "CANCELLED"})


@dataclass(frozen=True, slots=True)
class DependencyCheck:
    verdict: Verdict
    message: str


def _one(kind: str, job_id: str, state: str | None) -> tuple[Verdict, str]:
    if state is None or state == "REJECTED":
        return "never", f"{kind}:{job_id}: no job {job_id}"
    if kind == "after":
        return ("wait", f"{kind}:{job_id}: {job_id} has not started") if state == "ACCEPTED" else ("ready", "")
    ended = state in _ENDED
    if kind == "afterany":
        return ("ready", "") if ended else ("wait", f"{kind}:{job_id}: {job_id} is {state}")
    if kind == "afterok":
        if state == "SUCCEEDED":
            return "ready", ""
        if ended:
            return "never", f"{kind}:{job_id}: {job_id} ended {state}"
        return "wait", f"{kind}:{job_id}: {job_id} is {state}"
    # afternotok
    if state in _NOT_OK:
        return "ready", ""
    if state == "SUCCEEDED":
        return "never", f"{kind}:{job_id}: {job_id} SUCCEEDED"
    return "wait", f"{kind}:{job_id}: {job_id} is {state}"


def referenced_jobs(specs: Iterable[JobSpec]) -> set[str]:
    """Every job id the dependencies of `specs` name."""
    return {j for s in specs for d in s.dependencies for j in d.job_ids}


def check_dependencies(spec: JobSpec, state_of: Callable[[str], str | None]) -> DependencyCheck:
    """`ready`, `wait` (reason `Dependency`) or `never` (`DependencyNeverSatisfied`) for one pending job.

    `state_of(job_id)` is the other job's state, None when there is no such job.
    """
    if not spec.dependencies:
        return DependencyCheck("ready", "")
    results = [_one(d.type, j, state_of(j)) for d in spec.dependencies for j in d.job_ids]
    verdicts = [v for v, _ in results]
    waiting = "; ".join(m for v, m in results if v == "wait")
    never = "; ".join(m for v, m in results if v == "never")
    if spec.dependency_any:
        if "ready" in verdicts:
            return DependencyCheck("ready", "")
        if "wait" in verdicts:
            return DependencyCheck("wait", f"waiting for any of: {waiting}")
        return DependencyCheck("never", f"no dependency can be satisfied: {never}")
    if never:
        return DependencyCheck("never", never)
    if waiting:
        return DependencyCheck("wait", f"waiting for {waiting}")
    return DependencyCheck("ready", "")


def singleton_key(spec: JobSpec) -> tuple[str, str]:
    return spec.name, spec.user


MAX_CYCLE_WALK = 10_000  # jobs looked at when checking a new job's dependencies for a cycle


def dependency_cycle(job_id: str, spec: JobSpec, depends_on: Callable[[str], Iterable[str] | None]) -> list[str] | None:
    """The chain `job_id -> ... -> job_id` that the new job's dependencies would close, or None.

    Job ids come from submission ids, which a client may choose, so a job can name a job not submitted yet (or its
    own id); a later job naming it back would make both wait for ever. `depends_on(id)` is the job ids an existing
    job's dependencies name (None: no such job)."""
    seen: dict[str, str | None] = {}
    stack: list[tuple[str, str | None]] = [(j, None) for d in spec.dependencies for j in d.job_ids]
    while stack and len(seen) < MAX_CYCLE_WALK:
        current, parent = stack.pop()
        if current in seen:
            continue
        seen[current] = parent
        if current == job_id:
            chain = [current]
            step = parent
            while step is not None:
                chain.append(step)
                step = seen[step]
            return [job_id, *reversed(chain)]
        stack.extend((j, current) for j in depends_on(current) or ())
    return None
