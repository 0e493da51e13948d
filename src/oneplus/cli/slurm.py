"""Slurm-style commands: `oneplus sbatch`, `squeue`, `scancel`, `sinfo`.

Parsing and table rendering live in `oneplus_jobformats` (pure, tested); this module reads files, talks to the
platform through `oneplus.client` and prints.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from .render import reason_cell

# The job formats and the contracts' models are imported by the commands (start-up time of `oneplus --help`).
if TYPE_CHECKING:
    from oneplus_contracts import JobRecord

    from ..client import OnePlusClient

app = typer.Typer(help="Slurm-style commands: sbatch, squeue, scancel, sinfo.")
T = TypeVar("T")
EXTRA = {"allow_extra_args": True, "ignore_unknown_options": True}
NatsOpt = Annotated[str | None, typer.Option("--nats", envvar="NATS_URL", help="NATS server URL")]
TeamOpt = Annotated[str | None, typer.Option("--team", envvar="ONEPLUS_TEAM", help="Act as this team")]


def _fail(command: str, message: str, code: int = 1) -> typer.Exit:
    print(f"{command}: error: {message}", file=sys.stderr)
    return typer.Exit(code)


def _call(command: str, nats: str | None, team: str | None, fn: Callable[[OnePlusClient], Awaitable[T]]) -> T:
    from ..client import PlatformError, run_with_client

    try:
        return run_with_client(nats, team, fn)
    except PlatformError as exc:
        raise _fail(command, str(exc)) from exc


def _no_extras(command: str, ctx: typer.Context) -> None:
    if ctx.args:
        raise _fail(command, f"unrecognized argument(s): {' '.join(ctx.args)}", 2)


def sbatch(
    ctx: typer.Context,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the normalised job spec; submit nothing")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False,
    nats: NatsOpt = None,
    team: TeamOpt = None,
    site_file: Annotated[
        Path | None,
        typer.Option(
            "--site",
            envvar="ONEPLUS_SITE_FILE",
            help="The site's QOS -> priority class, partition -> queue, account -> team (YAML)",
        ),
    ] = None,
    simulate_s: Annotated[
        str | None,
        typer.Option(
            "--simulate-s",
            help="On the simulated runtime, hold the GPUs this many seconds (else the script's #ONEPLUS --simulate-s)",
        ),
    ] = None,
) -> None:
    """Submit a batch script: oneplus sbatch OPTIONS... [: OPTIONS...] SCRIPT ARGS... (any sbatch option; they
    override the script's #SBATCH directives; ':' starts the next component of a heterogeneous job). Without SCRIPT
    the script is read from standard input."""
    from oneplus_jobformats.errors import JobFormatError
    from oneplus_jobformats.sbatch import parse_sbatch
    from oneplus_jobformats.sbatch_options import split_command_line
    from oneplus_jobformats.simulate import parse_simulate_s, sbatch_simulate_s, with_simulated_duration
    from oneplus_jobformats.summary import dry_run_summary

    from ..client import with_submitter

    try:
        options, script_path, script_args = split_command_line(list(ctx.args))
    except JobFormatError as exc:
        raise _fail("sbatch", str(exc), 2) from exc
    from oneplus_jobformats.site import EMPTY, SiteMapError, load_site

    try:
        site = load_site(site_file) if site_file is not None else EMPTY
    except SiteMapError as exc:
        raise _fail("sbatch", str(exc), 2) from exc
    script, filename = _read_script(script_path, options)
    try:
        tr = parse_sbatch(script, options, filename=filename, script_args=script_args, site=site)
        seconds = sbatch_simulate_s(script, filename=filename)
        if simulate_s is not None:
            seconds = parse_simulate_s(simulate_s, source="--simulate-s")
        if seconds is not None:
            tr.spec = with_simulated_duration(tr.spec, seconds)
    except JobFormatError as exc:
        raise _fail("sbatch", str(exc), 2) from exc
    spec = with_submitter(tr.spec)  # like Slurm, the job belongs to whoever submits it (as `oneplus submit`)
    if team is not None:
        spec = spec.model_copy(update={"team": team})
    for w in tr.warnings:
        print(f"sbatch: warning: {w}", file=sys.stderr)
    if dry_run:
        summary = dry_run_summary(spec, tr.warnings, kind=tr.kind)
        print(json.dumps(summary, indent=None if as_json else 2, default=str))
        return
    reply = _call("sbatch", nats, team, lambda c: c.submit(spec, source="sbatch"))
    if as_json:
        print(json.dumps(reply.model_dump(mode="json")))
    if not reply.ok:
        raise _fail("sbatch", f"Batch job submission failed: {reply.error}")
    if not as_json:
        print(reply.job_id if "--parsable" in options else f"Submitted batch job {reply.job_id}")


def _read_script(path: str | None, options: list[str]) -> tuple[str, str]:
    """The script text and its name; sbatch reads standard input when no script is named and there is no --wrap.
    A script that is not UTF-8 is one line naming the byte, not a traceback."""
    from oneplus_jobformats.errors import JobFormatError
    from oneplus_jobformats.text import decode_document

    if path is None:
        if any(o.startswith("--wrap") for o in options):
            return "", "<wrap>"
        if sys.stdin.isatty():
            raise _fail("sbatch", "no batch script given (name a file, pipe one in, or use --wrap)", 2)
        buffer = getattr(sys.stdin, "buffer", None)
        if buffer is None:
            return sys.stdin.read(), "<stdin>"
        data, name = buffer.read(), "<stdin>"
    else:
        try:
            data, name = Path(path).read_bytes(), path
        except OSError as exc:
            raise _fail("sbatch", f"Unable to open file {path}: {exc.strerror or exc}", 2) from exc
    try:
        return decode_document(data, filename=name), name
    except JobFormatError as exc:
        raise _fail("sbatch", str(exc), 2) from exc


def squeue(
    ctx: typer.Context,
    user: Annotated[str | None, typer.Option("-u", "--user", help="Only this user's jobs")] = None,
    partition: Annotated[str | None, typer.Option("-p", "--partition", help="Only this queue")] = None,
    states: Annotated[
        str | None, typer.Option("-t", "--states", help="all, or a comma list of codes or names (PD,R,PENDING)")
    ] = None,
    jobs: Annotated[str | None, typer.Option("-j", "--jobs", help="Comma list of job ids")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the job records as JSON")] = False,
    nats: NatsOpt = None,
    team: TeamOpt = None,
) -> None:
    """Jobs in Slurm's default squeue columns: JOBID PARTITION NAME USER ST TIME NODES NODELIST(REASON)."""
    from oneplus_contracts.jobindex import HOLDING_STATES
    from oneplus_contracts.slurm import STATE_ALIASES, STATE_CODES

    from ..client import PlatformError

    _no_extras("squeue", ctx)
    # Like Slurm's squeue: by default the live jobs only, not the accounting archive (sacct's); `-t` asks for more.
    live = None if states else sorted(HOLDING_STATES | {"SUBMITTED", "ACCEPTED"})

    async def fetch(c: OnePlusClient) -> tuple[list[JobRecord], dict[str, str]]:
        records = await c.list_jobs(team, state=live)
        reasons: dict[str, str] = {}
        if not as_json and any(r.state in PENDING_STATES for r in records):
            # Why each pending job waits, in the solver's word: the same as `oneplus queue` and `jobs show`; when
            # the solver is away, (None).
            with contextlib.suppress(PlatformError):
                reasons = {row["job_id"]: reason_cell(row) for row in await c.queue()}
        return records, reasons

    records, reasons = _call("squeue", nats, team, fetch)
    wanted = {s.strip().upper() for s in states.split(",")} if states and states.lower() != "all" else None
    if wanted is not None:  # Slurm's long names (PENDING, COMPLETED...) as the states they stand for
        wanted |= {state for name in wanted for state in STATE_ALIASES.get(name, ())}
    ids = set(jobs.split(",")) if jobs else None
    shown = [
        r
        for r in records
        if (user is None or r.spec.user == user)
        and (partition is None or r.spec.queue in partition.split(","))
        and (
            ids is None or r.job_id in ids or (r.spec.array_task is not None and r.spec.array_task.array_job_id in ids)
        )
        and (wanted is None or STATE_CODES.get(r.state) in wanted or r.state in wanted)
    ]
    if as_json:
        print(json.dumps([r.model_dump(mode="json") for r in shown]))
        return
    print(squeue_text(shown, reasons, now=time.time(), include_finished=states is not None))


PENDING_STATES = frozenset({"SUBMITTED", "ACCEPTED"})


def _array_of(rec: JobRecord) -> str | None:
    """The array a task belongs to (`squeue -j 123` shows every task of array 123)."""
    return rec.spec.array_task.array_job_id if rec.spec.array_task is not None else None


def squeue_text(
    records: list[JobRecord], reasons: dict[str, str], *, now: float, include_finished: bool = False
) -> str:
    """Slurm's squeue layout (right-aligned, its default widths), each column widened to its longest cell: an id,
    a name or a state is never cut. A pending job's NODELIST(REASON) is `reasons[job_id]` when the solver gave one,
    `(None)` otherwise, as `oneplus queue` and `oneplus jobs show` say it."""
    from oneplus_contracts import ACTIVE_STATES
    from oneplus_jobformats.slurm_tables import SQUEUE_COLUMNS, fold_pending_tasks, squeue_row

    shown = [r for r in records if include_finished or not r.terminal]
    shown.sort(key=lambda r: (r.state not in ACTIVE_STATES, -r.spec.priority, r.submitted_ts))
    shown, arrays = fold_pending_tasks(shown)  # an array's pending tasks as one row, j-abc_[7-999%50]
    rows = []
    for r in shown:
        row = squeue_row(r, now=now)
        job_id = arrays.get(r.job_id, row.job_id)
        where = row.nodelist_reason
        if r.state in PENDING_STATES:
            where = reasons.get(job_id) or reasons.get(r.job_id) or reason_cell({"reason": None})
        cells = (job_id, row.partition, row.name, row.user, row.state, row.time, str(row.nodes))
        rows.append((cells, where))
    widths = [max([w, len(name)] + [len(c[i]) for c, _ in rows]) for i, (name, w) in enumerate(SQUEUE_COLUMNS)]
    header = " ".join(name.rjust(w) for (name, _), w in zip(SQUEUE_COLUMNS, widths, strict=True))
    lines = [header + " NODELIST(REASON)"]
    for cells, where in rows:
        lines.append(" ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True)) + " " + where)
    return "\n".join(lines)


def scancel(
    ctx: typer.Context,
    job_ids: Annotated[list[str] | None, typer.Argument(help="Job ids to cancel")] = None,
    signal: Annotated[
        str | None,
        typer.Option(
            "--signal",
            "-s",
            help="Send this signal (USR1, SIGTERM, 10) to the job's running processes instead of cancelling it",
        ),
    ] = None,
    nats: NatsOpt = None,
    team: TeamOpt = None,
) -> None:
    """Cancel jobs, or with --signal send them a signal (the batch script, the ranks and the running srun steps'
    tasks get it; the job goes on); like scancel, silent on success."""
    _no_extras("scancel", ctx)
    if not job_ids:
        raise _fail("scancel", "No job identification provided", 2)
    if signal is not None:
        from oneplus_contracts.commands import signal_name

        try:
            signal = signal_name(signal)
        except ValueError as exc:
            raise _fail("scancel", str(exc), 2) from None

    async def cancel_all(c: OnePlusClient) -> list[tuple[str, str | None]]:
        from ..client import PlatformError

        out: list[tuple[str, str | None]] = []
        for job_id in job_ids or []:
            try:
                if signal is not None:
                    await c.signal(job_id, signal, team)
                else:
                    await c.cancel(job_id, team)
                out.append((job_id, None))
            except PlatformError as exc:
                out.append((job_id, str(exc)))
        return out

    failed = [(j, e) for j, e in _call("scancel", nats, team, cancel_all) if e]
    for job_id, error in failed:
        what = "Signal job error" if signal is not None else "Kill job error"
        print(f"scancel: error: {what} on job id {job_id}: {error}", file=sys.stderr)
    if failed:
        raise typer.Exit(1)


def sinfo(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Print the node records as JSON")] = False,
    nats: NatsOpt = None,
) -> None:
    """Nodes in Slurm's default sinfo columns: PARTITION AVAIL TIMELIMIT NODES STATE NODELIST."""
    _no_extras("sinfo", ctx)

    from oneplus_contracts import subjects
    from oneplus_contracts.jobindex import HOLDING_STATES
    from oneplus_jobformats.site import SiteMapError, site_from_env
    from oneplus_jobformats.slurm_tables import render_sinfo

    try:
        site = site_from_env()
    except SiteMapError as exc:
        raise _fail("sinfo", str(exc), 2) from exc

    async def fetch(c: OnePlusClient) -> tuple[list[Any], list[Any], list[Any]]:
        # Only the jobs holding GPUs say which nodes are allocated; the archive has nothing to add.
        queues = await c.ops(f"{subjects.PREFIX}.ops.queues.list", {})
        return await c.nodes(), await c.list_jobs(state=sorted(HOLDING_STATES)), queues

    nodes, jobs, queues = _call("sinfo", nats, None, fetch)
    if as_json:
        print(json.dumps([n.model_dump(mode="json") for n in nodes]))
        return
    # The partitions are the queues, in the site's names: what `sbatch -p` takes.
    partitions = [site.partition_of(str(q["queue"])) for q in queues if isinstance(q, dict) and q.get("queue")]
    print(render_sinfo(nodes, jobs, partitions or None))


for _command in (sbatch, squeue, scancel, sinfo):
    app.command(_command.__name__, context_settings=EXTRA)(_command)
