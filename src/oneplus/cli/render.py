"""Rich renderings shared by several commands."""

from __future__ import annotations

import time

from oneplus_contracts import JobRecord, NodeRecord
from rich.console import Console
from rich.table import Table


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


def nodelist(rec: JobRecord) -> str:
    if rec.allocation is None:
        return ""
    return ",".join(rec.allocation.nodes)


def jobs_table(jobs: list[JobRecord], title: str = "jobs") -> Table:
    t = Table(title=title)
    for col in ("JOBID", "NAME", "TEAM", "QUEUE", "PRIO", "GPUS", "STATE", "TIME", "NODES / REASON"):
        t.add_column(col)
    now = time.time()
    for r in jobs:
        elapsed = (r.finished_ts or now) - (r.started_ts or r.submitted_ts)
        where = nodelist(r) or (r.reason or "")
        style = STATE_STYLE.get(r.state, "")
        t.add_row(
            r.job_id,
            r.spec.name,
            r.spec.team,
            r.spec.queue,
            str(r.spec.priority),
            f"{r.spec.total_gpus:g}",
            f"[{style}]{r.state}[/]" if style else r.state,
            f"{elapsed:.1f}s",
            where,
        )
    return t


def nodes_table(nodes: list[NodeRecord], used: dict[str, int] | None = None) -> Table:
    from oneplus_topology.analysis import nvlink_groups

    t = Table(title="nodes")
    for col in ("NODE", "LEAF", "SPINE", "MODEL", "GPUS FREE/TOTAL", "NVLINK", "STATUS", "HEALTH"):
        t.add_column(col)
    for n in nodes:
        topo = n.topology
        total = len(topo.gpus)
        free = total - (used or {}).get(topo.node, 0)
        groups = nvlink_groups(topo)
        biggest = max((len(g) for g in groups), default=0)
        degraded = [g.index for g in topo.gpus if g.nvlinks_active < g.nvlinks_total]
        nv = "none (PCIe)" if biggest <= 1 else f"{len(groups)} group(s), largest {biggest}"
        if degraded:
            nv += f" [red]degraded GPU {degraded}[/]"
        health = "ok" if not n.unhealthy_gpus and n.engine_ok else (n.reason or f"unhealthy GPUs {n.unhealthy_gpus}")
        status = n.status + (" (cordoned)" if n.cordoned and n.status != "cordoned" else "")
        t.add_row(topo.node, topo.leaf or "-", topo.spine or "-", topo.gpu_model, f"{free}/{total}", nv, status, health)
    return t
