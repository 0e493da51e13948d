"""Joint placement for `placement: cp-sat` queues: a queue's first waiting jobs placed together each cycle.

Before the cycle serves anyone, each such queue's window (its first `batch.window` waiting jobs in its serving
order, leaving out those waiting longer than `batch.max_wait_s`) goes to `place_batch`: greedy first, and CP-SAT
over candidate plans, warm-started from it, under `batch.time_limit_s`. A plan is kept only where CP-SAT's answer
places more GPUs than greedy's; a window that greedy places whole never runs CP-SAT. The cycle then serves jobs in
order as always (quotas, singletons, the head's block), and a planned job takes its planned GPUs. A job the plan
leaves out waits this cycle. Jobs served earlier in the cycle (other queues, nominations, the head's block) may take
planned GPUs: from the first planned allocation that no longer fits, the plan is dropped and the rest of the queue
is served by best fit.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from oneplus_contracts import Allocation
from oneplus_placement.batch import PendingGang, place_batch
from oneplus_placement.snapshot import ClusterState

from .config import QueueConfig
from .ordering import RankedJob


@dataclass
class BatchPlan:
    """One queue's joint answer for this cycle."""

    queue: str
    allocations: dict[str, Allocation]
    left_out: frozenset[str]
    placed_gpus: float
    greedy_gpus: float
    dropped: bool = False  # an earlier placement took planned GPUs: best fit serves the rest

    def left_out_message(self) -> str:
        return (
            f"queue {self.queue} places its first waiting jobs jointly (cp-sat): this cycle's free GPUs go to the "
            f"jobs that pack them best ({self.placed_gpus:g} GPUs placed, against {self.greedy_gpus:g} one by one)"
        )


def batch_queues(config: QueueConfig) -> list[str]:
    return [q.name for q in config.queues if q.placement == "cp-sat"]


def plan_batches(
    now: float,
    ranked: Sequence[RankedJob],
    served: Iterable[str],
    state: ClusterState,
    config: QueueConfig,
    seed: int = 0,
) -> dict[str, BatchPlan]:
    """The plans of this cycle's cp-sat queues (only those where CP-SAT places more GPUs than greedy)."""
    queues = batch_queues(config)
    if not queues:
        return {}
    policy = config.batch
    skip = set(served)
    plans: dict[str, BatchPlan] = {}
    for queue in queues:
        window = [
            job
            for job in ranked
            if job.job.queue == queue
            and job.job_id not in skip
            and now - job.job.submitted_ts < policy.max_wait_s
            and job.job.spec.resources.mig is None  # MIG instances are not GPUs of the batch model: greedy places them
            and job.job.spec.components is None  # a heterogeneous job's components are placed by greedy, together
            and not (job.job.spec.resources.isolated_share and queue not in config.timeslice_queues)  # needs MPS nodes
        ][: policy.window]
        if len(window) < 2:
            continue
        mix = queue in config.mixing_queues
        gangs = [PendingGang(job.job_id, job.job.spec, job.priority, mix_gpu_models=mix) for job in window]
        result = place_batch(state, gangs, time_limit_s=policy.time_limit_s, seed=seed, contested_only=True)
        if result.placed_gpus <= result.greedy_placed_gpus:  # greedy's answer is what the cycle gives anyway
            continue
        allocations = result.allocations
        plans[queue] = BatchPlan(
            queue=queue,
            allocations=allocations,
            left_out=frozenset(job.job_id for job in window if job.job_id not in allocations),
            placed_gpus=result.placed_gpus,
            greedy_gpus=result.greedy_placed_gpus,
        )
    return plans
