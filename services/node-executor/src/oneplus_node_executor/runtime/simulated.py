"""A runtime that runs no process: each job 'runs' for its simulated duration.

Used by the demo, the end-to-end tests and the simulator's live mode. It honours the same
lifecycle as a container: signals, checkpoint acknowledgement after a delay, stop, exit codes.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

from oneplus_contracts import LaunchRanks
from oneplus_contracts.slim import slim

from .base import RanksExit, RunningRanks

STOPPED_EXIT = 143  # 128 + SIGTERM, as a container stopped by the engine reports it
SIMULATED = "simulated"  # how its exits begin: the solver says a job that ran here was simulated


def simulated_note(cmd: LaunchRanks) -> str:
    """The first log line of a simulated job: what would have run, and that nothing did."""
    sim = cmd.spec.simulate
    duration = max(0.0, (sim.duration_s if sim else 1.0) - cmd.resume_progress_s)
    code = sim.exit_code if sim else 0
    what = " ".join([*(cmd.spec.entrypoint or []), *cmd.spec.command]) or "(the image's command)"
    return (
        f"[{SIMULATED}] runtime simulated: `{what}` is not run; the ranks hold their GPUs {duration:g} s "
        f"(simulate.duration_s) and exit {code}"
    )


@dataclass
class _SimJob:
    cmd: LaunchRanks
    task: asyncio.Task[RanksExit] | None = None
    stop_reason: str | None = None
    checkpoint_ts: float | None = None
    logs: list[str] = field(default_factory=list)  # a signal received is one of its lines
    stopped: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(slots=True)
class _EndedSimJob:
    """What is kept of a simulated job once its ranks have exited (until the node forgets it): its logs and exit.

    A fleet keeps 16 ended jobs on each of its nodes; kept whole (launch command, task and its context, event) they
    were ~40 objects each, and the fleet's CPU a gang grew with them (bench:scale: 0.48 → 0.64 ms a gang from 0 to
    20,000 finished jobs, flat with none kept)."""

    token: int
    ranks: int
    logs: list[str]
    exit: RanksExit
    checkpoint_ts: float | None


class SimulatedRuntime:
    name = "simulated"

    def __init__(self, time_scale: float = 1.0) -> None:
        self.time_scale = time_scale
        self._jobs: dict[str, _SimJob] = {}  # ranks still running
        self._ended: dict[str, _EndedSimJob] = {}  # ranks exited, kept until removed

    def _token(self, job_id: str) -> int | None:
        if (job := self._jobs.get(job_id)) is not None:
            return job.cmd.token
        ended = self._ended.get(job_id)
        return ended.token if ended is not None else None

    async def launch(self, cmd: LaunchRanks, env_per_rank: dict[int, dict[str, str]]) -> None:
        current = self._token(cmd.job_id)
        if current is not None and current >= cmd.token:
            return  # idempotent by (job, token): a redelivered launch starts nothing
        self._ended.pop(cmd.job_id, None)
        slim(cmd)  # kept while the ranks run: a fleet's nodes run thousands
        job = _SimJob(cmd=cmd)  # no process: the ranks' environment is not used
        job.logs.append(simulated_note(cmd))
        job.logs.extend(f"[rank {r.rank}] started on {r.node} gpus={r.gpus}" for r in cmd.ranks)
        job.task = asyncio.create_task(self._run(job), name=f"sim:{cmd.job_id}")
        self._jobs[cmd.job_id] = job

    async def _run(self, job: _SimJob) -> RanksExit:
        result = await self._ranks(job)
        if self._jobs.get(job.cmd.job_id) is job:  # not removed meanwhile, nor replaced by a newer attempt
            del self._jobs[job.cmd.job_id]
            self._ended[job.cmd.job_id] = _EndedSimJob(
                job.cmd.token, len(job.cmd.ranks), job.logs, result, job.checkpoint_ts
            )
        return result

    async def _ranks(self, job: _SimJob) -> RanksExit:
        sim = job.cmd.spec.simulate
        # A resumed job only has the work left after its last checkpoint.
        duration = max(0.0, (sim.duration_s if sim else 1.0) - job.cmd.resume_progress_s) * self.time_scale
        code = sim.exit_code if sim else 0
        try:
            await asyncio.wait_for(job.stopped.wait(), timeout=duration)
        except TimeoutError:
            job.logs.extend(f"[rank {r.rank}] exited {code}" for r in job.cmd.ranks)
            why = f"{SIMULATED}: exited {code} after {duration:g} s (no process ran)"
            return RanksExit(code, why, {r.rank: code for r in job.cmd.ranks})
        reason = job.stop_reason or "stopped"
        return RanksExit(
            STOPPED_EXIT,
            reason,
            {r.rank: STOPPED_EXIT for r in job.cmd.ranks},
            checkpointed=job.checkpoint_ts is not None,
            checkpoint_ts=job.checkpoint_ts,
        )

    async def wait(self, job_id: str) -> RanksExit:
        if (ended := self._ended.get(job_id)) is not None:
            return ended.exit
        job = self._jobs[job_id]
        assert job.task is not None
        return await asyncio.shield(job.task)

    async def signal(self, job_id: str, signal: str) -> None:
        job = self._jobs.get(job_id)
        if job is None:
            return  # no rank left to signal
        job.logs.append(f"received {signal}")
        sim = job.cmd.spec.simulate
        delay = sim.checkpoint_after_s if sim else 0.2
        if signal == job.cmd.spec.checkpoint.signal and delay is not None:
            asyncio.get_running_loop().call_later(delay * self.time_scale, self._mark_checkpoint, job)

    def _mark_checkpoint(self, job: _SimJob) -> None:
        job.checkpoint_ts = time.time()
        job.logs.append("checkpoint written")
        ended = self._ended.get(job.cmd.job_id)
        if ended is not None and ended.token == job.cmd.token:  # the ranks exited before the checkpoint's delay
            ended.checkpoint_ts = job.checkpoint_ts

    async def checkpoint_acknowledged(self, job_id: str) -> float | None:
        if (ended := self._ended.get(job_id)) is not None:
            return ended.checkpoint_ts
        job = self._jobs.get(job_id)
        return job.checkpoint_ts if job else None

    async def stop(self, job_id: str, grace_s: float) -> None:
        job = self._jobs.get(job_id)
        if job is None:
            return
        job.stop_reason = job.stop_reason or "stopped"
        job.stopped.set()

    async def remove(self, job_id: str, token: int | None = None) -> int:
        if (ended := self._ended.get(job_id)) is not None:
            if token is not None and ended.token != token:
                return 0
            del self._ended[job_id]
            return ended.ranks
        job = self._jobs.get(job_id)
        if job is None or (token is not None and job.cmd.token != token):
            return 0
        del self._jobs[job_id]
        job.stopped.set()
        return len(job.cmd.ranks)

    async def list_running(self) -> list[RunningRanks]:
        return [
            RunningRanks(j.cmd.job_id, j.cmd.token, tuple(r.rank for r in j.cmd.ranks))
            for j in self._jobs.values()
            if j.task is not None and not j.task.done()
        ]

    async def logs(self, job_id: str, rank: int | None, follow: bool) -> list[str]:
        job = self._jobs.get(job_id)
        ended = self._ended.get(job_id)
        lines = job.logs if job is not None else ended.logs if ended is not None else []
        if rank is None:
            return list(lines)
        return [line for line in lines if line.startswith(f"[rank {rank}]") or not line.startswith("[rank")]

    async def healthy(self) -> tuple[bool, str | None]:
        return True, None

    async def close(self) -> None:
        for job in list(self._jobs.values()):  # each leaves the dict as its ranks exit
            job.stopped.set()
            if job.task is not None:
                with contextlib.suppress(Exception):
                    await job.task
