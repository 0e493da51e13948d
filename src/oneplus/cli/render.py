"""Renderings shared by several commands: tables that never cut an id or a state, and the one wording of why a
pending job waits.

Start-up time matters here (every command imports this module): no pydantic model is imported at module level.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from oneplus_contracts import JobRecord, NodeRecord


def error_console() -> Console:
    """Stderr for errors: never folded, so a long path or job id stays one greppable, copyable line."""
    return Console(stderr=True, soft_wrap=True)


STATE_STYLE = {
    "ACCEPTED": "yellow",
    "PLACED": "cyan",
    "STARTING": "cyan",
    "RUNNING": "green",
    "PREEMPTING": "magenta",
    "CHECKPOINTED": "magenta",
    "SUCCEEDED": "bold green",
    "FAILED": "bold red",
    "CANCELLED": "dim",
    "REJECTED": "red",
}

PENDING_STATES = frozenset({"SUBMITTED", "ACCEPTED"})


def pending_reason(reason: str | None = None, message: str | None = None) -> str:
    """Why a pending job waits, in one word, the same for `queue`, `squeue`, `jobs show` and the dashboard: the
    solver's reason code (Slurm's names: Priority, Resources, Topology, QuotaExceeded, Preempting, InvalidQueue,
    Dependency, DependencyNeverSatisfied, BadConstraints)
    from its queue rows (`reason`) or its `explain` answer; before the solver has decided anything, "None", as
    Slurm shows it. `message` (the long form) is never needed for the word and is shown beside it where there is
    room (`jobs show`)."""
    code = (reason or "").strip()
    return code or "None"


def reason_cell(row: Mapping[str, Any]) -> str:
    """`(Topology)`: the NODELIST(REASON) cell of a pending job, from a queue row or an explain answer."""
    return f"({pending_reason(row.get('reason'), row.get('message'))})"


class Columns:
    """A table whose cells are never cut: a rich table on a terminal wide enough for every cell, plain aligned
    columns otherwise (piped, redirected, or a narrow terminal; one line a row, for grep and awk)."""

    def __init__(self, title: str, header: Sequence[str]) -> None:
        self.title = title
        self.header = tuple(header)
        self.rows: list[tuple[str, ...]] = []
        self.styles: list[tuple[str, ...]] = []

    def add_row(self, *cells: str, styles: Mapping[int, str] | None = None) -> None:
        if len(cells) != len(self.header):
            raise ValueError(f"{len(cells)} cells for {len(self.header)} columns")
        self.rows.append(tuple(cells))
        self.styles.append(tuple((styles or {}).get(i, "") for i in range(len(cells))))

    def widths(self) -> list[int]:
        return [max(len(c) for c in col) for col in zip(self.header, *self.rows, strict=True)]

    def plain(self) -> str:
        widths = self.widths()
        lines = [self.header, *self.rows]
        return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in lines)

    def rich(self) -> Table:
        t = Table(title=self.title)
        for name, width in zip(self.header, self.widths(), strict=True):
            t.add_column(name, no_wrap=True, min_width=width)
        for cells, styles in zip(self.rows, self.styles, strict=True):
            t.add_row(*((f"[{s}]{_escape(c)}[/]" if s else _escape(c)) for c, s in zip(cells, styles, strict=True)))
        return t

    def fits(self, console: Console) -> bool:
        borders = 3 * len(self.header) + 1  # rich's box: "│ " + " │ " between + " │"
        return console.is_terminal and sum(self.widths()) + borders <= console.width

    def print(self, console: Console) -> None:
        if self.fits(console):
            console.print(self.rich())
        else:
            console.print(self.plain(), markup=False, highlight=False, soft_wrap=True, crop=False)


def print_whole(console: Console, renderable: Any) -> None:
    """Print a rich renderable (a table) with no line cut: as it is when the terminal is wide enough, else (piped,
    redirected, or a narrow terminal) at its natural width, however long its lines, as `Columns` does."""
    from rich.measure import Measurement

    natural = Measurement.get(console, console.options.update(max_width=100_000), renderable).maximum
    if console.is_terminal and natural <= console.width:
        console.print(renderable)
        return
    wide = Console(
        file=console.file,
        width=max(natural, console.width),
        force_terminal=console.is_terminal,
        no_color=console.no_color,
        color_system=console.color_system if console.color_system else None,  # type: ignore[arg-type]
    )
    wide.print(renderable, crop=False)


def print_lines(console: Console, text: str) -> None:
    """Plain text lines (a caption, notes) never folded nor cut: a long line stays one line for grep."""
    console.print(text, markup=False, highlight=False, soft_wrap=True, crop=False)


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


JOB_HEADER = ("JOBID", "NAME", "USER", "TEAM", "QUEUE", "PRIO", "GPUS", "STATE", "TIME", "NODES / REASON")


def _job_dict(job: JobRecord | Mapping[str, Any]) -> Mapping[str, Any]:
    return job if isinstance(job, Mapping) else job.model_dump(mode="json")


def job_nodes(job: Mapping[str, Any]) -> list[str]:
    """The nodes of a job's allocation, in rank order, each once."""
    alloc = job.get("allocation") or {}
    seen: dict[str, None] = {}
    for r in alloc.get("ranks") or []:
        seen.setdefault(str(r.get("node")), None)
    return list(seen)


def job_gpus(job: Mapping[str, Any]) -> float:
    spec = job.get("spec") or {}
    return float(spec.get("ranks", 1)) * float((spec.get("resources") or {}).get("gpus", 0))


def jobs_columns(
    jobs: Iterable[JobRecord | Mapping[str, Any]],
    title: str = "jobs",
    reasons: Mapping[str, str] | None = None,
) -> Columns:
    """Jobs as a table. `reasons`: job id → `pending_reason(...)` for pending jobs, from the solver; a pending job
    it does not name shows its record's reason word, else `(None)`."""
    cols = Columns(title, JOB_HEADER)
    now = time.time()
    for job in jobs:
        d = _job_dict(job)
        spec = d.get("spec") or {}
        state = str(d.get("state", ""))
        started = d.get("started_ts") or d.get("submitted_ts") or now
        elapsed = (d.get("finished_ts") or now) - started
        nodes = job_nodes(d)
        if nodes:
            where = ",".join(nodes)
        elif state in PENDING_STATES:
            where = f"({(reasons or {}).get(str(d.get('job_id')), pending_reason(None))})"
        else:
            where = str(d.get("reason") or "")
        cols.add_row(
            str(d.get("job_id", "")),
            str(spec.get("name", "")),
            str(spec.get("user", "")),
            str(spec.get("team", "")),
            str(spec.get("queue", "")),
            str(spec.get("priority", "")),
            f"{job_gpus(d):g}",
            state,
            f"{elapsed:.1f}s",
            where,
            styles={7: STATE_STYLE.get(state, "")},
        )
    return cols


def jobs_table(jobs: list[JobRecord], title: str = "jobs") -> Table:
    """The rich table of `jobs` (for live views on a terminal); `jobs_columns(...).print(console)` to print."""
    return jobs_columns(jobs, title).rich()


def nodelist(rec: JobRecord) -> str:
    if rec.allocation is None:
        return ""
    return ",".join(rec.allocation.nodes)


@dataclass(frozen=True)
class GpuCounts:
    """A node's GPUs counted as the dashboard counts them: held (by a job, whole or a share), free (healthy, held by
    nobody, on a schedulable node), shared (held by shares that leave room: a fractional job may still go there)."""

    total: int
    held: int
    free: int
    shared: int

    def cell(self) -> str:
        return f"{self.free}/{self.total}" + (f" ({self.shared} shared)" if self.shared else "")

    def as_dict(self) -> dict[str, int]:
        return {"gpus_total": self.total, "gpus_held": self.held, "gpus_free": self.free, "gpus_shared": self.shared}


def gpu_holds(jobs: Iterable[JobRecord]) -> dict[str, dict[int, int]]:
    """node → GPU → thousandths held (1000: whole), by the jobs holding GPUs now."""
    out: dict[str, dict[int, int]] = {}
    for j in jobs:
        if j.allocation is None or j.terminal:
            continue
        for r in j.allocation.ranks:
            on = out.setdefault(r.node, {})
            for g in r.gpus:
                on[g] = on.get(g, 0) + (r.gpu_milli or 1000)
    return out


def gpu_counts(node: NodeRecord, holds: Mapping[int, int]) -> GpuCounts:
    topo = node.topology
    held = [g.index for g in topo.gpus if holds.get(g.index)]
    shared = sum(1 for g in held if holds[g] < 1000)
    bad = set(node.unhealthy_gpus) | {g.index for g in topo.gpus if not g.healthy}
    free = 0
    if node.schedulable:
        free = sum(1 for g in topo.gpus if not holds.get(g.index) and g.index not in bad)
    return GpuCounts(len(topo.gpus), len(held), free, shared)


def nodes_columns(nodes: list[NodeRecord], holds: Mapping[str, Mapping[int, int]] | None = None) -> Columns:
    """`holds`: node → GPU → thousandths held (`gpu_holds`); a GPU partly held is not free, as on the dashboard."""
    from oneplus_topology.analysis import nvlink_groups

    cols = Columns("nodes", ("NODE", "LEAF", "SPINE", "MODEL", "GPUS FREE/TOTAL", "NVLINK", "STATUS", "HEALTH"))
    for n in nodes:
        topo = n.topology
        counts = gpu_counts(n, (holds or {}).get(topo.node, {}))
        groups = nvlink_groups(topo)
        biggest = max((len(g) for g in groups), default=0)
        degraded = [g.index for g in topo.gpus if g.nvlinks_active < g.nvlinks_total]
        nv = "none (PCIe)" if biggest <= 1 else f"{len(groups)} group(s), largest {biggest}"
        if degraded:
            nv += f" degraded GPU {degraded}"
        health = "ok" if not n.unhealthy_gpus and n.engine_ok else (n.reason or f"unhealthy GPUs {n.unhealthy_gpus}")
        status = n.status + (" (cordoned)" if n.cordoned and n.status != "cordoned" else "")
        cols.add_row(
            topo.node,
            topo.leaf or "-",
            topo.spine or "-",
            topo.gpu_model,
            counts.cell(),
            nv,
            status,
            health,
            styles={5: "red"} if degraded else None,
        )
    return cols


def nodes_table(nodes: list[NodeRecord], holds: Mapping[str, Mapping[int, int]] | None = None) -> Table:
    return nodes_columns(nodes, holds).rich()
