"""Idle CPU of the platform on a simulated fleet, in windows, beside the writes of the node buckets.

Starts the embedded servers and the platform with `--nodes` simulated 8-GPU nodes (one fleet process), waits until
every node is ready, then for `--duration` seconds samples, every `--every` seconds, the CPU seconds each process
used and how many writes the `topology` and `node_heartbeats` buckets took (their streams' last sequence). Nothing
is submitted: what it shows is what a cluster costs when no job runs, and what a wave of bucket writes costs on top
(until 996073d the registry rewrote every node's `topology` record every 30 s to store its heartbeat time, and the
solver, the intake and the preemption service parsed each write).

A window with bucket writes is set against the median of the windows without any: the difference, summed over
those windows, is what the writes cost the platform. Prints a table and writes `--out` (JSON).

    uv run python bench/fleet_idle.py --nodes 512 --duration 70
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

import nats
from benchkit import git_commit
from nats.js.errors import NotFoundError
from scale_bench import Procs

from oneplus.devstack import EmbeddedServers, FleetSpec, Platform

BUCKETS = ("topology", "node_heartbeats")


async def bucket_writes(url: str) -> dict[str, int]:
    """Each bucket's stream's last sequence (one message a write); a bucket not made yet is left out."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        out: dict[str, int] = {}
        for bucket in BUCKETS:
            try:
                out[bucket] = int((await js.stream_info(f"KV_{bucket}")).state.last_seq or 0)
            except NotFoundError:
                continue
        return out
    finally:
        await nc.close()


def windows(plat: Platform, servers: EmbeddedServers, duration: float, every: float) -> list[dict[str, Any]]:
    procs = Procs(plat, servers)
    del procs.pids["bench"]  # this process only sleeps and asks the bucket sizes: not the platform's cost
    t0 = time.monotonic()
    cpu, writes = procs.cpu(), asyncio.run(bucket_writes(servers.nats_url))
    rows = []
    while time.monotonic() - t0 < duration:
        time.sleep(every)
        cpu2, writes2 = procs.cpu(), asyncio.run(bucket_writes(servers.nats_url))
        used = {n: round(cpu2[n] - cpu[n], 2) for n in cpu2 if n in cpu}
        rows.append(
            {
                "at_s": round(time.monotonic() - t0, 1),
                "cpu_s": used,
                "total_cpu_s": round(sum(used.values()), 2),
                "writes": {b: writes2[b] - writes.get(b, 0) for b in writes2},
            }
        )
        cpu, writes = cpu2, writes2
    return rows


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    quiet = [r for r in rows if not any(r["writes"].values())]
    busy = [r for r in rows if any(r["writes"].values())]
    if not quiet:
        return {"quiet_windows": 0, "write_windows": len(busy)}
    base = statistics.median(r["total_cpu_s"] for r in quiet)
    names = sorted({n for r in rows for n in r["cpu_s"]})
    per = {n: statistics.median(r["cpu_s"].get(n, 0.0) for r in quiet) for n in names}
    return {
        "quiet_windows": len(quiet),
        "quiet_window_cpu_s": round(base, 2),
        "write_windows": len(busy),
        "writes": {b: sum(r["writes"].get(b, 0) for r in busy) for b in BUCKETS},
        "writes_extra_cpu_s": round(sum(r["total_cpu_s"] - base for r in busy), 2),
        "writes_extra_cpu_s_by_process": {
            n: round(sum(r["cpu_s"].get(n, 0.0) - per[n] for r in busy), 2) for n in names
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=512)
    ap.add_argument("--duration", type=float, default=70.0, help="seconds sampled once every node is ready")
    ap.add_argument("--every", type=float, default=5.0, help="seconds a window")
    ap.add_argument("--out", type=Path, default=Path("bench/results/fleet_idle.json"))
    args = ap.parse_args()
    servers = EmbeddedServers().start()
    plat = Platform(
        servers.nats_url, servers.redis_url, logdir=servers.workdir / "logs", fleet=FleetSpec(nodes=args.nodes)
    )
    plat.start()
    try:
        ready = plat.wait_nodes(timeout=600)
        rows = windows(plat, servers, args.duration, args.every)
    finally:
        plat.stop()
        servers.stop()
    report = {
        "command": "bench/fleet_idle.py",
        "commit": git_commit(),
        "nodes": args.nodes,
        "ready_s": round(ready, 1),
        "windows": rows,
        "summary": summary(rows),
    }
    print(f"{args.nodes} nodes ready after {ready:.1f} s; windows of {args.every:.0f} s (CPU seconds, bucket writes)")
    for r in rows:
        procs = " ".join(f"{n}={v:.2f}" for n, v in sorted(r["cpu_s"].items()))
        writes = " ".join(f"{b}+{n}" for b, n in r["writes"].items())
        print(f"{r['at_s']:6.1f} s  total={r['total_cpu_s']:.2f}  {procs}  {writes}")
    print(json.dumps(report["summary"]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
