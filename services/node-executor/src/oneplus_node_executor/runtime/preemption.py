"""Preempting a job on this node: ask it to checkpoint, wait for the acknowledgement up to the grace period, stop it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from .base import Runtime


@dataclass(frozen=True)
class PreemptOutcome:
    acknowledged: bool
    checkpoint_ts: float | None
    waited_s: float


async def preempt_with_checkpoint(
    runtime: Runtime,
    job_id: str,
    *,
    signal: str,
    grace_s: float,
    stop_grace_s: float = 10.0,
    poll_s: float = 0.2,
    clock: Callable[[], float] = time.monotonic,
    before_stop: Callable[[PreemptOutcome], Awaitable[None]] | None = None,
    ended: asyncio.Event | None = None,
) -> PreemptOutcome:
    """Signal, poll `checkpoint_acknowledged` until it answers or grace_s runs out, then stop (SIGTERM, then kill).

    The ranks are stopped either way: a job that never acknowledges loses the work since its last checkpoint, which
    is the price the preemption policy already weighed. `before_stop` hears the outcome while the ranks still run
    (the executor records `job.checkpointed` there, so it precedes the ranks' end in the job's history).
    `ended` is set by whoever watches the ranks: once they have all exited, no acknowledgement can come any more.
    """
    if grace_s < 0:
        raise ValueError(f"grace_s={grace_s}: a grace period cannot be negative")
    start = clock()
    deadline = start + grace_s
    await runtime.signal(job_id, signal)
    ack = await runtime.checkpoint_acknowledged(job_id)
    while ack is None and clock() < deadline:
        if ended is not None and ended.is_set():
            ack = await runtime.checkpoint_acknowledged(job_id)  # a marker written on the way out still counts
            break
        await asyncio.sleep(min(poll_s, max(deadline - clock(), 0.0)))
        ack = await runtime.checkpoint_acknowledged(job_id)
    outcome = PreemptOutcome(acknowledged=ack is not None, checkpoint_ts=ack, waited_s=clock() - start)
    if before_stop is not None:
        await before_stop(outcome)
    await runtime.stop(job_id, stop_grace_s)
    return outcome
