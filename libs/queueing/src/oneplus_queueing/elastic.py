"""Elastic gangs: the sizes an elastic job may run with, the part a shrink gives up, and when a gang may grow.

An elastic job (`JobSpec.elastic`) is placed at the largest rank count from its `ranks` (the most it asks) down to
`min_ranks` that fits now; at each size it is still one gang, placed whole or not at all. A change of size is a
rendezvous restart, which is what torchrun elastic does on any membership change: the job is signalled to checkpoint
(the preemption handshake, with its checkpoint signal and grace), gives its GPUs back, and is placed again on the GPUs
nominated for it at the new size; its ranks then get PET_NNODES=min:max and the world size they run with (the rank
count of the allocation). Live resizing in place (adding a rank to a running rendezvous) is not done.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from oneplus_contracts import Allocation, JobSpec

if TYPE_CHECKING:  # model.py sizes running jobs with this module
    from .model import RunningJob

# A gang grows only after running this many checkpoint graces at its size (and its own min_runtime_s), and when its
# time limit leaves as many: a restart costs one grace of all its GPUs.
GROW_MIN_REMAINING_GRACES = 10
MAX_GROWS_PER_CYCLE = 4  # each grow is a placement trial per size; the rest wait for the next cycle


def is_elastic(spec: JobSpec) -> bool:
    return spec.elastic is not None and spec.elastic.min_ranks < spec.elastic.max_ranks


def sized(spec: JobSpec, ranks: int) -> JobSpec:
    """The spec at another rank count inside its elastic range (what placement and the quota count)."""
    if ranks == spec.ranks:
        return spec
    return spec.model_copy(update={"ranks": ranks})


def running_size(spec: JobSpec, alloc: Allocation) -> JobSpec:
    """An elastic job runs with as many ranks as its allocation holds; a fixed gang's spec is returned as it is."""
    if spec.elastic is None or len(alloc.ranks) == spec.ranks or not alloc.ranks:
        return spec
    return sized(spec, len(alloc.ranks))


def smaller_sizes(spec: JobSpec) -> range:
    """The sizes below `ranks` to try, largest first, when the job does not fit at `ranks`."""
    if spec.elastic is None:
        return range(0)
    return range(spec.ranks - 1, spec.elastic.min_ranks - 1, -1)


def resize_pays_from(job: RunningJob) -> float:
    """From when a size change may be asked of a running elastic gang: after GROW_MIN_REMAINING_GRACES checkpoint
    graces at this size and its own min_runtime_s. A resize checkpoints first and so loses only the restart, which is
    why the site's victim floor (preemption.min_runtime_s, against losing work) does not hold it back."""
    spec = job.spec
    return job.started_ts + max(GROW_MIN_REMAINING_GRACES * max(spec.checkpoint.grace_s, 1), spec.min_runtime_s)


def may_grow(job: RunningJob) -> bool:
    e = job.spec.elastic
    return e is not None and not job.preempting and len(job.allocation.ranks) < e.max_ranks


def shrink_part(job: RunningJob, drop: int | None = None) -> tuple[RunningJob, Allocation] | None:
    """What an elastic job gives up when it shrinks by `drop` ranks (default: down to min_ranks), as a RunningJob of
    the dropped ranks (their GPUs, lost work and quota), and the allocation it keeps; None when it is at its minimum.

    The highest ranks go: rank 0 (the rendezvous endpoint) stays, and a multi-node gang frees its last nodes whole."""
    e = job.spec.elastic
    have = len(job.allocation.ranks)
    if e is None or have <= e.min_ranks:
        return None
    drop = have - e.min_ranks if drop is None else min(drop, have - e.min_ranks)
    if drop < 1:
        return None
    ordered = sorted(job.allocation.ranks, key=lambda r: r.rank)
    kept, dropped = ordered[: have - drop], ordered[have - drop :]
    part = dataclasses.replace(
        job, spec=sized(job.spec, drop), allocation=job.allocation.model_copy(update={"ranks": dropped})
    )
    return part, job.allocation.model_copy(update={"ranks": kept})
