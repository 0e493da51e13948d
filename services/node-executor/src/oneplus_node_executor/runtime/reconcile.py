"""After an executor restart: match the containers found on the node with the reservations in Redis.

Redis is the source of truth (invariant 1): ranks whose fencing token is the job's current one are adopted, every
other container is an orphan to stop and remove, and a reservation with no ranks here is a leak candidate.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from .base import RunningRanks
from .docker import DockerRuntime


@dataclass(frozen=True)
class ReconcilePlan:
    adopt: list[RunningRanks] = field(default_factory=list)  # current token: wait on them / report their exit
    orphans: list[RunningRanks] = field(default_factory=list)  # no reservation or a stale token: remove
    leaked: dict[str, int] = field(default_factory=dict)  # job → token reserved for this node with no ranks here


def plan_reconcile(found: Iterable[RunningRanks], reserved: Mapping[str, int]) -> ReconcilePlan:
    """`found`: every (job, token) with containers on this node; `reserved`: job → current token of the
    reservations that place ranks on this node."""
    plan = ReconcilePlan()
    present: set[tuple[str, int]] = set()
    for ranks in found:
        present.add((ranks.job_id, ranks.token))
        if reserved.get(ranks.job_id) == ranks.token:
            plan.adopt.append(ranks)
        else:
            plan.orphans.append(ranks)
    plan.leaked.update({job: tok for job, tok in reserved.items() if (job, tok) not in present})
    return plan


async def reconcile_node(runtime: DockerRuntime, reserved: Mapping[str, int]) -> ReconcilePlan:
    """Plan from what the engine holds, then remove the orphans; adoption and releases are the caller's.

    Orphans are killed, not stopped gracefully: their GPUs may already belong to someone else.
    """
    plan = plan_reconcile(await runtime.list_managed(), reserved)
    for orphan in plan.orphans:
        await runtime.remove(orphan.job_id, orphan.token)
    return plan
