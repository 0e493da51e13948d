"""End-to-end benchmark (BENCHMARKS.md §4): jobs through the public submit subject of a running platform.

Starts the embedded stack (unless NATS_URL/REDIS_URL are set), four simulated executors, then:
- paced: N one-GPU jobs at a fixed rate well under capacity → submit→placed latency p50/p99 (scheduling path
  only, no waiting for GPUs);
- burst: N jobs at once → sustained placements per second.
Prints a table and writes bench/results/e2e.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform as host
import statistics
import sys
import time
from pathlib import Path

from benchkit import cpu_model, git_commit, pct
from oneplus_contracts import JobRecord, JobSpec, RankResources, SimulatedRun

from oneplus.client import OnePlusClient
from oneplus.demo import wait_for_platform
from oneplus.devstack import DEMO_NODES, EmbeddedServers, Platform, urls_from_env


async def wait_placed(c: OnePlusClient, ids: set[str], timeout: float) -> dict[str, JobRecord]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        jobs = {r.job_id: r for r in await c.list_jobs() if r.job_id in ids}
        if len(jobs) == len(ids) and all(r.placed_ts for r in jobs.values()):
            return jobs
        await asyncio.sleep(0.2)
    raise TimeoutError(f"not every job was placed within {timeout}s")


def spec(i: int, duration: float) -> JobSpec:
    return JobSpec(
        name=f"bench-{i}",
        resources=RankResources(gpus=1, cpus=1, memory_mb=1024),
        simulate=SimulatedRun(duration_s=duration),
    )


async def run(nats_url: str, n: int, rate: float, tag: str) -> dict[str, object]:
    async with OnePlusClient.connect(nats_url, timeout=10) as c:
        await wait_for_platform(c, len(DEMO_NODES))
        # paced
        ids: set[str] = set()
        t0 = time.monotonic()
        for i in range(n):
            reply = await c.submit(spec(i, 0.5), msg_id=f"{tag}-paced-{i}", source="bench")
            assert reply.ok and reply.job_id, reply.error
            ids.add(reply.job_id)
            await asyncio.sleep(max(0.0, t0 + (i + 1) / rate - time.monotonic()))
        jobs = await wait_placed(c, ids, timeout=300)
        lat = [(r.placed_ts or 0) - r.submitted_ts for r in jobs.values()]
        # burst
        burst: set[str] = set()
        b0 = time.time()
        for i in range(n):
            reply = await c.submit(spec(i, 0.05), msg_id=f"{tag}-burst-{i}", source="bench")
            assert reply.ok and reply.job_id, reply.error
            burst.add(reply.job_id)
        submit_s = time.time() - b0
        bjobs = await wait_placed(c, burst, timeout=600)
        last = max(r.placed_ts or 0 for r in bjobs.values())
        return {
            "jobs": n,
            "paced_rate_per_s": rate,
            "submit_to_placed_p50_ms": round(statistics.median(lat) * 1000, 1),
            "submit_to_placed_p99_ms": round(pct(lat, 99) * 1000, 1),
            "burst_submissions_per_s": round(n / submit_s, 1),
            "burst_placements_per_s": round(n / max(1e-9, last - b0), 1),
            "nodes": len(DEMO_NODES),
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "machine": host.machine(),
            "cpu_model": cpu_model(),
            "commit": git_commit(),
        }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--rate", type=float, default=10.0, help="paced submissions per second")
    ap.add_argument("--out", type=Path, default=Path("bench/results/e2e.json"))
    args = ap.parse_args()
    nats_url, redis_url = urls_from_env()
    servers = None if nats_url and redis_url else EmbeddedServers().start()
    nats_url = nats_url or (servers.nats_url if servers else "")
    redis_url = redis_url or (servers.redis_url if servers else "")
    plat = Platform(nats_url, redis_url).start()
    try:
        res = asyncio.run(run(nats_url, args.jobs, args.rate, f"{time.time():.0f}"))
    finally:
        plat.stop()
        if servers is not None:
            servers.stop()
    res["command"] = "uv run task bench:e2e -- " + " ".join(sys.argv[1:])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=2) + "\n")
    for k, v in res.items():
        print(f"{k:28} {v}")


if __name__ == "__main__":
    main()
