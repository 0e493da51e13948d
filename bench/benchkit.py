"""What the end-to-end benchmarks share: percentiles, the job id of an event subject, waiting for the job stream's
consumers to catch up, one probe job through the platform, number formatting and the commit measured.

The benchmark scripts import it as a sibling module (`python bench/<script>.py` puts bench/ on the path); to run
one of them on an older checkout, copy this file beside it.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time
from pathlib import Path
from typing import Any, Protocol

from nats.js import JetStreamContext
from oneplus_contracts import JobSpec, subjects

from oneplus.client import OnePlusClient

ROOT = Path(__file__).resolve().parent.parent
JOB_SUBJECT_PREFIX = f"{subjects.PREFIX}.job."


class FinishWatch(Protocol):
    finished: dict[str, float]

    async def wait(self, seen: dict[str, float], ids: set[str], timeout: float) -> bool: ...


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(q / 100 * (len(s) - 1)))]


def job_of(subject: str) -> str:
    """`oneplus.job.<id>.<type>` → `<id>`."""
    return subject[len(JOB_SUBJECT_PREFIX) :].rsplit(".", 1)[0]


async def settle(js: JetStreamContext, timeout: float = 180.0) -> float:
    """Until no consumer of the job-event (or, where it exists, facts) stream has anything pending or unacknowledged."""
    t0 = time.monotonic()
    streams = [subjects.JOBS_STREAM] + [s for s in [getattr(subjects, "FACTS_STREAM", None)] if s]
    while time.monotonic() - t0 < timeout:
        busy = 0
        for stream in streams:
            with contextlib.suppress(Exception):
                for ci in await js.consumers_info(stream):
                    busy += (ci.num_pending or 0) + (ci.num_ack_pending or 0)
        if busy == 0:
            break
        await asyncio.sleep(0.25)
    return time.monotonic() - t0


async def probe(c: OnePlusClient, watch: FinishWatch, job: JobSpec, tag: str, timeout: float = 300) -> float:
    """One job through, to be sure the platform works before timing anything; its time, submit to finished."""
    t = time.monotonic()
    reply = await c.submit(job, msg_id=f"{tag}-probe", source="bench")
    assert reply.ok and reply.job_id, reply.error
    if not await watch.wait(watch.finished, {reply.job_id}, timeout):
        raise TimeoutError(f"the probe job {reply.job_id} did not finish within {timeout:.0f}s")
    return time.monotonic() - t


def fmt(v: Any, digits: int = 0) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def cpu_model() -> str | None:
    """The CPU as /proc/cpuinfo names it (model name, family/model/stepping): runs on different hosts differ by 1.5x."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            break  # the first processor's block ends at its blank line
        fields.setdefault(key.strip(), value.strip())
    name = fields.get("model name")
    if name is None:
        return None
    fms = "/".join(fields.get(k, "?") for k in ("cpu family", "model", "stepping"))
    return f"{name} (family/model/stepping {fms})"


def git_commit() -> str | None:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        return None
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True)
    return done.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
