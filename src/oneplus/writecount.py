"""Durable JetStream appends per job, counted from stream sequences (issue 42, item 1's measure).

Every stream's last sequence is read before and after one-GPU jobs run from submission to the archive, on the
embedded stack with simulated executors, through the public submit path. Streams that also change without jobs
(heartbeats, liveness beats, the owner lease) are measured idle first over a window of their own, and that rate times
the jobs' span is subtracted. A count, not a timing: it does not depend on the speed of the machine, only the
background subtraction is a rate (its share per job shrinks with the number of jobs).

    uv run python bench/writes_bench.py --jobs 100          # the table (task bench:writes)
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path

import nats
from nats.js import JetStreamContext
from oneplus_contracts import JobSpec, RankResources, SimulatedRun, subjects

from .client import OnePlusClient
from .demo import wait_for_platform
from .devstack import DEMO_NODES, EmbeddedServers, Platform

# What each stream holds, for the table (the others are named by their stream).
LABELS = {
    subjects.JOBS_STREAM: "job events",
    f"KV_{subjects.JOBS_KV}": "jobs KV records",
    subjects.FACTS_STREAM: "facts",
    subjects.AUDIT_STREAM: "reservation audit",
    subjects.ARCHIVE_STREAM: "archive",
    subjects.COMMANDS_STREAM: "commands (launch)",
    f"KV_{subjects.SOLVER_STATE_KV}": "solver_state",
}


@dataclass
class WriteCount:
    jobs: int
    span_s: float  # from the first submission until the last write the jobs caused
    idle_s: float  # the idle window the background rate was read over
    appends: dict[str, int] = field(default_factory=dict)  # stream → appends during the jobs' span
    background: dict[str, float] = field(default_factory=dict)  # stream → appends a second while idle

    def per_job(self) -> dict[str, float]:
        """Appends a job made on each stream, background subtracted (never below 0), the streams with none left out."""
        out = {}
        for stream, n in self.appends.items():
            v = max(0.0, n - self.background.get(stream, 0.0) * self.span_s) / self.jobs
            if v >= 0.005:
                out[stream] = round(v, 2)
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))

    @property
    def total(self) -> float:
        return round(sum(self.per_job().values()), 1)

    def table(self) -> str:
        rows = [f"{'stream':<28} {'what':<20} {'appends/job':>11}"]
        for stream, v in self.per_job().items():
            rows.append(f"{stream:<28} {LABELS.get(stream, ''):<20} {v:>11.2f}")
        rows.append(f"{'total':<28} {'':<20} {self.total:>11.1f}")
        rows.append(f"({self.jobs} one-GPU jobs in {self.span_s:.1f} s; background over {self.idle_s:.0f} s idle)")
        return "\n".join(rows)


async def last_seqs(js: JetStreamContext) -> dict[str, int]:
    """Every stream's last sequence (KV buckets are the streams KV_<bucket>)."""
    return {str(info.config.name): int(info.state.last_seq or 0) for info in await js.streams_info()}


def one_gpu_job(i: int, duration_s: float) -> JobSpec:
    return JobSpec(
        name=f"writes-{i}",
        resources=RankResources(gpus=1, cpus=1, memory_mb=1024),
        simulate=SimulatedRun(duration_s=duration_s),
    )


async def count_writes(
    nats_url: str, jobs: int, *, idle_s: float = 10.0, duration_s: float = 0.2, timeout_s: float = 300.0
) -> WriteCount:
    """Run `jobs` one-GPU jobs on a started platform (its finished jobs archived within a second or two:
    ONEPLUS_MIN_JOB_AGE_S small) and count the appends they made. The platform must be idle when called."""
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        c = OnePlusClient(nc, timeout=30.0)
        t0, idle0 = time.monotonic(), await last_seqs(js)
        await asyncio.sleep(idle_s)
        idle1, idle_span = await last_seqs(js), time.monotonic() - t0
        background = {s: (idle1.get(s, 0) - idle0.get(s, 0)) / idle_span for s in idle1}
        archived0 = int((await js.stream_info(subjects.ARCHIVE_STREAM)).state.messages or 0)
        before, start = await last_seqs(js), time.monotonic()
        replies = await asyncio.gather(
            *(c.submit(one_gpu_job(i, duration_s), msg_id=f"writes-{start}-{i}") for i in range(jobs))
        )
        refused = [r.error for r in replies if not r.ok]
        if refused:
            raise RuntimeError(f"{len(refused)} submission(s) refused: {refused[:3]}")
        deadline = start + timeout_s
        while int((await js.stream_info(subjects.ARCHIVE_STREAM)).state.messages or 0) < archived0 + jobs:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the {jobs} jobs were not all archived within {timeout_s:g} s")
            await asyncio.sleep(0.2)
        # The last writes the jobs cause (the projected sequence, the purges' neighbours) come just after.
        end, quiet = time.monotonic(), await last_seqs(js)
        caused = set(LABELS) - {f"KV_{subjects.SOLVER_STATE_KV}"}
        while time.monotonic() - end < 3.0:
            await asyncio.sleep(1.0)
            now = await last_seqs(js)
            if any(now.get(s) != quiet.get(s) for s in caused):
                end, quiet = time.monotonic(), now
        after = quiet
        span = end - start
        appends = {s: after.get(s, 0) - before.get(s, 0) for s in after}
        return WriteCount(jobs, span, idle_span, appends, background)
    finally:
        await nc.close()


def platform_env() -> dict[str, str]:
    return {"ONEPLUS_MIN_JOB_AGE_S": "1", "ONEPLUS_HEARTBEAT_S": "1"}


async def measure(jobs: int, workdir: Path, *, idle_s: float = 10.0, duration_s: float = 0.2) -> WriteCount:
    """Fresh embedded servers and platform, `count_writes`, then everything stopped."""
    servers = EmbeddedServers(workdir=workdir / "servers")
    servers.start()
    platform: Platform | None = None
    try:
        platform = Platform(
            servers.nats_url, servers.redis_url, nodes=DEMO_NODES, logdir=workdir / "logs", extra_env=platform_env()
        ).start()
        async with OnePlusClient.connect(servers.nats_url) as c:
            await wait_for_platform(c, len(DEMO_NODES), timeout=180)
            # One job first: what the first job alone sets up (a queue's usage key, consumers) is not counted.
            reply = await c.submit(one_gpu_job(-1, 0.1), msg_id="writes-warmup")
            assert reply.ok and reply.job_id, reply.error
            deadline = time.monotonic() + 60
            while (await c.get_job(reply.job_id)).state != "SUCCEEDED":
                if time.monotonic() > deadline:
                    raise TimeoutError("the warm-up job did not end within 60 s")
                await asyncio.sleep(0.2)
            await asyncio.sleep(3.0)  # archived and purged
        return await count_writes(servers.nats_url, jobs, idle_s=idle_s, duration_s=duration_s)
    finally:
        if platform is not None:
            platform.stop()
        servers.stop()
