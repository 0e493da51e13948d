"""`oneplus demo`: the whole platform on the embedded default, a mixed workload, live progress, a summary."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections import Counter

from oneplus_contracts import JobRecord, JobSpec
from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel

from .cli.render import jobs_columns
from .client import OnePlusClient, PlatformError
from .devstack import DEMO_NODES, EmbeddedServers, Platform, SimNode, urls_from_env
from .workload import demo_workload

console = Console()


SERVICES = ("intake", "topology-registry", "placement-solver", "preemption", "node-executor")


async def wait_for_platform(
    client: OnePlusClient, n_nodes: int, timeout: float = 120.0, services: tuple[str, ...] = SERVICES
) -> None:
    """Until every service answers `$SRV.PING` (one executor per node) and every node is ready."""
    deadline = time.monotonic() + timeout
    last = "no answer yet"
    while time.monotonic() < deadline:
        try:
            found = [s.get("name", "") for s in await client.services(kind="PING")]
            missing = [s for s in services if f"oneplus-{s}" not in found]
            executors = found.count("oneplus-node-executor")
            nodes = await client.nodes() if "oneplus-topology-registry" in found else []
            ready = [x for x in nodes if x.status == "ready"]
            if not missing and executors >= n_nodes and len(ready) >= n_nodes:
                return
            last = f"services missing: {missing or 'none'}; {executors}/{n_nodes} executors; {len(ready)} nodes ready"
        except PlatformError as exc:
            last = str(exc)
        await asyncio.sleep(0.3)
    raise PlatformError(f"the platform did not come up within {timeout:.0f}s ({last})")


def summary_panel(jobs: list[JobRecord], wall_s: float) -> Panel:
    states = Counter(r.state for r in jobs)
    waits = [r.placed_ts - r.submitted_ts for r in jobs if r.placed_ts]
    lines = [
        f"jobs: {len(jobs)}   " + "   ".join(f"{k}: {v}" for k, v in sorted(states.items())),
        f"wall time: {wall_s:.1f}s",
    ]
    if waits:
        lines.append(
            f"submit→placed: p50 {statistics.median(waits) * 1000:.0f} ms, max {max(waits) * 1000:.0f} ms "
            f"(queueing included: gangs wait for GPUs to free up)"
        )
    gpus = sum(r.spec.total_gpus for r in jobs)
    lines.append(f"GPUs requested in total: {gpus:g}")
    return Panel("\n".join(lines), title="summary")


async def drive(nats_url: str, specs: list[JobSpec], n_nodes: int, timeout: float) -> list[JobRecord]:
    async with OnePlusClient.connect(nats_url) as client:
        with console.status("waiting for the services and executors to come up..."):
            await wait_for_platform(client, n_nodes)
        nodes = await client.nodes()
        console.print(
            f"[bold]{len(nodes)} nodes ready:[/] "
            + ", ".join(f"{x.topology.node} ({x.topology.gpu_model})" for x in nodes)
        )
        run_tag = f"{time.time():.0f}"
        ids: list[str] = []
        for i, spec in enumerate(specs):
            reply = await client.submit(spec, msg_id=f"demo-{run_tag}-{i}", source="demo")
            if not reply.ok or reply.job_id is None:
                console.print(f"[red]rejected {spec.name}: {reply.error}[/]")
                continue
            ids.append(reply.job_id)
        deadline = time.monotonic() + timeout
        jobs: list[JobRecord] = []
        last_head = ""
        # On a terminal a live table; piped, a log line per change and the final table in plain columns (a rich
        # table at the 80 columns assumed off a terminal cuts the ids and states).
        live = Live(console=console, refresh_per_second=4) if console.is_terminal else None
        head = ""
        try:
            if live is not None:
                live.start()
            while time.monotonic() < deadline:
                everything = {r.job_id: r for r in await client.list_jobs()}
                jobs = [everything[i] for i in ids if i in everything]
                counts = Counter(r.state for r in jobs)
                head = " ".join(f"{k}={v}" for k, v in sorted(counts.items()))
                if live is not None:
                    live.update(Group(jobs_columns(jobs, title=f"demo workload — {head}").rich()))
                elif head != last_head:
                    console.print(f"{time.strftime('%H:%M:%S')} {head}", highlight=False)
                    last_head = head
                if jobs and len(jobs) == len(ids) and all(r.terminal for r in jobs):
                    break
                await asyncio.sleep(0.25)
        finally:
            if live is not None:
                live.stop()
        if live is None:
            jobs_columns(jobs, title=f"demo workload — {head}").print(console)
        return jobs


def run_demo(
    n_jobs: int = 20,
    seed: int = 7,
    runtime: str = "simulated",
    nodes: tuple[SimNode, ...] = DEMO_NODES,
    timeout: float = 300.0,
) -> int:
    nats_url, redis_url = urls_from_env()
    servers: EmbeddedServers | None = None
    platform: Platform | None = None
    started = time.monotonic()
    try:
        if not nats_url or not redis_url:
            servers = EmbeddedServers().start()
            console.print(f"embedded NATS JetStream at {servers.nats_url}, Redis at {servers.redis_url}")
        nats_url = nats_url or (servers.nats_url if servers else "")
        redis_url = redis_url or (servers.redis_url if servers else "")
        platform = Platform(nats_url, redis_url, nodes=nodes, runtime=runtime).start()
        console.print(f"services started (logs in {platform.logdir})")
        specs = demo_workload(n_jobs, seed)
        jobs = asyncio.run(drive(nats_url, specs, len(nodes), timeout))
        console.print(summary_panel(jobs, time.monotonic() - started))
        ok = bool(jobs) and all(r.state == "SUCCEEDED" for r in jobs)
        return 0 if ok else 1
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: shutting everything down[/]")
        return 130
    except PlatformError as exc:
        console.print(f"[red]error:[/] {exc}")
        if platform is not None:
            dead = platform.dead()
            if dead:
                console.print(f"exited processes (name: exit code): {dead}")
            console.print(f"service logs: {platform.logdir}")
        return 1
    finally:
        if platform is not None:
            platform.stop()
        if servers is not None:
            servers.stop()
