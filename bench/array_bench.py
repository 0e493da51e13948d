"""Job arrays against separate jobs (issue 43): one request for N tasks, the tasks' placement rate, and `queue`.

One set of embedded servers and one platform whose nodes are one simulated fleet (`--nodes`, the 8-GPU H100 preset),
as `bench/scale_bench.py` runs them. In order, each phase on a quiet platform:

1. separate jobs: `--tasks` one-GPU jobs, each its own submission (`--window` in flight), `--duration` s each: the
   submissions' time and placements/s (first placement to last, `placed` events seen on a core subscription);
2. one array of `--tasks` one-GPU tasks (`--array=0-N-1`), the same jobs, in ONE request: the request's time (until
   its reply), the time until every task's record is in the hot view, the durable writes it cost (messages added to
   the facts stream, the job-event stream and the `jobs` bucket's stream: the tasks wait, `afterany`, for a job that
   is cancelled once they are all recorded, so nothing else writes meanwhile), and the tasks' placements/s the same
   way, from their release;
3. `queue` with an array of `--tasks` tasks pending (they wait, `afterok`, for a job that runs for a minute): the
   time of `OnePlusClient.queue()` in this process and of the `oneplus queue` CLI (a fresh process), each the median
   of three, and the rows it printed; the CLI on an empty queue and `oneplus --help` say what starting it costs.

Prints the figures and writes bench/results/arrays.json. `uv run python bench/array_bench.py --tasks 2000` (about 2
minutes on 2 cores); `--tasks 10000` for the issue's size.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchkit import cpu_model, git_commit
from oneplus_contracts import JobArray, JobSpec, RankResources, SimulatedRun, subjects
from scale_bench import CpuPhase, Procs, Watch, quiet, wait_services

from oneplus.client import OnePlusClient, PlatformError
from oneplus.devstack import EmbeddedServers, FleetSpec, Platform

ROOT = Path(__file__).resolve().parent.parent
Row = dict[str, Any]


def one_gpu(name: str, duration: float, **kw: Any) -> JobSpec:
    return JobSpec(
        name=name,
        resources=RankResources(gpus=1, cpus=1, memory_mb=1024),
        simulate=SimulatedRun(duration_s=duration),
        **kw,
    )


async def last_seqs(c: OnePlusClient) -> dict[str, int]:
    js = c.nc.jetstream()
    out = {}
    for stream in (subjects.FACTS_STREAM, subjects.JOBS_STREAM, f"KV_{subjects.JOBS_KV}"):
        out[stream] = int((await js.stream_info(stream)).state.last_seq or 0)
    return out


def rate(times: list[float]) -> float | None:
    times = sorted(times)
    span = times[-1] - times[0] if len(times) > 1 else 0.0
    return round((len(times) - 1) / span, 1) if span > 0 else None


async def separate(c: OnePlusClient, watch: Watch, args: argparse.Namespace) -> Row:
    body = one_gpu("sep", args.duration).model_dump_json().encode()
    sem = asyncio.Semaphore(args.window)

    async def submit(i: int) -> str | None:
        async with sem:
            for _ in range(5):
                try:
                    reply = await c.submit_raw(body, {"Nats-Msg-Id": f"sep-{i}", "Oneplus-Source": "bench"})
                except PlatformError:
                    continue
                return reply.job_id if reply.ok else None
            return None

    t0 = time.monotonic()
    ids = {j for j in await asyncio.gather(*(submit(i) for i in range(args.tasks))) if j}
    submit_s = time.monotonic() - t0
    ok = await watch.wait(watch.placed, ids, args.timeout)
    placed = [watch.placed[j] for j in ids if j in watch.placed]
    await watch.wait(watch.finished, ids, args.timeout)
    return {
        "jobs": args.tasks,
        "accepted": len(ids),
        "submit_s": round(submit_s, 2),
        "requests": args.tasks,
        "placed": len(placed),
        "timed_out": not ok,
        "all_placed_s": round(max(placed) - t0, 2) if placed else None,
        "placements_per_s": rate(placed),
    }


async def recorded(c: OnePlusClient, job_id: str, timeout: float) -> None:
    """Until `job_id`'s record is in the hot view."""
    kv = await c.nc.jetstream().key_value(subjects.JOBS_KV)
    deadline = time.monotonic() + timeout
    while True:
        try:
            await kv.get(job_id)
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.01)


async def array(c: OnePlusClient, watch: Watch, args: argparse.Namespace) -> Row:
    # The tasks wait (afterany) for a job cancelled once every task is recorded: the streams' counts are then the
    # acceptance's alone, not mixed with the first tasks' placements and ends.
    hold = await c.submit(one_gpu("hold", 3600.0), msg_id="array-hold")
    assert hold.ok and hold.job_id
    await watch.wait(watch.placed, {hold.job_id}, 60)
    dep = [{"type": "afterany", "job_ids": [hold.job_id]}]
    spec = one_gpu("arr", args.duration, array=JobArray(indices=f"0-{args.tasks - 1}"), dependencies=dep)
    body = spec.model_dump_json().encode()
    before = await last_seqs(c)
    t0 = time.monotonic()
    reply = await c.submit_raw(body, {"Nats-Msg-Id": "array-1", "Oneplus-Source": "bench"})
    request_s = time.monotonic() - t0
    assert reply.ok and reply.job_id, reply.error
    ids = {f"{reply.job_id}_{i}" for i in range(args.tasks)}
    await recorded(c, f"{reply.job_id}_{args.tasks - 1}", args.timeout)  # the owner's fold of the one fact
    recorded_s = time.monotonic() - t0
    after_accept = await last_seqs(c)
    await c.cancel(hold.job_id)
    ok = await watch.wait(watch.placed, ids, args.timeout)
    placed = [watch.placed[j] for j in ids if j in watch.placed]
    await watch.wait(watch.finished, ids, args.timeout)
    writes = {k: after_accept[k] - before[k] for k in before}
    return {
        "tasks": args.tasks,
        "requests": 1,
        "request_s": round(request_s, 3),
        "all_recorded_s": round(recorded_s, 3),
        "durable_writes_to_accept": writes,
        "placed": len(placed),
        "timed_out": not ok,
        "all_placed_s": round(max(placed) - t0, 2) if placed else None,
        "placements_per_s": rate(placed),
    }


def cli_queue(nats_url: str) -> tuple[float, int]:
    exe = Path(sys.executable).parent / "oneplus"
    t = time.monotonic()
    out = subprocess.run(
        [str(exe), "queue", "--nats", nats_url], capture_output=True, text=True, check=True, env=os.environ.copy()
    )
    return time.monotonic() - t, len(out.stdout.splitlines())


def cli_startup() -> float:
    exe = Path(sys.executable).parent / "oneplus"
    t = time.monotonic()
    subprocess.run([str(exe), "--help"], capture_output=True, check=True)
    return time.monotonic() - t


async def queue_pending(c: OnePlusClient, args: argparse.Namespace, nats_url: str) -> Row:
    empty = [await asyncio.to_thread(cli_queue, nats_url) for _ in range(3)]  # the CLI on an empty queue
    blocker = await c.submit(one_gpu("blocker", 60.0), msg_id="blocker")
    assert blocker.ok and blocker.job_id
    spec = one_gpu(
        "waiting",
        args.duration,
        array=JobArray(indices=f"0-{args.tasks - 1}", max_running=50),
        dependencies=[{"type": "afterok", "job_ids": [blocker.job_id]}],
    )
    reply = await c.submit(spec, msg_id="array-waiting")
    assert reply.ok and reply.job_id
    await recorded(c, f"{reply.job_id}_{args.tasks - 1}", args.timeout)
    await asyncio.sleep(2.0)  # a cycle has given every task its reason
    inproc = []
    for _ in range(3):
        t = time.monotonic()
        rows = await c.queue()
        inproc.append(time.monotonic() - t)
    cli = [await asyncio.to_thread(cli_queue, nats_url) for _ in range(3)]
    startup = [await asyncio.to_thread(cli_startup) for _ in range(3)]
    shown = [r["job_id"] for r in rows]
    await c.cancel(reply.job_id)
    await c.cancel(blocker.job_id)
    return {
        "pending_tasks": args.tasks,
        "client_queue_s": round(statistics.median(inproc), 3),
        "cli_queue_s": round(statistics.median(t for t, _ in cli), 3),
        "cli_startup_s": round(statistics.median(startup), 3),  # `oneplus --help`: the CLI's own start, no request
        "cli_queue_empty_s": round(statistics.median(t for t, _ in empty), 3),  # `oneplus queue`, nothing pending
        "rows": len(rows),
        "array_row": next((j for j in shown if j.startswith(f"{reply.job_id}_[")), None),
    }


async def run(servers: EmbeddedServers, plat: Platform, args: argparse.Namespace, report: Row) -> None:
    procs = Procs(plat, servers)
    async with OnePlusClient.connect(servers.nats_url, timeout=30.0) as c:
        await wait_services(c)
        deadline = time.monotonic() + 300
        while len(await c.nodes()) < args.nodes:
            assert time.monotonic() < deadline, "the fleet never registered"
            await asyncio.sleep(1.0)
        watch = Watch()
        await watch.start(c.nc)
        warm = await c.submit(one_gpu("warm", 0.05), msg_id="warm")
        assert warm.ok and warm.job_id
        await watch.wait(watch.finished, {warm.job_id}, 120)
        await quiet(procs)
        phase = CpuPhase(procs)
        report["separate"] = await separate(c, watch, args)
        report["separate"]["cpu"] = phase.stop()
        print("separate:", json.dumps({k: v for k, v in report["separate"].items() if k != "cpu"}), flush=True)
        await quiet(procs)
        phase = CpuPhase(procs)
        report["array"] = await array(c, watch, args)
        report["array"]["cpu"] = phase.stop()
        print("array:", json.dumps({k: v for k, v in report["array"].items() if k != "cpu"}), flush=True)
        await quiet(procs)
        report["queue"] = await queue_pending(c, args, servers.nats_url)
        print("queue:", json.dumps(report["queue"]), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=2000, help="tasks of the array, and separate jobs to compare")
    ap.add_argument("--nodes", type=int, default=128, help="simulated 8-GPU nodes")
    ap.add_argument("--duration", type=float, default=0.5, help="seconds each job or task runs")
    ap.add_argument("--window", type=int, default=128, help="separate submissions in flight")
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--out", type=Path, default=ROOT / "bench/results/arrays.json")
    args = ap.parse_args()
    fleet = FleetSpec(nodes=args.nodes)
    nodes, gpus = fleet.size()
    site = Path(os.environ.get("TMPDIR", "/tmp")) / f"oneplus-array-bench-site-{os.getpid()}.yaml"
    site.write_text(f"max_array_size: {max(1001, args.tasks + 1)}\n")  # Slurm's MaxArraySize raised for the run
    env = {"ONEPLUS_SITE_FILE": str(site)}
    os.environ.update(env)
    report: Row = {
        "command": "uv run python bench/array_bench.py " + " ".join(sys.argv[1:]),
        "commit": git_commit(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "nodes": nodes,
        "gpus": gpus,
        "cpus_usable": len(os.sched_getaffinity(0)),
        "cpu_model": cpu_model(),
        "loadavg_before": [round(x, 2) for x in os.getloadavg()],
    }
    servers = EmbeddedServers().start()
    plat = Platform(servers.nats_url, servers.redis_url, logdir=servers.workdir / "logs", extra_env=env, fleet=fleet)
    plat.start()
    try:
        asyncio.run(run(servers, plat, args, report))
    finally:
        plat.stop()
        servers.stop()
        site.unlink(missing_ok=True)
    sep, arr, q = report["separate"], report["array"], report["queue"]
    if sep.get("placements_per_s") and arr.get("placements_per_s"):
        report["array_rate_vs_separate"] = round(arr["placements_per_s"] / sep["placements_per_s"], 2)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"\n{args.tasks} tasks on {nodes} nodes ({gpus} GPUs), {report['cpus_usable']} cores")
    print(
        f"  array accepted in 1 request: {arr['request_s']} s (target < 1 s); "
        f"every task recorded {arr['all_recorded_s']} s"
    )
    print(f"  durable writes to accept it: {arr['durable_writes_to_accept']}")
    print(f"  separate jobs: {sep['requests']} requests in {sep['submit_s']} s")
    print(
        f"  placements/s: array {arr['placements_per_s']}, separate {sep['placements_per_s']} "
        f"(ratio {report.get('array_rate_vs_separate')}, target >= 0.8)"
    )
    print(
        f"  queue with {q['pending_tasks']} tasks pending: the request {q['client_queue_s']} s (target < 0.5 s); "
        f"the CLI {q['cli_queue_s']} s (empty queue {q['cli_queue_empty_s']} s, --help {q['cli_startup_s']} s); "
        f"{q['rows']} row(s), {q['array_row']}"
    )
    print(f"  written to {args.out}")


if __name__ == "__main__":
    main()
