"""Starting the five services as separate processes for end-to-end tests, and reading what they left behind."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import nats
import redis.asyncio as aioredis
from nats.aio.client import Client
from nats.js.api import DeliverPolicy
from oneplus_contracts import JobRecord, parse_job_event, subjects
from oneplus_reservations import ReservationStore
from oneplus_testing import wipe_bus

from oneplus.client import OnePlusClient
from oneplus.demo import wait_for_platform
from oneplus.devstack import DEMO_NODES, Platform


async def start_platform(
    nats_url: str, redis_url: str, workdir: Path, *, solver_replicas: int = 1, **env: str
) -> Platform:
    (workdir / "spans").mkdir(parents=True, exist_ok=True)
    extra = {
        "ONEPLUS_TRACE_DIR": str(workdir / "spans"),
        "ONEPLUS_HEARTBEAT_S": "0.5",
        "ONEPLUS_NODE_LOST_AFTER_S": "6",
        **env,
    }
    platform = Platform(
        nats_url,
        redis_url,
        nodes=DEMO_NODES,
        logdir=workdir / "logs",
        extra_env=extra,
        solver_replicas=solver_replicas,
    ).start()
    try:
        async with OnePlusClient.connect(nats_url) as c:
            await wait_for_platform(c, len(DEMO_NODES), timeout=120)
    except Exception as exc:
        dead = platform.dead()
        platform.stop()
        tails = "\n".join(
            f"--- {name} (exit {code}):\n" + "\n".join(platform.logs(name).splitlines()[-15:])
            for name, code in dead.items()
        )
        raise AssertionError(f"{exc}; exited: {dead or 'none'}\n{tails}") from exc
    except BaseException:
        platform.stop()
        raise
    return platform


@asynccontextmanager
async def fresh_platform(
    nats_url: str, redis_url: str, workdir: Path, *, solver_replicas: int = 1, **env: str
) -> AsyncIterator[tuple[Platform, Client, ReservationStore]]:
    """Empty streams, buckets and reservations, then the platform; yields it with a bus connection and the store."""
    nc = await nats.connect(nats_url)
    store = ReservationStore(aioredis.Redis.from_url(redis_url))
    try:
        await wipe_bus(nc)
        await store.wipe()
        platform = await start_platform(nats_url, redis_url, workdir, solver_replicas=solver_replicas, **env)
        try:
            yield platform, nc, store
        finally:
            platform.stop()
    finally:
        await store.close()
        await nc.close()


async def wait_terminal(
    c: OnePlusClient, ids: Iterable[str], timeout: float, platform: Platform | None = None
) -> dict[str, JobRecord]:
    wanted = set(ids)
    deadline = time.monotonic() + timeout
    jobs: dict[str, JobRecord] = {}
    seen = 0
    while time.monotonic() < deadline:
        listed = await c.list_jobs()
        seen = len(listed)
        jobs = {r.job_id: r for r in listed if r.job_id in wanted}
        if len(jobs) == len(wanted) and all(r.terminal for r in jobs.values()):
            return jobs
        await asyncio.sleep(0.3)
    states = {i: (jobs[i].state if i in jobs else "missing") for i in wanted}
    logs = platform.logdir if platform else "?"
    raise AssertionError(f"jobs not terminal after {timeout}s: {states}; {seen} jobs listed (logs in {logs})")


async def job_history(nc: Client, job_id: str) -> list[Any]:
    """Every event of one job, in stream order, read back from JetStream."""
    js = nc.jetstream()
    sub = await js.subscribe(subjects.job_events_of(job_id), ordered_consumer=True, deliver_policy=DeliverPolicy.ALL)
    events: list[Any] = []
    try:
        while True:
            try:
                # Generous: on a loaded machine a slow delivery must not cut the history short.
                msg = await sub.next_msg(timeout=10.0 if events else 2.0)
            except (TimeoutError, nats.errors.TimeoutError):
                break
            events.append(parse_job_event(msg.data))
            if msg.metadata.num_pending == 0:
                break  # the last event of this job the stream holds right now
    finally:
        await sub.unsubscribe()
    return events


def read_spans(folder: Path) -> list[dict[str, Any]]:
    spans = []
    for f in sorted(folder.glob("spans-*.jsonl")):
        for line in f.read_text().splitlines():
            if line.strip():
                spans.append(json.loads(line))
    return spans
