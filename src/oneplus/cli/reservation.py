"""`oneplus reservation create|list|delete`: advance reservations and maintenance windows (Slurm's
`scontrol create reservation`).

They are stored in the `advance_reservations` KV bucket, which the placement-solver and the intake follow. The intake
creates and deletes them (`oneplus.ops.reservation.*`, the HTTP API's `/v1/reservations` too) after its checks (a start
in the past, a node the cluster does not have, an overlap with one that holds the same nodes, a GPU count the cluster
cannot hold then): a refused one changes nothing, and the CLI prints the intake's one line.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from .calls import call, fail
from .render import Columns

if TYPE_CHECKING:
    from ..client import OnePlusClient

app = typer.Typer(help="Advance reservations and maintenance windows: create, list, delete.")
console = Console()
NatsOpt = Annotated[str | None, typer.Option("--nats", envvar="NATS_URL", help="NATS server URL")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON")]
COLUMNS = (
    ("NAME", "name"),
    ("STATE", "state"),
    ("NODES", "nodes"),
    ("GPUS", "gpus"),
    ("START", "start"),
    ("END", "end"),
    ("USERS", "users"),
    ("TEAMS", "teams"),
    ("ACCOUNTS", "accounts"),
    ("MAINT", "maint"),
)
_UNITS = {"s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}


def parse_when(text: str, now: float) -> float:
    """`now`, `now+2h` (s, m/min, h, d), Unix seconds, or an ISO time (`2027-01-15T09:30`, local unless it says)."""
    from datetime import datetime

    t = text.strip().lower()
    if t == "now":
        return now
    if t.startswith("now+"):
        return now + parse_duration(t[4:])
    try:
        return float(t)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(text.strip()).timestamp()
    except ValueError:
        raise ValueError(f"{text!r} is not a time (now, now+2h, Unix seconds or 2027-01-15T09:30)") from None


def parse_duration(text: str) -> float:
    """`90` (minutes, as Slurm's Duration), `90s`, `30m`, `2h`, `1d`."""
    t = text.strip().lower()
    num = t.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = t[len(num) :]
    if not num or unit not in ("", *_UNITS):
        raise ValueError(f"{text!r} is not a duration (90 for minutes, or 90s, 30m, 2h, 1d)")
    try:
        value = float(num)
    except ValueError:
        raise ValueError(f"{text!r} is not a duration (90 for minutes, or 90s, 30m, 2h, 1d)") from None
    if value <= 0:
        raise ValueError(f"{text!r} is not a positive duration")
    return value * (_UNITS[unit] if unit else 60)


def _names(text: str | None) -> list[str]:
    return [x.strip() for x in (text or "").split(",") if x.strip()]


@app.command("create")
def create(
    name: Annotated[str, typer.Argument(help="The reservation's name (jobs name it with --reservation)")],
    nodes: Annotated[str | None, typer.Option("--nodes", help="Nodes set aside: a hostlist, e.g. gpu[01-04]")] = None,
    gpus: Annotated[
        int | None,
        typer.Option("--gpus", help="Or a GPU count (Slurm's TRES=gres/gpu=N): whole nodes free then are picked"),
    ] = None,
    start: Annotated[str, typer.Option("--start", help="now, now+2h, Unix seconds or 2027-01-15T09:30")] = "now",
    duration: Annotated[
        str | None, typer.Option("--duration", help="How long: 90 (minutes), 2h, 1d; or give --end")
    ] = None,
    end: Annotated[str | None, typer.Option("--end", help="When it ends (as --start)")] = None,
    users: Annotated[str | None, typer.Option("--users", help="Users admitted, comma-separated")] = None,
    teams: Annotated[str | None, typer.Option("--teams", help="Teams admitted, comma-separated")] = None,
    accounts: Annotated[str | None, typer.Option("--accounts", help="Slurm accounts admitted")] = None,
    maint: Annotated[bool, typer.Option("--maint", help="A maintenance window (Slurm's MAINT flag)")] = False,
    nats: NatsOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Set nodes (or GPUs: whole nodes holding --gpus) aside from a start time for a duration (or to an end).
    Jobs with `--reservation NAME` of an admitted user, team or account run there while it is active; other jobs
    stay off its nodes, and before it starts use them only if their time limit ends them by its start, so the nodes
    are empty when it begins."""
    from oneplus_contracts.advance import AdvanceReservationRequest
    from oneplus_contracts.slurm import compress_hostlist
    from pydantic import ValidationError

    now = time.time()
    if (duration is None) == (end is None):
        raise fail("give one of --duration and --end")
    if (nodes is None) == (gpus is None):
        raise fail("give one of --nodes and --gpus")
    try:
        start_ts = parse_when(start, now)
        end_ts = parse_when(end, now) if end is not None else start_ts + parse_duration(duration or "")
        req = AdvanceReservationRequest(
            name=name,
            nodes=nodes or [],  # a hostlist, expanded by the model
            gpus=gpus,
            start_ts=start_ts,
            end_ts=end_ts,
            users=_names(users),
            teams=_names(teams),
            accounts=_names(accounts),
            maint=maint,
        )
    except ValidationError as exc:
        raise fail("; ".join(e["msg"].removeprefix("Value error, ") for e in exc.errors())) from None
    except ValueError as exc:
        raise fail(str(exc)) from None

    async def go(c: OnePlusClient) -> Any:
        return await c.create_reservation(req)

    stored = call_reservation(nats, go)
    if as_json:
        print(stored.model_dump_json(indent=2))
        return
    picked = f" on {compress_hostlist(stored.nodes)}" if gpus is not None else ""
    console.print(f"reservation {stored.name} created{picked}", highlight=False)


@app.command("list")
def list_(nats: NatsOpt = None, as_json: JsonOpt = False) -> None:
    """Every reservation: state (WAITING, ACTIVE, ENDED), nodes, GPUs, window, who is admitted."""
    from oneplus_queueing.advance import window_rows

    from ..client import PlatformError

    async def go(c: OnePlusClient) -> Any:
        try:
            return await c.reservations()  # the intake's list: a team's NATS user may ask it too
        except PlatformError:
            return window_rows(time.time(), await c.advance_reservations())  # no intake answers: the bucket itself

    rows = call_reservation(nats, go)
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    t = Columns("reservations", tuple(h for h, _ in COLUMNS))
    for r in rows:
        t.add_row(*(str(r[k]) if r[k] not in ("", None) else "-" for _, k in COLUMNS))
    t.print(console)


@app.command("delete")
def delete(name: str, nats: NatsOpt = None) -> None:
    """Delete a reservation; its jobs that still wait then say it does not exist."""

    async def go(c: OnePlusClient) -> Any:
        return await c.delete_advance_reservation(name)

    if not call_reservation(nats, go):
        raise fail(f"no reservation {name!r}")
    console.print(f"reservation {name} deleted", highlight=False)


def queue_section(reservations: list[dict[str, Any]], queue_rows: list[dict[str, Any]]) -> Columns | None:
    """`oneplus queue`'s reservations: those active or to come, with how many pending jobs wait on each (their
    reason is Reservation and its message names it); None when there are none."""
    from oneplus_queueing.advance import live_rows

    live = live_rows(reservations, queue_rows)
    if not live:
        return None
    t = Columns("reservations", ("RESERVATION", "STATE", "NODES", "GPUS", "START", "END", "MAINT", "WAITING"))
    for r in live:
        gpus = "-" if r.get("gpus") in (None, "") else str(r["gpus"])
        maint = "yes" if r.get("maint") else "-"
        t.add_row(str(r["name"]), str(r["state"]), str(r["nodes"]), gpus, str(r["start"]), str(r["end"]), maint,
                  str(r["waiting"]))  # fmt: skip
    return t


def call_reservation(nats: str | None, fn: Any) -> Any:
    from oneplus_queueing.advance import AdvanceReservationError

    return call(nats, fn, (AdvanceReservationError,))
