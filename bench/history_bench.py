"""History benchmark (issue 11, "What was measured"): does scheduling slow down as finished jobs pile up?

For each history size N (`--history`, default 0,2000,10000), on fresh embedded servers (NATS_URL/REDIS_URL are
ignored: every size needs empty streams) and the demo's 4 simulated nodes:

1. start the platform (`oneplus.devstack.Platform`), run one warm-up job to its end and take its finished record
   (the `jobs` KV entry) and its events (the job-event stream) as the template of a finished job, exactly as the
   checked-out version writes them;
2. make the history: N finished jobs in all, cloned from the template with new ids and recent timestamps.
   `--history-mode kv` (default, the issue's method) writes each record straight into the `jobs` KV bucket;
   `--history-mode events` also publishes each job's events to the job-event stream first (and sets the record's
   stream sequence when the record has one), for versions whose state is built from the stream;
3. with `--restart`, restart the platform (so anything that bootstraps from the store sees the history); wait until
   the stream consumers have nothing pending, and run one probe job through;
4. measure: `--jobs` one-GPU jobs submitted on `oneplus.jobs.submit` every `--interval-ms` → submit→placed p50/p99
   (client clock: request sent → `oneplus.job.<id>.placed` seen on a core NATS subscription); then the same number
   at once → burst placements/s; then the time of `oneplus jobs list --json` (the CLI, a fresh process) and of
   `OnePlusClient.list_jobs()`, or their error.

Depends only on public surfaces: the submit and job-event subjects, the `jobs` KV bucket, the job-event stream's
name, the CLI and the client. Prints a table and writes bench/results/history.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import platform as host
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchkit import cpu_model, fmt, git_commit, job_of, pct, probe, settle
from nats.errors import TimeoutError as FetchTimeout
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from oneplus_contracts import JobSpec, RankResources, SimulatedRun, subjects

from oneplus.client import OnePlusClient
from oneplus.demo import wait_for_platform
from oneplus.devstack import DEMO_NODES, EmbeddedServers, Platform

ROOT = Path(__file__).resolve().parent.parent
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "REJECTED"}
Row = dict[str, Any]
Events = list[tuple[str, dict[str, Any]]]


def spec(name: str, duration: float) -> JobSpec:
    return JobSpec(
        name=name,
        resources=RankResources(gpus=1, cpus=1, memory_mb=1024),
        simulate=SimulatedRun(duration_s=duration),
    )


def history_id(i: int) -> str:
    return "j-" + hashlib.sha256(f"history-{i}".encode()).hexdigest()[:12]


class Watch:
    """Arrival times (client monotonic clock) of every job's first `placed` and `finished` event."""

    def __init__(self) -> None:
        self.placed: dict[str, float] = {}
        self.finished: dict[str, float] = {}

    async def start(self, nc: Any) -> None:
        async def on_placed(msg: Any) -> None:
            self.placed.setdefault(job_of(msg.subject), time.monotonic())

        async def on_finished(msg: Any) -> None:
            self.finished.setdefault(job_of(msg.subject), time.monotonic())

        await nc.subscribe(subjects.all_job_events("placed"), cb=on_placed)
        await nc.subscribe(subjects.all_job_events("finished"), cb=on_finished)
        await nc.flush()

    async def wait(self, seen: dict[str, float], ids: set[str], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ids <= seen.keys():
                return True
            await asyncio.sleep(0.02)
        return ids <= seen.keys()


# ---------------------------------------------------------------------------------------------------- history


async def read_events(js: JetStreamContext, job_id: str) -> list[tuple[str, bytes]]:
    """(subject, data) of every event of `job_id` in the job-event stream, in stream order."""
    config = ConsumerConfig(
        filter_subject=subjects.job_events_of(job_id),
        deliver_policy=DeliverPolicy.ALL,
        ack_policy=AckPolicy.NONE,
        inactive_threshold=5.0,
        mem_storage=True,
    )
    info = await js.add_consumer(subjects.JOBS_STREAM, config=config)
    sub = await js.pull_subscribe_bind(consumer=info.name, stream=subjects.JOBS_STREAM)
    out: list[tuple[str, bytes]] = []
    try:
        todo = info.num_pending or 0
        while len(out) < todo:
            try:
                msgs = await sub.fetch(batch=todo - len(out), timeout=2.0)
            except FetchTimeout:
                break
            out += [(m.subject, m.data) for m in msgs]
    finally:
        await sub.unsubscribe()
        with contextlib.suppress(Exception):
            await js.delete_consumer(subjects.JOBS_STREAM, info.name)
    return out


async def seed_template(c: OnePlusClient, watch: Watch, js: JetStreamContext) -> tuple[dict[str, Any], Events]:
    """Run one job to its end; its finished record (as stored in the `jobs` KV) and its events."""
    reply = await c.submit(spec("history-seed", 0.2), msg_id=f"history-seed-{time.time()}", source="bench")
    assert reply.ok and reply.job_id, reply.error
    job_id = reply.job_id
    if not await watch.wait(watch.finished, {job_id}, 120):
        raise TimeoutError(f"the warm-up job {job_id} did not finish within 120 s")
    kv = await js.key_value(subjects.JOBS_KV)
    rec: dict[str, Any] | None = None
    for _ in range(100):  # the record may land a moment after the event
        with contextlib.suppress(Exception):
            entry = await kv.get(job_id)
            if entry.value:
                rec = json.loads(entry.value)
                if rec.get("state") in TERMINAL:
                    break
        await asyncio.sleep(0.05)
    if rec is None or rec.get("state") not in TERMINAL:
        rec = (await c.get_job(job_id)).model_dump(mode="json")  # a version that keeps it elsewhere
    events = await read_events(js, job_id)
    return rec, [(s, json.loads(d)) for s, d in events]


def shift_ts(d: dict[str, Any], delta: float) -> None:
    for k, v in d.items():
        if (k == "ts" or k.endswith("_ts")) and isinstance(v, int | float) and not isinstance(v, bool):
            d[k] = v + delta


async def write_history(
    js: JetStreamContext, template: dict[str, Any], events: Events, n: int, mode: str, span_s: float
) -> float:
    """N-1 clones of the template (the warm-up job itself is the Nth); returns the seconds it took."""
    t0 = time.monotonic()
    kv = await js.key_value(subjects.JOBS_KV)
    seed = template["job_id"]
    end = time.time()
    base = template.get("finished_ts") or template.get("updated_ts") or end

    async def one(i: int) -> None:
        job_id = history_id(i)
        delta = end - span_s * (1 - i / max(1, n)) - base  # finished evenly over the last span_s seconds
        seq = None
        if mode == "events":
            for subject, ev in events:
                e = json.loads(json.dumps(ev))
                e["job_id"] = job_id
                eid = str(e.get("event_id", ""))
                e["event_id"] = eid.replace(seed, job_id) if seed in eid else f"{eid}-h{i}"
                if isinstance(e.get("spec"), dict):
                    e["spec"]["name"] = f"hist-{i}"
                shift_ts(e, delta)
                ack = await js.publish(
                    subject.replace(seed, job_id),
                    json.dumps(e).encode(),
                    headers={"Nats-Msg-Id": e["event_id"]},
                    stream=subjects.JOBS_STREAM,
                )
                seq = ack.seq
        rec = json.loads(json.dumps(template))
        rec["job_id"] = job_id
        rec["spec"]["name"] = f"hist-{i}"
        shift_ts(rec, delta)
        if seq is not None and "seq" in rec:
            rec["seq"] = seq
        await kv.put(job_id, json.dumps(rec).encode())

    batch = 100 if mode == "events" else 500
    for start in range(1, n, batch):
        await asyncio.gather(*(one(i) for i in range(start, min(n, start + batch))))
    return time.monotonic() - t0


# ---------------------------------------------------------------------------------------------------- measure


async def paced(c: OnePlusClient, watch: Watch, n: int, interval: float, tag: str, timeout: float) -> Row:
    sent: dict[str, float] = {}

    async def submit(i: int) -> None:
        t = time.monotonic()
        reply = await c.submit(spec(f"paced-{i}", 0.5), msg_id=f"{tag}-paced-{i}", source="bench")
        assert reply.ok and reply.job_id, reply.error
        sent[reply.job_id] = t

    t0 = time.monotonic()
    tasks = []
    for i in range(n):
        tasks.append(asyncio.create_task(submit(i)))
        await asyncio.sleep(max(0.0, t0 + (i + 1) * interval - time.monotonic()))
    await asyncio.gather(*tasks)
    ok = await watch.wait(watch.placed, set(sent), timeout)
    lat = [watch.placed[j] - t for j, t in sent.items() if j in watch.placed]
    await watch.wait(watch.finished, set(sent), timeout)  # the burst starts on an idle cluster
    return {
        "paced_placed": len(lat),
        "paced_timed_out": not ok,
        "p50_ms": round(statistics.median(lat) * 1000, 1) if lat else None,
        "p99_ms": round(pct(lat, 99) * 1000, 1) if lat else None,
        "paced_submit_s": round(max(sent.values()) - t0, 2),
    }


async def burst(c: OnePlusClient, watch: Watch, n: int, tag: str, timeout: float) -> Row:
    b0 = time.monotonic()
    replies = await asyncio.gather(
        *(c.submit(spec(f"burst-{i}", 0.05), msg_id=f"{tag}-burst-{i}", source="bench") for i in range(n))
    )
    submit_s = time.monotonic() - b0
    assert all(r.ok and r.job_id for r in replies), [r.error for r in replies if not r.ok]
    ids = {r.job_id for r in replies if r.job_id}
    ok = await watch.wait(watch.placed, ids, timeout)
    times = [watch.placed[j] for j in ids if j in watch.placed]
    await watch.wait(watch.finished, ids, 60)
    return {
        "burst_placed": len(times),
        "burst_timed_out": not ok,
        "burst_placements_per_s": round(len(times) / max(1e-9, max(times) - b0), 1) if times else None,
        "burst_submissions_per_s": round(n / submit_s, 1),
    }


def cli_list(nats_url: str) -> Row:
    exe = Path(sys.executable).parent / "oneplus"
    argv = [str(exe)] if exe.exists() else [sys.executable, "-m", "oneplus.cli"]
    env = {**os.environ, "NATS_URL": nats_url}
    t = time.monotonic()
    try:
        done = subprocess.run([*argv, "jobs", "list", "--json"], capture_output=True, text=True, timeout=120, env=env)
    except subprocess.TimeoutExpired:
        return {"cli_list_s": None, "cli_list_error": "no answer within 120 s"}
    wall = round(time.monotonic() - t, 2)
    if done.returncode == 0:
        try:
            return {"cli_list_s": wall, "cli_list_rows": len(json.loads(done.stdout)), "cli_list_error": None}
        except json.JSONDecodeError:
            pass
    lines = [x for x in (done.stderr + done.stdout).splitlines() if x.strip()]
    return {"cli_list_s": wall, "cli_list_rc": done.returncode, "cli_list_error": lines[-1] if lines else "?"}


async def client_list(nats_url: str) -> Row:
    async with OnePlusClient.connect(nats_url, timeout=60) as c:
        t = time.monotonic()
        try:
            rows = await c.list_jobs()
        except Exception as exc:
            return {
                "client_list_s": round(time.monotonic() - t, 3),
                "client_list_error": f"{type(exc).__name__}: {exc}",
            }
        return {"client_list_s": round(time.monotonic() - t, 3), "client_list_rows": len(rows)}


# ---------------------------------------------------------------------------------------------------- one size


def start_platform(servers: EmbeddedServers, run: int) -> Platform:
    return Platform(servers.nats_url, servers.redis_url, logdir=servers.workdir / f"logs-{run}").start()


async def ready(nats_url: str) -> None:
    async with OnePlusClient.connect(nats_url, timeout=10) as c:
        await wait_for_platform(c, len(DEMO_NODES), timeout=180)


async def prepare(nats_url: str, n: int, mode: str, span_s: float) -> Row:
    t = time.monotonic()
    await ready(nats_url)
    ready_s = time.monotonic() - t
    async with OnePlusClient.connect(nats_url, timeout=30) as c:
        watch = Watch()
        await watch.start(c.nc)
        js = c.nc.jetstream()
        template, events = await seed_template(c, watch, js)
        write_s = await write_history(js, template, events, n, mode, span_s) if n > 1 else 0.0
    return {
        "platform_ready_s": round(ready_s, 1),
        "record_bytes": len(json.dumps(template)),
        "events_per_job": len(events),
        "history_write_s": round(write_s, 2),
    }


async def measure(nats_url: str, args: argparse.Namespace, tag: str) -> Row:
    await ready(nats_url)
    res: dict[str, Any] = {}
    async with OnePlusClient.connect(nats_url, timeout=60) as c:
        watch = Watch()
        await watch.start(c.nc)
        js = c.nc.jetstream()
        res["settle_s"] = round(await settle(js), 2)
        res["probe_s"] = round(await probe(c, watch, spec("history-probe", 0.05), tag), 2)
        res |= await paced(c, watch, args.jobs, args.interval_ms / 1000, tag, args.timeout)
        res |= await burst(c, watch, args.jobs, tag, args.timeout)
    res |= cli_list(nats_url)
    res |= await client_list(nats_url)
    return res


def one_size(n: int, args: argparse.Namespace) -> Row:
    t0 = time.monotonic()
    servers = EmbeddedServers().start()
    row: dict[str, Any] = {"history": n, "finished_jobs": max(1, n) + 1}  # + the probe job
    plat = start_platform(servers, 0)
    failed = False
    try:
        row |= asyncio.run(prepare(servers.nats_url, n, args.history_mode, args.span_s))
        if args.restart:
            plat.stop()
            plat = start_platform(servers, 1)
        row |= asyncio.run(measure(servers.nats_url, args, f"h{n}-{time.time():.0f}"))
        if plat.dead():
            row["dead_services"] = plat.dead()
    except Exception as exc:
        failed = True
        row["error"] = f"{type(exc).__name__}: {exc}"
        print(f"history {n}: {row['error']}; logs in {servers.workdir}", file=sys.stderr, flush=True)
    finally:
        plat.stop()
        servers.stop()
        if not (failed or args.keep):
            shutil.rmtree(servers.workdir, ignore_errors=True)
    row["wall_s"] = round(time.monotonic() - t0, 1)
    return row


# ---------------------------------------------------------------------------------------------------- report


def table(rows: list[Row]) -> str:
    head = "| finished jobs | submit→placed p50 | p99 | burst placements/s | `oneplus jobs list --json` | list_jobs() |"
    out = [head, "|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r and "p50_ms" not in r:
            out.append(f"| {fmt(r['history'])} | failed: {r['error']} | | | | |")
            continue
        cli = (
            f"{r['cli_list_s']:.2f} s ({fmt(r.get('cli_list_rows'))} jobs)"
            if not r.get("cli_list_error")
            else f"{fmt(r.get('cli_list_s'), 2)} s: {r['cli_list_error']}"
        )
        cl = (
            f"{r['client_list_s'] * 1000:.0f} ms ({fmt(r.get('client_list_rows'))} jobs)"
            if "client_list_rows" in r
            else f"{r.get('client_list_error')}"
        )
        late = " (timed out)" if r.get("paced_timed_out") or r.get("burst_timed_out") else ""
        out.append(
            f"| {fmt(r['history'])} | {fmt(r.get('p50_ms'))} ms | {fmt(r.get('p99_ms'))} ms "
            f"| {fmt(r.get('burst_placements_per_s'), 1)}{late} | {cli} | {cl} |"
        )
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--history", default="0,2000,10000", help="comma list of finished-job counts")
    ap.add_argument("--history-mode", choices=("kv", "events"), default="kv")
    ap.add_argument("--jobs", type=int, default=100, help="jobs paced, then jobs in the burst")
    ap.add_argument("--interval-ms", type=float, default=50.0, help="between paced submissions")
    ap.add_argument("--span-s", type=float, default=30.0, help="history jobs finished over the last this many s")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for placements, per phase")
    ap.add_argument(
        "--restart",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="restart the platform after writing the history (for versions that bootstrap from the store)",
    )
    ap.add_argument("--keep", action="store_true", help="keep the servers' work dirs and logs")
    ap.add_argument("--out", type=Path, default=ROOT / "bench/results/history.json")
    args = ap.parse_args()
    sizes = [int(x) for x in args.history.split(",") if x.strip()]
    t0 = time.monotonic()
    load_before = os.getloadavg()
    rows = []
    for n in sizes:
        rows.append(one_size(n, args))
        print(json.dumps(rows[-1]), flush=True)
    report = {
        "command": "uv run task bench:history -- " + " ".join(sys.argv[1:]),
        "commit": git_commit(),
        "history_mode": args.history_mode,
        "jobs": args.jobs,
        "interval_ms": args.interval_ms,
        "nodes": len(DEMO_NODES),
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "machine": host.machine(),
        "cpu_model": cpu_model(),
        "wall_s": round(time.monotonic() - t0, 1),
        "loadavg_1m_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "runs": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(table(rows))
    print(f"wall {report['wall_s']} s; wrote {args.out}")


if __name__ == "__main__":
    main()
