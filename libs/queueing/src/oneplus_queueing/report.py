"""The data behind `oneplus queue` (squeue-like) and `oneplus queues`; the CLI renders these rows.

`split_records` turns the `jobs` KV records into the cycle's inputs, so the service, the CLI and the simulator
describe the same queue the same way.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace

from oneplus_contracts import ACTIVE_STATES, JobRecord
from oneplus_contracts.slurm import STATE_CODES, compress_hostlist, format_elapsed

from .arrays import fold_pending_tasks
from .config import QueueConfig, QueueConfigError
from .fairshare import UsageHistory, fair_tree
from .model import PendingJob, PendingReason, RunningJob
from .quota import held_by_queue

QUEUE_HEADER = ("JOBID", "QUEUE", "NAME", "USER", "ST", "TIME", "GPUS", "NODELIST(REASON)")
QUEUES_HEADER = (
    "QUEUE",
    "GUARANTEE",
    "LIMIT",
    "USED",
    "BORROWED",
    "PENDING",
    "FAIRSHARE",
    "WEIGHT",
    "PLACEMENT",
    "QUEUEING",
)


def split_records(records: Sequence[JobRecord]) -> tuple[list[PendingJob], list[RunningJob]]:
    """Pending (ACCEPTED) and GPU-holding jobs of the `jobs` records; the rest hold nothing and wait for nothing."""
    pending: list[PendingJob] = []
    running: list[RunningJob] = []
    for rec in records:
        if rec.state == "ACCEPTED":
            pending.append(PendingJob.from_record(rec))
        elif rec.state in ACTIVE_STATES and rec.allocation is not None:
            running.append(RunningJob.from_record(rec))
    return pending, running


@dataclass(frozen=True, slots=True)
class QueueRow:
    job_id: str
    queue: str
    name: str
    user: str
    state: str  # squeue's two-letter code
    time_s: float  # time running; while pending, time waited since submission (squeue's 0:00 says nothing)
    gpus: float
    nodes: tuple[str, ...]
    reason: str | None  # pending only: Priority, Resources, Topology, QuotaExceeded, Preempting, InvalidQueue
    message: str

    def cells(self) -> tuple[str, ...]:
        where = compress_hostlist(self.nodes) if self.nodes else f"({self.reason or 'None'})"
        return (
            self.job_id,
            self.queue,
            self.name,
            self.user,
            self.state,
            format_elapsed(self.time_s),
            f"{self.gpus:g}",
            where,
        )

    def to_dict(self) -> dict[str, object]:
        d = asdict(self)
        d["nodes"] = list(self.nodes)
        return d


def queue_rows(
    now: float,
    records: Sequence[JobRecord],
    reasons: Mapping[str, PendingReason] | None = None,
    order: Sequence[str] = (),
) -> list[QueueRow]:
    """Jobs holding GPUs (by start time), then pending jobs in serving order (`order`, from the last cycle)."""
    reasons = reasons or {}
    rank = {job_id: i for i, job_id in enumerate(order)}
    active: list[tuple[tuple[float, str], QueueRow]] = []
    waiting: list[tuple[tuple[int, float, str], QueueRow]] = []
    # An array's pending tasks are one row (its first task's, renamed j-abc_[7-999%50]): no row is made for the rest.
    shown, folded = fold_pending_tasks(records, rank)
    for rec in records:
        if rec.terminal or rec.job_id in folded:
            continue  # finished or rejected jobs are not in the queue
        st = STATE_CODES[rec.state]
        spec = rec.spec
        if st == "PD" or st == "RQ":
            why = reasons.get(rec.job_id)
            row = QueueRow(
                rec.job_id,
                spec.queue,
                spec.name,
                spec.user,
                st,
                max(0.0, now - rec.submitted_ts),
                spec.total_gpus,
                (),
                why.code if why else None,
                why.message if why else (rec.reason or ""),
            )
            waiting.append(((rank.get(rec.job_id, len(rank)), rec.submitted_ts, rec.job_id), row))
        else:
            started = rec.started_ts if rec.started_ts is not None else rec.updated_ts
            nodes = tuple(rec.allocation.nodes) if rec.allocation else ()
            row = QueueRow(
                rec.job_id,
                spec.queue,
                spec.name,
                spec.user,
                st,
                max(0.0, now - started) if rec.state == "RUNNING" or rec.state == "PREEMPTING" else 0.0,
                spec.total_gpus,
                nodes,
                None,
                rec.reason or "",
            )
            active.append(((started, rec.job_id), row))
    rows = [r for _, r in sorted(active, key=lambda t: t[0])] + [r for _, r in sorted(waiting, key=lambda t: t[0])]
    return [replace(r, job_id=shown[r.job_id]) if r.job_id in shown else r for r in rows] if shown else rows


@dataclass(frozen=True, slots=True)
class QueuesRow:
    queue: str
    parent: str | None
    depth: int  # 0 for an organisation
    guarantee_gpus: float
    limit_gpus: float | None  # None: no borrow limit
    used_gpus: float
    borrowed_gpus: float
    pending_jobs: int
    pending_gpus: float
    fairshare: float | None  # Fair-Tree factor of a leaf queue; None for an organisation
    level_fs: float  # its share over its usage among its siblings; inf when it used nothing
    usage_gpu_hours: float  # decayed
    weight: float
    placement: str = "best-fit"  # the queue's placement policy: best-fit or fgd
    queueing: str = "best-effort-fifo"  # the queue's queueing strategy: best-effort-fifo or strict-fifo

    def cells(self) -> tuple[str, ...]:
        return (
            "  " * self.depth + self.queue,
            f"{self.guarantee_gpus:g}",
            "-" if self.limit_gpus is None else f"{self.limit_gpus:g}",
            f"{self.used_gpus:g}",
            f"{self.borrowed_gpus:g}",
            f"{self.pending_jobs} ({self.pending_gpus:g} GPUs)",
            "-" if self.fairshare is None else f"{self.fairshare:.3f}",
            f"{self.weight:g}",
            self.placement,
            self.queueing,
        )

    def to_dict(self) -> dict[str, object]:
        d = asdict(self)
        if math.isinf(self.level_fs):
            d["level_fs"] = None
        return d


def queues_rows(
    now: float,
    config: QueueConfig,
    pending: Sequence[PendingJob],
    running: Sequence[RunningJob],
    usage: UsageHistory,
) -> list[QueuesRow]:
    """One row per queue, organisations before their teams."""
    held = held_by_queue(running, config)
    waiting: dict[str, list[float]] = {q.name: [] for q in config.queues}
    for job in pending:
        try:
            path = config.path(job.queue)
        except QueueConfigError:
            continue
        for q in path:
            waiting[q].append(job.gpus)
    decayed = usage.usage_at(now)
    tree_usage: dict[str, float] = {q.name: 0.0 for q in config.queues}
    for leaf, u in decayed.items():
        if leaf in tree_usage:
            for q in config.path(leaf):
                tree_usage[q] += u
    fair = fair_tree(config, decayed)
    rows: list[QueuesRow] = []

    def visit(parent: str | None, depth: int) -> None:
        for name in config.children(parent):
            spec = config.queue(name)
            leaf = config.is_leaf(name)
            rows.append(
                QueuesRow(
                    queue=name,
                    parent=parent,
                    depth=depth,
                    guarantee_gpus=spec.guarantee_gpus,
                    limit_gpus=None if math.isinf(spec.limit_gpus) else spec.limit_gpus,
                    used_gpus=held[name],
                    borrowed_gpus=max(0.0, held[name] - spec.guarantee_gpus),
                    pending_jobs=len(waiting[name]),
                    pending_gpus=sum(waiting[name]),
                    fairshare=fair[name].factor if leaf else None,
                    level_fs=fair[name].level_fs,
                    usage_gpu_hours=tree_usage[name] / 3600.0,
                    weight=spec.weight,
                    placement=spec.placement,
                    queueing=spec.queueing,
                )
            )
            visit(name, depth + 1)

    visit(None, 0)
    return rows
