"""How a queue lets its jobs pass one another: the queueing strategy, chosen per queue (`queueing:` in the config).

These are Kueue's two strategies:

- `best-effort-fifo` (the default): a queue's jobs are served in the cycle's order (priority, fair share, age,
  size). A job that cannot start now does not hold back the later ones of its queue; they start if they fit, under
  the protected job's backfill rules.
- `strict-fifo`: a queue's jobs are served by priority, then submission time. The first one that waits holds back
  every later job of its queue, so nothing of that queue starts out of turn. Use it for work whose order matters
  more than the cluster's fill: pipeline stages submitted as separate jobs, or a team that wants first come, first
  served. Other queues are not held back; their jobs take what the waiting job cannot use.

The live solver and the simulator both serve through `schedule_cycle`, so both run the same strategies.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Protocol

from .config import QueueConfig, QueueConfigError
from .ordering import RankedJob


class QueueingStrategy(Protocol):
    name: ClassVar[str]
    holds_back: ClassVar[bool]  # a job of the queue that waits keeps every later job of the queue waiting too

    def order(self, jobs: Sequence[RankedJob]) -> list[RankedJob]:
        """One queue's jobs, from the cycle's order, in the order this queue serves them."""
        ...


class BestEffortFifo:
    name: ClassVar[str] = "best-effort-fifo"
    holds_back: ClassVar[bool] = False

    def order(self, jobs: Sequence[RankedJob]) -> list[RankedJob]:
        return list(jobs)


class StrictFifo:
    name: ClassVar[str] = "strict-fifo"
    holds_back: ClassVar[bool] = True

    def order(self, jobs: Sequence[RankedJob]) -> list[RankedJob]:
        return sorted(jobs, key=lambda r: (-r.priority, r.job.submitted_ts, r.job_id))


STRATEGIES: dict[str, QueueingStrategy] = {s.name: s for s in (BestEffortFifo(), StrictFifo())}


def strategy_of(config: QueueConfig, queue: str) -> QueueingStrategy:
    """The strategy of `queue`; best effort for a queue the config does not know (the cycle refuses its jobs)."""
    try:
        return STRATEGIES[config.queue(queue).queueing]
    except QueueConfigError:
        return STRATEGIES[BestEffortFifo.name]


def serving_order(ranked: Sequence[RankedJob], config: QueueConfig) -> list[RankedJob]:
    """The cycle's order with each queue's jobs put in its strategy's order, in the places its jobs held: queues
    still interleave as the cycle ranked them."""
    slots: dict[str, list[int]] = {}
    for i, job in enumerate(ranked):
        slots.setdefault(job.job.queue, []).append(i)
    out = list(ranked)
    for queue, places in slots.items():
        for i, job in zip(places, strategy_of(config, queue).order([ranked[i] for i in places]), strict=True):
            out[i] = job
    return out
