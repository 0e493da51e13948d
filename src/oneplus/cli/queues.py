"""`oneplus queues`: list the queues, show one, apply a queue file (the OnePlus config or Kueue objects).

`apply` stores the config in the `queues` KV bucket, which the intake, the placement-solver and the preemption
service follow: no restart. The file is read and checked here first, so a bad file changes nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from .calls import call, fail
from .render import Columns, error_console, print_lines

if TYPE_CHECKING:
    from oneplus_queueing.queuefile import QueueFile

    from ..client import OnePlusClient

app = typer.Typer(
    help="Queues: list, show one, apply a queue file (OnePlus or Kueue YAML).", invoke_without_command=True
)
console = Console()
err = error_console()
NatsOpt = Annotated[str | None, typer.Option("--nats", envvar="NATS_URL", help="NATS server URL")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON")]
COLUMNS = (
    ("QUEUE", "queue"),
    ("GUARANTEE", "guarantee_gpus"),
    ("LIMIT", "limit_gpus"),
    ("USED", "used_gpus"),
    ("BORROWED", "borrowed_gpus"),
    ("PENDING", "pending_gpus"),
    ("FAIR-SHARE", "fairshare"),
    ("PLACEMENT", "placement"),
    ("QUEUEING", "queueing"),
)


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)


def _parent(ctx: typer.Context, as_json: bool, nats: str | None) -> tuple[bool, str | None]:
    obj = ctx.obj if isinstance(ctx.obj, dict) else {}
    return as_json or bool(obj.get("json")), nats or obj.get("nats")


async def _rows(c: OnePlusClient) -> list[dict[str, Any]]:
    from ..client import subjects

    rows: list[dict[str, Any]] = await c.ops(f"{subjects.PREFIX}.ops.queues.list", {})
    return rows


def _print_rows(rows: list[dict[str, Any]]) -> None:
    t = Columns("queues", tuple(h for h, _ in COLUMNS))
    for r in rows:
        name = "  " * int(r.get("depth", 0)) + str(r["queue"])
        t.add_row(name, *(_fmt(r.get(key)) for _, key in COLUMNS[1:]))
    t.print(console)


@app.callback()
def queues(ctx: typer.Context, nats: NatsOpt = None, as_json: JsonOpt = False) -> None:
    """Per queue: guarantee, borrow limit, GPUs used and borrowed, pending, fair-share factor, placement policy and
    queueing strategy (the same as `oneplus queues list`)."""
    if ctx.invoked_subcommand is not None:
        ctx.obj = {"json": as_json, "nats": nats}  # `queues --json show X` means `queues show X --json`
        return
    queues_list(ctx, nats, as_json)


@app.command("list")
def queues_list(ctx: typer.Context, nats: NatsOpt = None, as_json: JsonOpt = False) -> None:
    """Every queue, organisations before their teams, with its use now."""
    as_json, nats = _parent(ctx, as_json, nats)
    rows = call(nats, _rows)
    if as_json:
        print(json.dumps(rows, indent=2, default=str))
        return
    _print_rows(rows)


@app.command("show")
def queues_show(ctx: typer.Context, name: str, nats: NatsOpt = None, as_json: JsonOpt = False) -> None:
    """One queue: its settings as configured (path, guarantee, borrow limit, GPU models...), its use now, and where
    the config comes from (the `queues` bucket, or the services' own file or default)."""
    as_json, nats = _parent(ctx, as_json, nats)

    async def go(c: OnePlusClient) -> tuple[list[dict[str, Any]], str | None]:
        return await _rows(c), await c.queue_config_text()

    rows, stored = call(nats, go)
    row = next((r for r in rows if r.get("queue") == name), None)
    if row is None:
        known = ", ".join(str(r.get("queue")) for r in rows) or "none"
        raise fail(f"no queue {name!r}; known queues: {known}")
    spec: dict[str, Any] | None = None
    path: list[str] = []
    if stored is not None:
        from oneplus_queueing import QueueConfigError, load_queue_config

        try:
            config = load_queue_config(stored)
            spec = config.queue(name).model_dump(mode="json")
            path = list(config.path(name))
            spec["gpu_models_in_effect"] = config.queue_models(name)
            spec["children"] = config.children(name)
        except QueueConfigError:
            spec = None  # the solver's rows still say what it runs with
    source = "the `queues` bucket (oneplus queues apply)" if stored is not None else "the services' own config"
    doc = {"queue": name, "path": path, "config": spec, "now": row, "source": source}
    if as_json:
        print(json.dumps(doc, indent=2, default=str))
        return
    _print_rows([{**row, "depth": 0}])
    lines = [f"config from {source}"]
    if spec is not None:
        lines.append(f"path: {' / '.join(path)}")
        if spec.get("children"):
            lines.append(f"teams: {', '.join(spec['children'])} (jobs are queued on those)")
        models = spec.get("gpu_models_in_effect")
        lines.append(f"GPU models: {', '.join(models) if models else 'any'}")
        lines.append(f"weight: {spec.get('weight')}")
        if spec.get("description"):
            lines.append(f"description: {spec['description']}")
    print_lines(console, "\n".join(lines))


def read_queue_file(file: Path) -> QueueFile:
    """The file read and checked, or one error line per problem (exit 2); a note line per field not used."""
    from oneplus_queueing import QueueConfigError
    from oneplus_queueing.queuefile import load_queue_file

    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise fail(f"cannot read {file}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise fail(f"{file}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    from rich.markup import escape

    try:
        qf = load_queue_file(text, filename=str(file))
    except QueueConfigError as exc:
        for line in str(exc).splitlines():
            err.print(f"[red]error:[/] {escape(line)}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    for note in qf.notes:  # fields read and not used: one line each, on stderr
        err.print(f"[yellow]note:[/] {escape(note)}", highlight=False, soft_wrap=True)
    return qf


def apply_queue_file(nats: str | None, qf: QueueFile) -> None:
    """Store the file's config in the `queues` bucket (the services follow it)."""
    call(nats, lambda c: c.put_queue_config(qf.yaml_text))


@app.command("apply")
def queues_apply(
    ctx: typer.Context,
    file: Annotated[Path, typer.Option("-f", "--file", help="A OnePlus queue config or Kueue objects (YAML)")],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Check and print the config; store nothing")] = False,
    nats: NatsOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Replace the queue config with FILE: the `ONEPLUS_QUEUES_FILE` format, or Kueue ClusterQueue, LocalQueue,
    ResourceFlavor, Cohort and WorkloadPriorityClass objects (docs/queueing.md). Running and queued jobs keep
    their queue; a queue they name that is gone makes them wait with InvalidQueue."""
    as_json, nats = _parent(ctx, as_json, nats)
    qf = read_queue_file(file)
    leaves = qf.config.leaf_queues()
    summary = {
        "file": str(file),
        "format": qf.kind,
        "queues": [q.name for q in qf.config.queues],
        "leaf_queues": leaves,
        "stored": not dry_run,
        "notes": qf.notes,
        "config": qf.yaml_text,
    }
    if not dry_run:
        apply_queue_file(nats, qf)
    if as_json:
        print(json.dumps(summary, indent=2))
        return
    if dry_run:
        print_lines(console, qf.yaml_text.rstrip())
    verb = "checked (nothing stored)" if dry_run else "applied"
    what = "Kueue objects" if qf.kind == "kueue" else "queue config"
    print_lines(
        console,
        f"{verb}: {what} from {file}: {len(qf.config.queues)} queues; jobs go to {', '.join(leaves)}",
    )
