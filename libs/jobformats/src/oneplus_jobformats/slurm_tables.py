"""squeue and sinfo tables in Slurm's default formats, computed from job and node records.

squeue: `%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R`; sinfo: `%#P %.5a %.10l %.6D %.6t %N` (squeue(1), sinfo(1)).
A field wider than its column is cut, as Slurm does; the last column is never cut.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from oneplus_contracts import ACTIVE_STATES, TERMINAL_STATES, JobRecord, NodeRecord
from oneplus_contracts.arrays import compact
from oneplus_contracts.slurm import STATE_CODES, compress_hostlist, format_elapsed

SQUEUE_COLUMNS = (("JOBID", 18), ("PARTITION", 9), ("NAME", 8), ("USER", 8), ("ST", 2), ("TIME", 10), ("NODES", 6))
_SLUG = re.compile(r"[^a-z0-9]+")


def _cell(text: str, width: int) -> str:
    return text[:width].rjust(width)


@dataclass(frozen=True)
class SqueueRow:
    job_id: str
    partition: str
    name: str
    user: str
    state: str
    time: str
    nodes: int
    nodelist_reason: str

    def line(self) -> str:
        cells = (self.job_id, self.partition, self.name, self.user, self.state, self.time, str(self.nodes))
        return (
            " ".join(_cell(c, w) for c, (_, w) in zip(cells, SQUEUE_COLUMNS, strict=True)) + " " + self.nodelist_reason
        )


def squeue_row(record: JobRecord, *, now: float) -> SqueueRow:
    """One job as squeue shows it: nodes and hostlist once placed, `(reason)` while waiting."""
    started = record.started_ts
    end = record.finished_ts if record.terminal and record.finished_ts else now
    elapsed = (
        (end - started) if started is not None and record.state in {"RUNNING", "PREEMPTING", *TERMINAL_STATES} else 0
    )
    if record.allocation is not None and record.state in {*ACTIVE_STATES, *TERMINAL_STATES}:
        nodes = record.allocation.nodes
        where = compress_hostlist(nodes)
        count = len(nodes)
    else:
        where = f"({record.reason or 'None'})"
        count = record.spec.ranks  # each rank sits on one node: the most nodes the job can take
    return SqueueRow(
        job_id=record.job_id,
        partition=record.spec.queue,
        name=record.spec.name,
        user=record.spec.user,
        state=STATE_CODES[record.state],
        time=format_elapsed(elapsed),
        nodes=count,
        nodelist_reason=where,
    )


def render_squeue(records: Iterable[JobRecord], *, now: float, include_finished: bool = False) -> str:
    """The squeue table; like squeue, finished jobs are left out unless asked for."""
    header = " ".join(_cell(n, w) for n, w in SQUEUE_COLUMNS) + " NODELIST(REASON)"
    shown = [r for r in records if include_finished or not r.terminal]
    shown.sort(key=lambda r: (r.state not in ACTIVE_STATES, -r.spec.priority, r.submitted_ts))
    return "\n".join([header, *(squeue_row(r, now=now).line() for r in shown)])


def fold_pending_tasks(records: Sequence[JobRecord]) -> tuple[list[JobRecord], dict[str, str]]:
    """squeue's view of arrays: of each array's pending tasks only the first (in `records`' order) is kept, and
    `{its job id: "j-abc_[7-999%50]"}` names them all; an array with one pending task keeps that task's id."""
    pending: dict[str, list[int]] = defaultdict(list)
    for r in records:
        task = r.spec.array_task
        if task is not None and r.state in ("SUBMITTED", "ACCEPTED"):
            pending[task.array_job_id].append(task.task_id)
    kept: list[JobRecord] = []
    names: dict[str, str] = {}
    seen: set[str] = set()
    for r in records:
        task = r.spec.array_task
        if task is None or r.state not in ("SUBMITTED", "ACCEPTED") or len(pending[task.array_job_id]) < 2:
            kept.append(r)
            continue
        if task.array_job_id in seen:
            continue
        seen.add(task.array_job_id)
        limit = f"%{task.max_running}" if task.max_running else ""
        names[r.job_id] = f"{task.array_job_id}_[{compact(sorted(pending[task.array_job_id]))}{limit}]"
        kept.append(r)
    return kept, names


def partition_of(node: NodeRecord) -> str:
    """A node's partition: its `partition` label, else its GPU model (`h100`), else `gpu`."""
    label = node.topology.labels.get("partition")
    if label:
        return label
    slug = _SLUG.sub("-", node.topology.gpu_model.lower()).strip("-")
    for model in ("gb200", "h200", "h100", "a800", "a100", "l40s", "l40", "v100", "rtx4090", "4090"):
        if model in slug:
            return model
    return slug if slug and slug != "unknown" else "gpu"


def node_state(node: NodeRecord, used_gpus: int) -> str:
    """sinfo's short state names: idle, mix, alloc, drng, drain, down, down* (not responding)."""
    if node.status == "lost":
        return "down*"
    if node.status == "unhealthy" or not node.engine_ok:
        return "down"
    if node.draining or node.status == "draining":
        return "drng" if used_gpus else "drain"
    if node.cordoned or node.status == "cordoned":
        return "drain"
    total = len(node.topology.gpus)
    if used_gpus == 0:
        return "idle"
    return "alloc" if used_gpus >= total else "mix"


def gpus_in_use(jobs: Iterable[JobRecord]) -> dict[str, int]:
    """Per node, how many distinct GPUs running or placed jobs hold."""
    held: dict[str, set[int]] = defaultdict(set)
    for job in jobs:
        if job.state in ACTIVE_STATES and job.allocation is not None:
            for rank in job.allocation.ranks:
                held[rank.node].update(rank.gpus)
    return {node: len(gpus) for node, gpus in held.items()}


_STATE_ORDER = ("mix", "alloc", "idle", "drng", "drain", "down", "down*")


def render_sinfo(
    nodes: Iterable[NodeRecord], jobs: Iterable[JobRecord] = (), partitions: Sequence[str] | None = None
) -> str:
    """One line per partition and node state, with the nodes as a compressed hostlist.

    With `partitions` (the queues, in the site's names: what `sbatch -p` takes) every node is in every partition,
    as every OnePlus queue may use every node; without, a node's partition is its label or GPU model."""
    used = gpus_in_use(jobs)
    groups: dict[tuple[str, str], list[str]] = defaultdict(list)
    for node in nodes:
        name = node.topology.node
        state = node_state(node, used.get(name, 0))
        for partition in partitions if partitions is not None else [partition_of(node)]:
            groups[(partition, state)].append(name)
    width = max([len("PARTITION"), *(len(p) for p, _ in groups)])
    lines = [f"{'PARTITION'.ljust(width)} {'AVAIL':>5} {'TIMELIMIT':>10} {'NODES':>6} {'STATE':>6} NODELIST"]
    order = {s: i for i, s in enumerate(_STATE_ORDER)}
    for (partition, state), names in sorted(groups.items(), key=lambda kv: (kv[0][0], order.get(kv[0][1], 99))):
        lines.append(
            f"{partition.ljust(width)} {'up':>5} {'infinite':>10} {len(names):>6} {state:>6} {compress_hostlist(names)}"
        )
    return "\n".join(lines)
