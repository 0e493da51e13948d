"""The job list with many jobs in the hot view: a full `oneplus jobs list` and one page, timed through a real intake.

    uv run python bench/joblist_bench.py --jobs 10000 --out bench/results/joblist.json

Starts its own NATS and Redis (EmbeddedServers) and the intake process alone, writes `--jobs` records of live jobs
(RUNNING, one team) into the `jobs` bucket as the job owner would, then times: `OnePlusClient.list_jobs()` following
every page, `list_jobs(limit=100)`, and `oneplus jobs list --json` as a fresh process (every page). Each figure is the
best of `--repeat` runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import nats
from oneplus_contracts import JobRecord, JobSpec, RankResources, subjects

from oneplus.client import OnePlusClient
from oneplus.devstack import EmbeddedServers, Platform


def record(i: int, now: float) -> JobRecord:
    spec = JobSpec(name=f"bench-{i}", team="bench", user="alice", resources=RankResources(gpus=1))
    ts = now - 3600 + i * 0.01
    return JobRecord(job_id=f"j-{i:012x}", state="RUNNING", spec=spec, submitted_ts=ts, updated_ts=ts)


async def fill(url: str, n: int) -> None:
    nc = await nats.connect(url)
    js = nc.jetstream()
    now = time.time()
    for start in range(0, n, 1000):
        futures = [
            await js.publish_async(f"$KV.{subjects.JOBS_KV}.{r.job_id}", r.model_dump_json().encode())
            for r in (record(i, now) for i in range(start, min(n, start + 1000)))
        ]
        await asyncio.gather(*futures)
    await nc.close()


async def client_times(url: str, repeat: int) -> dict[str, float | int]:
    async with OnePlusClient.connect(url, team="bench") as c:
        best_all = best_page = float("inf")
        rows = 0
        for _ in range(repeat):
            t0 = time.perf_counter()
            rows = len(await c.list_jobs())
            best_all = min(best_all, time.perf_counter() - t0)
            t0 = time.perf_counter()
            await c.list_jobs(limit=100)
            best_page = min(best_page, time.perf_counter() - t0)
    return {"list_all_s": round(best_all, 3), "rows": rows, "list_100_ms": round(best_page * 1000, 1)}


def cli_time(url: str, repeat: int) -> dict[str, float | int]:
    env = {**os.environ, "NATS_URL": url, "ONEPLUS_TEAM": "bench"}
    best = float("inf")
    rows = 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = subprocess.run(
            [str(Path(sys.executable).with_name("oneplus")), "jobs", "list", "--json", "--team", "bench"],
            env=env, capture_output=True, text=True, check=True, timeout=900,
        )  # fmt: skip
        best = min(best, time.perf_counter() - t0)
        rows = len(json.loads(out.stdout))
    return {"cli_list_all_s": round(best, 3), "cli_rows": rows}


async def wait_intake(url: str) -> None:
    async with OnePlusClient.connect(url, team="bench") as c:
        deadline = time.monotonic() + 60
        while True:
            try:
                await c.list_jobs(limit=1)
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    with EmbeddedServers() as servers:
        platform = Platform(servers.nats_url, servers.redis_url, metrics=False, extra_env={"ONEPLUS_HTTP_PORT": "off"})
        platform.start_service("intake")
        try:
            asyncio.run(wait_intake(servers.nats_url))
            t0 = time.perf_counter()
            asyncio.run(fill(servers.nats_url, args.jobs))
            fill_s = time.perf_counter() - t0
            got: dict[str, object] = {"jobs_in_hot_view": args.jobs, "fill_s": round(fill_s, 2)}
            got |= asyncio.run(client_times(servers.nats_url, args.repeat))
            got |= cli_time(servers.nats_url, args.repeat)
        finally:
            platform.stop()
    got["command"] = "uv run python bench/joblist_bench.py " + " ".join(sys.argv[1:])
    print(json.dumps(got, indent=1))
    if args.out:
        args.out.write_text(json.dumps(got, indent=1) + "\n")


if __name__ == "__main__":
    main()
