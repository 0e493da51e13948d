"""`oneplus`: the operator's and user's command line.

Start-up time: `oneplus --help`, `queue` and `jobs show` run in well under half a second of CPU because nothing
heavy is imported at module level here or in the modules this one imports (nats, pydantic models, OR-Tools,
pandas, the simulator): each command imports what it needs. tests/cli/test_startup.py keeps it so.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from ..client import PlatformError, run_with_client, subjects, with_submitter
from . import place, queues, reservation, sim, slurm, topology
from .render import (
    Columns,
    error_console,
    gpu_counts,
    gpu_holds,
    jobs_columns,
    nodes_columns,
    pending_reason,
    reason_cell,
)

if TYPE_CHECKING:
    from oneplus_contracts import JobRecord

    from ..client import OnePlusClient

app = typer.Typer(help="OnePlus: topology-aware, atomic gang scheduling for private GPU clouds.", no_args_is_help=True)
jobs_app = typer.Typer(help="Look at and act on jobs.", no_args_is_help=True)
nodes_app = typer.Typer(help="The cluster's nodes.", invoke_without_command=True)
dev_app = typer.Typer(help="The embedded development stack: up, status, down.", no_args_is_help=True)
app.add_typer(jobs_app, name="jobs")
app.add_typer(nodes_app, name="nodes")
app.add_typer(dev_app, name="dev")
app.add_typer(queues.app, name="queues")
app.add_typer(reservation.app, name="reservation")
app.add_typer(topology.app, name="topology", help="Read and show node topologies.")
app.add_typer(sim.app, name="sim", help="Replay traces on a modelled cluster.")
if hasattr(place, "place"):
    app.command("place")(place.place)
for _name in ("sbatch", "squeue", "scancel", "sinfo"):
    if hasattr(slurm, _name):
        app.command(_name, context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(
            getattr(slurm, _name)
        )

console = Console()
err = error_console()
T = TypeVar("T")
NatsOpt = Annotated[str | None, typer.Option("--nats", envvar="NATS_URL", help="NATS server URL")]
TeamOpt = Annotated[str | None, typer.Option("--team", envvar="ONEPLUS_TEAM", help="Act as this team")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON")]


def fail(message: str, code: int = 2) -> typer.Exit:
    err.print(f"[red]error:[/] {escape(message)}", highlight=False)
    return typer.Exit(code)


def call(nats: str | None, team: str | None, fn: Callable[[OnePlusClient], Awaitable[T]]) -> T:
    try:
        return run_with_client(nats, team, fn)
    except PlatformError as exc:
        raise fail(str(exc)) from None


def dump(obj: Any) -> None:
    print(json.dumps(obj, indent=2, default=str))


def dump_records(records: list[JobRecord]) -> None:
    """`dump` of many records, encoded by pydantic: json.dumps with an indent runs in Python, which took longer than
    fetching them (10,000 jobs: 2.4 s). Non-ASCII characters come as UTF-8, not escaped."""
    from oneplus_contracts import JobRecord
    from pydantic import TypeAdapter

    sys.stdout.flush()
    sys.stdout.buffer.write(TypeAdapter(list[JobRecord]).dump_json(records, indent=2) + b"\n")
    sys.stdout.flush()


@app.command()
def submit(
    file: Annotated[Path, typer.Option("-f", "--file", help="JobSpec, PyTorchJob, MPIJob, TrainJob or sbatch script")],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the normalised job spec; submit nothing")] = False,
    as_json: JsonOpt = False,
    msg_id: Annotated[
        str | None, typer.Option("--id", help="Submission id: a retry with the same id is not a second job")
    ] = None,
    simulate_s: Annotated[
        str | None,
        typer.Option(
            "--simulate-s",
            help="On the simulated runtime (`oneplus dev up`), hold the GPUs this many seconds; wins over the "
            "document's simulate.duration_s, #ONEPLUS --simulate-s or oneplus.io/simulate-s annotation",
        ),
    ] = None,
    nats: NatsOpt = None,
    team: TeamOpt = None,
) -> None:
    """Submit a job from a file."""
    from oneplus_jobformats.errors import JobFormatError
    from oneplus_jobformats.load import load_job_document
    from oneplus_jobformats.simulate import parse_simulate_s, with_simulated_duration
    from oneplus_jobformats.summary import dry_run_summary
    from oneplus_jobformats.text import decode_document

    try:
        data = file.read_bytes()
    except OSError as exc:
        raise fail(f"cannot read {file}: {exc.strerror}") from exc
    try:
        tr = load_job_document(decode_document(data, filename=str(file)), filename=str(file))
        if simulate_s is not None:
            tr.spec = with_simulated_duration(tr.spec, parse_simulate_s(simulate_s, source="--simulate-s"))
    except JobFormatError as exc:
        raise fail(str(exc)) from exc
    spec = with_submitter(tr.spec)  # the submitter, unless the document names a user: as sbatch does
    if team is not None:
        spec = spec.model_copy(update={"team": team})
    for w in tr.warnings:
        err.print(f"[yellow]warning:[/] {w}")
    if dry_run:
        summary = dry_run_summary(spec, tr.warnings)
        if as_json:
            dump(summary)
        else:
            console.print_json(json.dumps(summary, default=str))
        return
    reply = call(nats, team, lambda c: c.submit(spec, msg_id=msg_id, source=f"cli:{tr.kind}"))
    if as_json:
        dump(reply.model_dump(mode="json"))
    if not reply.ok:
        raise fail(f"rejected: {reply.error}", 1)
    if not as_json:
        note = " (already submitted: same id)" if reply.duplicate else ""
        console.print(f"submitted job [bold]{reply.job_id}[/]{note}")


@app.command()
def queue(nats: NatsOpt = None, team: TeamOpt = None, as_json: JsonOpt = False) -> None:
    """Pending and running jobs, squeue-like, with the reason a pending job waits; then the advance reservations
    active or to come, with how many of the pending jobs wait on each."""
    from .reservation import queue_section

    async def both(c: OnePlusClient) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        rows = await c.queue()
        try:
            reservations = await c.reservations()
        except PlatformError:
            reservations = []  # an intake that does not answer: the queue shows without them
        return rows, reservations

    rows, reservations = call(nats, team, both)
    if as_json:
        dump(rows)
        return
    t = Columns("queue", ("JOBID", "QUEUE", "NAME", "USER", "ST", "TIME", "GPUS", "NODELIST(REASON)"))
    for r in rows:
        where = reason_cell(r) if r.get("st") in ("PD", "RQ") else str(r.get("where", ""))
        t.add_row(*(str(r.get(k, "")) for k in ("job_id", "queue", "name", "user", "st", "time", "gpus")), where)
    t.print(console)
    section = queue_section(reservations, rows)
    if section is not None:
        console.print()
        section.print(console)


@jobs_app.command("list")
def jobs_list(
    nats: NatsOpt = None,
    team: TeamOpt = None,
    as_json: JsonOpt = False,
    state: Annotated[
        str | None,
        typer.Option(
            "--state",
            "-s",
            help="Only these states, comma-separated: names, Slurm codes, Slurm/Kubernetes names (FAILED,R,PENDING)",
        ),
    ] = None,
    since: Annotated[
        str | None,
        typer.Option(
            "--since",
            "-S",
            help="Only jobs that had not ended by then: a time ago (90m, 6h, 2d), epoch seconds, or ISO-8601 "
            "(local time unless it names a zone)",
        ),
    ] = None,
    user: Annotated[str | None, typer.Option("--user", "-u", help="Only this user's jobs")] = None,
    limit: Annotated[int | None, typer.Option("--limit", "-n", min=1, help="At most this many jobs")] = None,
) -> None:
    """Jobs (of your team, with --team), like sacct: live and recently finished ones first, then the archive."""
    import re
    from datetime import datetime

    from oneplus_stores.archive import parse_states

    try:
        states = parse_states(state)
    except ValueError as exc:
        raise fail(f"--state: {exc}") from None
    when: float | None = None
    if since is not None:
        text = since.strip()
        ago = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([smhdw])", text, re.IGNORECASE)
        try:
            if ago:
                unit = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}[ago.group(2).lower()]
                when = time.time() - float(ago.group(1)) * unit
            elif re.fullmatch(r"\d+(?:\.\d+)?", text):
                when = float(text)
            else:
                when = datetime.fromisoformat(text).timestamp()  # a naive time is the local one, as sacct reads it
        except ValueError:
            raise fail(
                f"--since: {since!r} is not a time; give a time ago (90m, 6h, 2d), epoch seconds or ISO-8601 "
                "(2025-06-01T08:00)"
            ) from None
    jobs = call(
        nats,
        team,
        lambda c: c.list_jobs(team, state=sorted(states) if states else None, since=when, user=user, limit=limit),
    )
    if as_json:
        dump_records(jobs)
    else:
        pending = [j.job_id for j in jobs if j.state in ("SUBMITTED", "ACCEPTED")]
        jobs_columns(jobs, reasons=_pending_reasons(nats, team, pending)).print(console)


def _pending_reasons(nats: str | None, team: str | None, job_ids: list[str]) -> dict[str, str]:
    """job id → `pending_reason(...)` from the solver's queue rows; {} when nothing waits or the solver is away."""
    if not job_ids:
        return {}
    try:
        rows = run_with_client(nats, team, lambda c: c.queue())
    except PlatformError:
        return {}
    wanted = set(job_ids)
    return {r["job_id"]: pending_reason(r.get("reason"), r.get("message")) for r in rows if r.get("job_id") in wanted}


@jobs_app.command("show")
def jobs_show(job_id: str, nats: NatsOpt = None, team: TeamOpt = None, as_json: JsonOpt = False) -> None:
    """One job: its spec, state, allocation and history; for a pending job, why it waits (the solver's word)."""

    async def go(c: OnePlusClient) -> tuple[dict[str, Any], dict[str, Any] | None]:
        # The record as the intake sends it: rendering a dict needs no pydantic model (start-up time).
        rec: dict[str, Any] = await c.ops(subjects.OPS_JOB_SHOW, {"job_id": job_id})
        why: dict[str, Any] | None = None
        if rec.get("state") in ("SUBMITTED", "ACCEPTED") and not as_json:
            try:
                why = await c.explain(job_id)
            except PlatformError:
                why = None  # the solver is away: the table says (None)
        return rec, why

    rec, why = call(nats, team, go)
    if as_json:
        dump(rec)
        return
    reasons = {rec["job_id"]: pending_reason(why.get("reason"), why.get("message"))} if why else None
    jobs_columns([rec], title=rec["job_id"], reasons=reasons).print(console)
    alloc = rec.get("allocation")
    if alloc:
        for r in alloc.get("ranks", []):
            milli = r.get("gpu_milli")
            sharing = {"mps": ", MPS-isolated", "time-slice": ", time-slice: no isolation"}.get(
                r.get("sharing") or "", ""
            )
            devices = f"MIG {', '.join(r['mig'])}" if r.get("mig") else f"GPUs {r['gpus']}"
            console.print(
                f"  rank {r['rank']}: {r['node']} {devices}" + (f" ({milli}/1000 each{sharing})" if milli else ""),
                highlight=False,
            )
        console.print(
            f"  domain {alloc.get('domain')}, {ring_words(alloc)}, solver {alloc.get('solver')}", highlight=False
        )
    if why and why.get("pending"):
        word = pending_reason(why.get("reason"), why.get("message"))
        message = str(why.get("message") or "")
        detail = message if message.startswith(f"{word}:") else f"{word}: {message}" if message else word
        console.print(f"  reason: {escape(detail)}", highlight=False, soft_wrap=True)
    elif rec.get("reason"):
        console.print(f"  reason: {escape(str(rec['reason']))}", highlight=False, soft_wrap=True)


def ring_words(alloc: dict[str, Any]) -> str:
    """The ring's bandwidth; a job on one GPU or a share of one has no ring (not "ring 0 GB/s")."""
    ring = float(alloc.get("ring_gbps") or 0)
    if ring > 0:
        return f"ring {ring:g} GB/s"
    ranks = alloc.get("ranks") or []
    milli = next((r.get("gpu_milli") for r in ranks if r.get("gpu_milli")), None)
    if milli:
        return f"a share of one GPU ({milli / 10:g}%), no ring"
    return "one GPU, no ring"


@jobs_app.command("explain")
def jobs_explain(job_id: str, nats: NatsOpt = None, team: TeamOpt = None, as_json: JsonOpt = False) -> None:
    """Why a job is pending, in terms you can act on."""
    res = call(nats, team, lambda c: c.explain(job_id))
    if as_json:
        dump(res)
    else:
        console.print(res.get("message", res))


@jobs_app.command("cancel")
def jobs_cancel(job_id: str, nats: NatsOpt = None, team: TeamOpt = None) -> None:
    """Cancel a job (same as `oneplus cancel`)."""
    res = call(nats, team, lambda c: c.cancel(job_id, team))
    console.print(f"cancel requested for {res['job_id']} (was {res['state']})")


@app.command()
def cancel(job_id: str, nats: NatsOpt = None, team: TeamOpt = None) -> None:
    """Cancel a job: pending jobs end at once, running ranks are stopped."""
    jobs_cancel(job_id, nats, team)


@app.command()
def logs(
    job_id: str,
    rank: Annotated[int | None, typer.Option("--rank", help="Only this rank")] = None,
    follow: Annotated[bool, typer.Option("-f", "--follow", help="Keep printing until the job ends")] = False,
    nats: NatsOpt = None,
    team: TeamOpt = None,
) -> None:
    """A job's output, from the executors of its nodes."""

    import asyncio

    async def go(c: OnePlusClient) -> None:
        offsets: dict[str, int] = {}
        while True:
            rec = await c.get_job(job_id)
            if rec.allocation is None:
                if not follow:
                    raise PlatformError(f"job {job_id} is {rec.state} and has not run anywhere yet")
            else:
                for node in rec.allocation.nodes:
                    res = await c.ops(
                        f"{subjects.PREFIX}.ops.node.{node}.logs",
                        {"job_id": job_id, "rank": rank, "since": offsets.get(node, 0)},
                    )
                    offsets[node] = res["next"]
                    for line in res["lines"]:
                        console.print(
                            f"[dim]{node}[/] {escape(line)}", highlight=False, soft_wrap=True
                        )  # log lines stay whole
            if not follow or rec.terminal:
                return
            await asyncio.sleep(1.0)

    call(nats, team, go)


@nodes_app.callback()
def nodes(ctx: typer.Context, nats: NatsOpt = None, as_json: JsonOpt = False) -> None:
    """sinfo-like view: node, leaf, GPUs free/total, NVLink summary, health."""
    if ctx.invoked_subcommand is not None:
        # `nodes --json show X` means `nodes show X --json`; so does --nats before the subcommand.
        ctx.obj = {"json": as_json, "nats": nats}
        return

    async def go(c: OnePlusClient) -> tuple[list[Any], list[Any]]:
        # Only the jobs holding GPUs now: the archive has nothing to say about what is used.
        from oneplus_contracts.jobindex import HOLDING_STATES

        return await c.nodes(), await c.list_jobs(state=sorted(HOLDING_STATES))

    node_list, jobs = call(nats, None, go)
    held = gpu_holds(jobs)
    if as_json:
        rows = []
        for n in node_list:
            count = gpu_counts(n, held.get(n.topology.node, {}))
            rows.append({**n.model_dump(mode="json"), "gpus_used": count.held, **count.as_dict()})
        dump(rows)
    else:
        nodes_columns(node_list, held).print(console)


def _parent(ctx: typer.Context, as_json: bool, nats: str | None) -> tuple[bool, str | None]:
    """--json / --nats given to `nodes` before the subcommand count as given to it."""
    obj = ctx.obj if isinstance(ctx.obj, dict) else {}
    return as_json or bool(obj.get("json")), nats or obj.get("nats")


@nodes_app.command("show")
def nodes_show(ctx: typer.Context, node: str, nats: NatsOpt = None, as_json: JsonOpt = False) -> None:
    """One node: the GPU link matrix, NVLink groups, NUMA and NICs."""
    as_json, nats = _parent(ctx, as_json, nats)
    node_list = call(nats, None, lambda c: c.nodes())
    match = [n for n in node_list if n.topology.node == node]
    if not match:
        raise fail(f"no node {node!r}; known: {', '.join(n.topology.node for n in node_list)}")
    if as_json:
        dump(match[0].model_dump(mode="json"))
        return
    topology.print_link_matrix(console, match[0].topology)


def _node_op(ctx: typer.Context, subject: str, node: str, nats: str | None, as_json: bool, **extra: Any) -> None:
    as_json, nats = _parent(ctx, as_json, nats)
    res = call(nats, None, lambda c: c.node_op(subject, node, **extra))
    if as_json:
        dump(res)
    else:
        console.print(f"{res['node']}: {res['status']}")


@nodes_app.command("drain")
def nodes_drain(ctx: typer.Context, node: str, nats: NatsOpt = None, as_json: JsonOpt = False) -> None:
    """Place nothing new on NODE; running jobs finish."""
    _node_op(ctx, subjects.OPS_NODE_DRAIN, node, nats, as_json)


@nodes_app.command("cordon")
def nodes_cordon(ctx: typer.Context, node: str, nats: NatsOpt = None, as_json: JsonOpt = False) -> None:
    """Mark NODE unschedulable."""
    _node_op(ctx, subjects.OPS_NODE_CORDON, node, nats, as_json)


@nodes_app.command("uncordon")
def nodes_uncordon(ctx: typer.Context, node: str, nats: NatsOpt = None, as_json: JsonOpt = False) -> None:
    """Make NODE schedulable again (clears drain too)."""
    _node_op(ctx, subjects.OPS_NODE_UNCORDON, node, nats, as_json)


@dev_app.command("up")
def dev_up(
    runtime: Annotated[str, typer.Option(help="simulated or docker")] = "simulated",
    nodes: Annotated[
        int, typer.Option("--nodes", min=0, help="Simulated nodes hosted by one fleet process (0: the four demo nodes)")
    ] = 0,
    cluster: Annotated[
        Path | None, typer.Option("--cluster", help="A cluster YAML (docs/topology.md) for the simulated fleet")
    ] = None,
    topology: Annotated[str, typer.Option(help="The preset of every --nodes node")] = "h100_sxm_8gpu_nvswitch_nv18",
    nodes_per_leaf: Annotated[int, typer.Option(min=1, help="--nodes per leaf switch")] = 16,
    heartbeat: Annotated[float, typer.Option(min=0.1, help="Seconds between two heartbeats of a fleet node")] = 5.0,
    solver_replicas: Annotated[
        int,
        typer.Option(
            "--solver-replicas", min=1, max=8, help="Placement-solver replicas, active-active (docs/architecture.md)"
        ),
    ] = 1,
    queues_file: Annotated[
        Path | None,
        typer.Option(
            "--queues",
            help="A queue file (OnePlus queue config or Kueue ClusterQueue/LocalQueue/... YAML), applied once the "
            "stack is up, as `oneplus queues apply -f` does",
        ),
    ] = None,
) -> None:
    """Start the embedded stack (NATS, Redis, five services, four simulated nodes) until Ctrl-C.

    With --nodes N or --cluster FILE one process hosts every simulated node instead (docs/fleet.md):
    `oneplus dev up --nodes 512` is 4,096 H100 GPUs.
    """
    from ..devstack import EmbeddedServers, FleetSpec, Platform, dev_state_path, pid_alive, urls_from_env

    running = _read_state(dev_state_path())
    if running is not None and pid_alive(int(running.get("pid", 0))):
        raise fail(f"a `oneplus dev up` runs already (pid {running['pid']}): `oneplus dev status`, `oneplus dev down`")

    fleet = None
    if nodes or cluster is not None:
        if nodes and cluster is not None:
            raise fail("give --nodes or --cluster, not both")
        if runtime != "simulated":
            raise fail("a fleet's nodes are simulated: --nodes and --cluster take --runtime simulated")
        fleet = FleetSpec(
            nodes=nodes, topology=topology, nodes_per_leaf=nodes_per_leaf, cluster=cluster, heartbeat_s=heartbeat
        )
        try:
            want, gpus = fleet.size()
        except (ValueError, KeyError, OSError) as exc:
            raise fail(str(exc)) from None
    queue_file = queues.read_queue_file(queues_file) if queues_file is not None else None  # bad: nothing starts
    import signal

    nats_url, redis_url = urls_from_env()
    servers = None if nats_url and redis_url else EmbeddedServers().start()
    nats_url = nats_url or (servers.nats_url if servers else "")
    redis_url = redis_url or (servers.redis_url if servers else "")
    platform = Platform(nats_url, redis_url, runtime=runtime, fleet=fleet, solver_replicas=solver_replicas).start()
    state = dev_state_path()
    stopping = waiting = False

    def _stop(*_: object) -> None:
        nonlocal stopping
        stopping = True
        if waiting:
            raise KeyboardInterrupt  # out of the wait for readiness; the loop below is left by the flag

    signal.signal(signal.SIGTERM, _stop)
    try:
        waiting = True
        try:
            with console.status("waiting for every node, the intake's HTTP and the placement-solver..."):
                took = platform.wait_ready(timeout=600)
        except (RuntimeError, TimeoutError) as exc:
            err.print(f"[red]the platform did not come up:[/] {escape(str(exc))} (logs: {platform.logdir})")
            stopping = True
        finally:
            waiting = False
        if not stopping and queue_file is not None:
            try:
                queues.apply_queue_file(nats_url, queue_file)
            except typer.Exit:
                stopping = True  # the error is printed: the stack stops rather than run with other queues
        if not stopping:
            urls = platform.urls()
            size = f"{want} simulated nodes ({gpus} GPUs)" if fleet is not None else f"{platform.node_count} nodes"
            console.print(f"ready after {took:.1f}s: {size}, runtime {runtime}", highlight=False)
            console.print(runtime_note(runtime), highlight=False, soft_wrap=True)
            if queue_file is not None:
                console.print(
                    f"queues from {queues_file}: {', '.join(q.name for q in queue_file.config.queues)} "
                    f"(jobs go to {', '.join(queue_file.config.leaf_queues())}); `oneplus queues` shows them",
                    highlight=False,
                    soft_wrap=True,
                )
            for name, url in urls.items():
                console.print(f"  {name:<28} {url}", highlight=False, soft_wrap=True)
            console.print(f"  {'logs':<28} {platform.logdir}", highlight=False, soft_wrap=True)
            console.print(
                f"NATS_URL={nats_url}\nREDIS_URL={redis_url}\n"
                "the CLI in another shell finds this stack by itself (its state file, while NATS_URL is unset); "
                "export those two variables for other tools; `oneplus dev status` shows this again, "
                "`oneplus dev down` or Ctrl-C stops everything",
                highlight=False,
                soft_wrap=True,
            )
            procs = {n: p.pid for n, p in platform.procs.items()}
            if servers is not None:
                procs |= {"nats-server": servers.nats_proc.pid if servers.nats_proc else 0}
                procs |= {"redis-server": servers.redis_proc.pid if servers.redis_proc else 0}
            _write_state(
                state,
                {"pid": os.getpid(), "urls": urls, "logdir": str(platform.logdir), "procs": procs, "runtime": runtime},
            )
        while not stopping:
            dead = platform.dead()
            if dead:
                err.print(f"[red]process exited:[/] {dead} (see {platform.logdir})")
                break
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        _remove_state(state, os.getpid())
        platform.stop()
        if servers is not None:
            servers.stop()
        console.print("stopped")


def runtime_note(runtime: str) -> str:
    """What `dev up` says about how jobs run: on the simulated runtime no command runs at all."""
    if runtime == "simulated":
        return (
            "jobs are simulated: no process runs; each job holds its GPUs for its `simulate.duration_s` (1 s when it "
            "gives none) and exits 0 unless `simulate.exit_code` says otherwise; set it with `oneplus submit "
            "--simulate-s`, `#ONEPLUS --simulate-s=N` in an sbatch script or the `oneplus.io/simulate-s` annotation "
            "(docs/executor.md); `--runtime docker` runs real containers"
        )
    return f"jobs run as containers through the {runtime} runtime (docs/executor.md)"


def _write_state(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({**doc, "started": time.time()}, indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)


def _read_state(path: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise fail(f"{path}: unreadable ({exc}); remove it if no `oneplus dev up` runs") from None
    return doc if isinstance(doc, dict) else None


def _remove_state(path: Path, pid: int) -> None:
    """Remove the state file if it is this `dev up`'s (another one may have started since)."""
    import contextlib

    with contextlib.suppress(OSError, ValueError):
        if json.loads(path.read_text(encoding="utf-8")).get("pid") == pid:
            path.unlink()


@dev_app.command("status")
def dev_status(as_json: JsonOpt = False) -> None:
    """Whether a `oneplus dev up` runs, its URLs and which of them answer; exit 1 when none runs or one is down."""
    from ..devstack import dev_state_path, http_status, pid_alive, port_open

    path = dev_state_path()
    doc = _read_state(path)
    if doc is None:
        if as_json:
            dump({"running": False, "state_file": str(path)})
        else:
            err.print(f"no `oneplus dev up` runs (no {path})", highlight=False)
        raise typer.Exit(1)
    pid = int(doc.get("pid", 0))
    running = pid > 0 and pid_alive(pid)
    checks: dict[str, bool] = {}
    for name, url in (doc.get("urls") or {}).items():
        if not running:
            checks[name] = False
        elif name in ("http", "dashboard"):
            checks[name] = http_status(url.rstrip("/") + ("/healthz" if name == "http" else "/")) == ""
        else:
            checks[name] = port_open(url)
    ok = running and all(checks.values())
    if as_json:
        dump({"running": running, "ok": ok, "pid": pid, "state_file": str(path), **doc, "up": checks})
    else:
        state = "running" if running else "not running (stale state file)"
        rt = f"runtime {doc['runtime']}; " if doc.get("runtime") else ""
        console.print(f"oneplus dev up: pid {pid}, {state}; {rt}logs {doc.get('logdir')}", highlight=False)
        for name, url in (doc.get("urls") or {}).items():
            mark = "up" if checks.get(name) else "DOWN"
            console.print(f"  {mark:<5}{name:<28} {url}", highlight=False, soft_wrap=True)
    if not running:
        _remove_state(path, pid)
    if not ok:
        raise typer.Exit(1)


@dev_app.command("down")
def dev_down(
    timeout: Annotated[float, typer.Option(min=1, help="Seconds to wait for it to stop")] = 60.0,
) -> None:
    """Stop a running `oneplus dev up` (SIGTERM, as Ctrl-C) and wait until it has stopped everything."""
    import signal

    from ..devstack import dev_state_path, pid_alive

    path = dev_state_path()
    doc = _read_state(path)
    if doc is None:
        err.print(f"no `oneplus dev up` runs (no {path})", highlight=False)
        raise typer.Exit(1)
    pid = int(doc.get("pid", 0))
    if pid <= 0 or not pid_alive(pid):
        path.unlink(missing_ok=True)
        err.print(f"no `oneplus dev up` runs (pid {pid} is gone); removed the stale {path}", highlight=False)
        raise typer.Exit(1)
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if pid_alive(pid):
        raise fail(f"`oneplus dev up` (pid {pid}) did not stop within {timeout:g}s; its logs: {doc.get('logdir')}", 1)
    path.unlink(missing_ok=True)
    console.print(f"stopped `oneplus dev up` (pid {pid})", highlight=False)


@app.command()
def audit(
    nats: NatsOpt = None,
    cluster: Annotated[str, typer.Option(envvar="ONEPLUS_CLUSTER", help="The reservation key space")] = "default",
    as_json: JsonOpt = False,
) -> None:
    """Replay the reservation audit kept in JetStream (it outlives a Redis reset): was a GPU ever held twice?"""
    from oneplus_reservations import check_history
    from oneplus_stores.audit import audit_history, read_audit

    async def run(c: OnePlusClient) -> dict[str, Any]:
        entries = await read_audit(c.nc)
        problems = check_history(audit_history(entries, cluster))
        ops: dict[str, int] = {}
        for e in entries:
            ops[e.op] = ops.get(e.op, 0) + 1
        epochs = sorted({e.epoch for e in entries})
        return {"entries": len(entries), "ops": ops, "epochs": epochs, "double_use": problems}

    out = call(nats, None, run)
    if as_json:
        dump(out)
    else:
        ops = ", ".join(f"{n} {op}" for op, n in sorted(out["ops"].items())) or "none"
        console.print(f"{out['entries']} audit entries ({ops}); epochs {out['epochs'] or '-'}")
        for line in out["double_use"]:
            console.print(f"[red]double use:[/] {escape(line)}")
        if not out["double_use"]:
            console.print("no GPU was ever held by two reservations at once")
    if out["double_use"]:
        raise typer.Exit(1)


@app.command()
def demo(
    jobs: Annotated[int, typer.Option(help="How many gangs to submit")] = 20,
    seed: Annotated[int, typer.Option(help="Workload seed")] = 7,
    runtime: Annotated[str, typer.Option(help="simulated, or docker (ONEPLUS_DOCKER_URL)")] = "simulated",
) -> None:
    """Run the platform on the embedded default with a mixed workload of 1- to 16-GPU gangs."""
    from ..demo import run_demo

    raise typer.Exit(run_demo(jobs, seed, runtime))


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)
