"""Trace loaders: Philly, Tiresias job lists and Alibaba openb pod lists become `SimJob`s.

Traces carry neither priorities, checkpoint intervals nor communication fractions; `TraceRules`
assigns them with a seeded, documented rule that is printed in every report.
"""

from __future__ import annotations

import csv
import datetime as dt
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path


class TraceError(ValueError):
    """A trace file that cannot be read, with the file and line that failed."""


@dataclass(slots=True)
class SimJob:
    """One gang from a trace: what it asks for and how it behaves, plus its mutable progress."""

    job_id: str
    submit_s: float
    duration_s: float
    gpus: float
    vc: str = "default"
    cpus: float = 0.0
    memory_mb: int = 0
    gpu_milli: int = 0
    gpu_models: tuple[str, ...] | None = None
    qos: str | None = None
    exclusive: bool = False  # sbatch --exclusive: its nodes are held whole
    # Assigned by TraceRules.apply
    ranks: int = 1
    gpus_per_rank: int = 0
    priority: int = 0
    priority_class: str = "normal"
    preemptible: bool = True
    checkpoint_interval_s: float | None = None
    comm_fraction: float = 0.0
    # GPUs per tensor-parallel group (TraceRules.tp_groups); 0: no TP group, one ring over the whole job
    tp_group: int = 0
    # Set by estimates.assign_time_limits; None: the run time itself (oracle)
    time_limit_s: float | None = None
    # Progress, in seconds of ideal (trace) run time
    done_s: float = 0.0
    saved_s: float = 0.0
    order: int = 0
    extra: dict[str, float] = field(default_factory=dict)
    # Set by oneplus_sim.elastic.make_elastic: the rank range of an elastic gang (0: a fixed gang); `ranks` is then
    # the count it runs with now, and it works at ranks / elastic_max of its full speed.
    elastic_min: int = 0
    elastic_max: int = 0
    one_node: bool = False  # its ranks stay on one node: a one-node job the elastic rule split into ranks

    @property
    def speed(self) -> float:
        """Share of its full-size progress rate: linear in its ranks (an assumption of the elastic rule)."""
        return self.ranks / self.elastic_max if self.elastic_max else 1.0

    @property
    def whole_gpus(self) -> int:
        return int(self.gpus) if self.gpu_milli == 0 else 0

    @property
    def limit_s(self) -> float:
        """The time limit schedulers see: the requested one, or the run time when none was assigned (oracle)."""
        return self.time_limit_s if self.time_limit_s is not None else self.duration_s

    @property
    def remaining_s(self) -> float:
        return max(self.duration_s - self.done_s, 0.0)

    @property
    def is_multi_gpu(self) -> bool:
        return self.gpu_milli == 0 and self.gpus >= 2


PRIORITY_CLASSES: dict[str, int] = {"low": 0, "normal": 50, "high": 100}


@dataclass(frozen=True)
class TraceRules:
    """The seeded rule that gives trace jobs what traces lack. Every field is printed in the report."""

    seed: int = 0
    class_shares: tuple[float, float, float] = (0.3, 0.5, 0.2)
    checkpoint_share: float = 0.8
    checkpoint_interval_s: float = 1800.0
    comm_fraction_small: tuple[float, float] = (0.1, 0.3)
    comm_fraction_multi_node: tuple[float, float] = (0.3, 0.5)
    # Give jobs of >= 8 GPUs tensor-parallel groups (TP_GROUP_SIZES), as on an NVL72 cluster (`--tp-groups`).
    tp_groups: bool = False

    def describe(self) -> dict[str, str]:
        low, normal, high = self.class_shares
        tp = (
            {
                "tp_groups": (
                    f"a job of N GPUs gets a tensor-parallel group of G GPUs, G drawn uniformly (Random(seed/tp/job)) "
                    f"from the two largest of {list(TP_GROUP_SIZES)} that divide N (N=8: 8; N=16: 8 or 16; N=24: 8; "
                    f"N>=32 and a multiple of 32: 16 or 32); jobs with no such divisor (N<8, N=12) have none"
                )
            }
            if self.tp_groups
            else {}
        )
        return tp | {
            "seed": str(self.seed),
            "priority": (
                f"per virtual cluster (Philly `cluster`, Tiresias: all one VC): VCs sorted by name are shuffled by "
                f"Random(seed) and cut in order into low/normal/high with shares {low}/{normal}/{high} of VCs "
                f"(at least one VC normal); openb pods use their QoS instead: BE=low, Burstable=normal, LS=high. "
                f"Priority values {PRIORITY_CLASSES}; high is not preemptible"
            ),
            "checkpoint": (
                f"low and normal jobs checkpoint every {self.checkpoint_interval_s:.0f} s of progress with probability "
                f"{self.checkpoint_share} (Random(seed, job)), otherwise never (a preemption loses all progress)"
            ),
            "ranks": (
                "a job of N GPUs is one rank when N fits in the largest node (G GPUs); otherwise ranks of the largest "
                "divisor of N that is <= G GPUs each (N=32, G=8: 4 ranks of 8); fractional pods are one rank"
            ),
            "comm_fraction": (
                f"f ~ Uniform{self.comm_fraction_small} for multi-GPU jobs that fit in one node, "
                f"Uniform{self.comm_fraction_multi_node} for jobs spanning nodes, 0 for one GPU or less "
                f"(Random(seed, job)); an assumption, not a measurement"
            ),
        }

    def apply(self, jobs: Sequence[SimJob], node_gpus: int) -> None:
        """Assign ranks, priority, checkpointing and the communication fraction, in place."""
        if node_gpus < 1:
            raise TraceError("the cluster has no GPU node: cannot split trace jobs into ranks")
        vc_class = self._vc_classes(sorted({j.vc for j in jobs}))
        for job in jobs:
            ranks, per_rank = split_ranks(job, node_gpus)
            job.ranks, job.gpus_per_rank = ranks, per_rank
            cls = _QOS_CLASS.get(job.qos or "") or vc_class.get(job.vc, "normal")
            job.priority_class, job.priority = cls, PRIORITY_CLASSES[cls]
            job.preemptible = cls != "high"
            rng = random.Random(f"{self.seed}/{job.job_id}")
            checkpoints = job.preemptible and rng.random() < self.checkpoint_share
            job.checkpoint_interval_s = self.checkpoint_interval_s if checkpoints else None
            lo, hi = self.comm_fraction_multi_node if ranks > 1 else self.comm_fraction_small
            job.comm_fraction = rng.uniform(lo, hi) if job.is_multi_gpu else 0.0
            if self.tp_groups:
                job.tp_group = tp_group_of(job, self.seed)

    def _vc_classes(self, vcs: list[str]) -> dict[str, str]:
        rng = random.Random(f"{self.seed}/vc")
        order = list(vcs)
        rng.shuffle(order)
        n = len(order)
        n_low = round(self.class_shares[0] * n)
        n_high = round(self.class_shares[2] * n)
        if n_low + n_high >= n:
            n_low = max(0, min(n_low, n - 1 - n_high))
            n_high = max(0, min(n_high, n - 1 - n_low))
        out: dict[str, str] = {}
        for i, vc in enumerate(order):
            out[vc] = "low" if i < n_low else ("high" if i >= n - n_high else "normal")
        return out


_QOS_CLASS = {"BE": "low", "Burstable": "normal", "LS": "high"}

TP_GROUP_SIZES = (8, 16, 32)  # the TP degrees of issue 41: inside one NVL72 rack, spanning 2 to 8 trays


def tp_group_of(job: SimJob, seed: int) -> int:
    """GPUs per TP group of `job` under the `tp_groups` rule: one of the two largest sizes that divide it, drawn from
    Random(seed/tp/job) (its own stream, so turning the rule on changes nothing else); 0 when none divides it."""
    n = job.whole_gpus
    fits = [g for g in TP_GROUP_SIZES if n and n % g == 0]
    if not fits:
        return 0
    return random.Random(f"{seed}/tp/{job.job_id}").choice(fits[-2:])


def split_ranks(job: SimJob, node_gpus: int) -> tuple[int, int]:
    """(ranks, GPUs per rank): one rank if it fits in a node, else ranks of the largest divisor <= node_gpus."""
    if job.gpu_milli or job.gpus <= node_gpus:
        return 1, job.whole_gpus
    n = job.whole_gpus
    per = max(d for d in range(1, node_gpus + 1) if n % d == 0)
    return n // per, per


@dataclass
class Trace:
    jobs: list[SimJob]
    source: str
    dropped: dict[str, int] = field(default_factory=dict)


def load_trace(path: Path | str) -> Trace:
    """Read Philly, Tiresias or openb, recognised by the header line."""
    p = Path(path)
    if not p.is_file():
        raise TraceError(f"{p}: no such trace file")
    with p.open(newline="") as fh:
        header = fh.readline().strip().lstrip("\ufeff")
    cols = {c.strip() for c in header.split(",")}
    if {"timestamp", "duration", "num_gpus"} <= cols:
        return _load_philly(p)
    if {"job_id", "num_gpu", "submit_time", "duration"} <= cols:
        return _load_tiresias(p)
    if {"name", "num_gpu", "gpu_milli", "creation_time"} <= cols:
        return _load_openb(p)
    raise TraceError(
        f"{p}: unknown trace format (header {header!r}); expected Philly (timestamp,duration,num_gpus,...), "
        "Tiresias (job_id,num_gpu,submit_time,...,duration) or openb (name,cpu_milli,...,gpu_milli,...)"
    )


def _rows(p: Path) -> list[tuple[int, dict[str, str]]]:
    with p.open(newline="") as fh:
        return [(i + 2, row) for i, row in enumerate(csv.DictReader(fh))]


def _num(p: Path, line: int, row: dict[str, str], key: str) -> float:
    raw = (row.get(key) or "").strip()
    try:
        return float(raw)
    except ValueError:
        raise TraceError(f"{p}:{line}: column {key!r} must be a number, got {raw!r}") from None


def _load_philly(p: Path) -> Trace:
    jobs: list[SimJob] = []
    dropped = 0
    for line, row in _rows(p):
        try:
            ts = dt.datetime.fromisoformat(row["timestamp"].strip()).timestamp()
        except (KeyError, ValueError, AttributeError):
            raise TraceError(f"{p}:{line}: bad timestamp {row.get('timestamp')!r}") from None
        duration, gpus = _num(p, line, row, "duration"), _num(p, line, row, "num_gpus")
        if gpus < 1 or gpus != int(gpus) or duration < 0:
            raise TraceError(f"{p}:{line}: num_gpus must be a whole number >= 1 and duration >= 0")
        if duration == 0:
            dropped += 1
            continue
        jobs.append(SimJob(f"philly-{line - 2}", ts, duration, gpus, vc=(row.get("cluster") or "default").strip()))
    return Trace(_order(jobs), "philly", {"zero_duration": dropped})


def _load_tiresias(p: Path) -> Trace:
    jobs: list[SimJob] = []
    for line, row in _rows(p):
        gpus, submit, duration = (_num(p, line, row, k) for k in ("num_gpu", "submit_time", "duration"))
        if gpus < 1 or gpus != int(gpus) or duration <= 0:
            raise TraceError(f"{p}:{line}: num_gpu must be a whole number >= 1 and duration > 0")
        jobs.append(SimJob(f"tiresias-{row['job_id'].strip()}", submit, duration, gpus))
    return Trace(_order(jobs), "tiresias")


def _load_openb(p: Path) -> Trace:
    jobs: list[SimJob] = []
    dropped = 0
    for line, row in _rows(p):
        n_gpu, milli = _num(p, line, row, "num_gpu"), _num(p, line, row, "gpu_milli")
        created, deleted = _num(p, line, row, "creation_time"), _num(p, line, row, "deletion_time")
        sched_raw = (row.get("scheduled_time") or "").strip()
        started = float(sched_raw) if sched_raw else created
        start = started if started >= created else created
        if deleted <= start:
            dropped += 1
            continue
        share = n_gpu == 1 and 0 < milli < 1000
        spec = (row.get("gpu_spec") or "").strip()
        jobs.append(
            SimJob(
                row["name"].strip(),
                created,
                deleted - start,
                milli / 1000 if share else n_gpu,
                cpus=_num(p, line, row, "cpu_milli") / 1000,
                memory_mb=int(_num(p, line, row, "memory_mib")),
                gpu_milli=int(milli) if share else 0,
                gpu_models=tuple(x for x in spec.split("|") if x) or None,
                qos=(row.get("qos") or "").strip() or None,
            )
        )
    return Trace(_order(jobs), "openb", {"not_running": dropped})


def _order(jobs: list[SimJob]) -> list[SimJob]:
    jobs.sort(key=lambda j: j.submit_s)
    for i, j in enumerate(jobs):
        j.order = i
    return jobs


def cut(
    jobs: Sequence[SimJob], window: tuple[int, int] | None = None, max_jobs: int | None = None, load: float = 1.0
) -> list[SimJob]:
    """Jobs `window` (in submit order), at most `max_jobs`, arrivals scaled by `load`, times from 0."""
    if load <= 0:
        raise TraceError(f"--load must be > 0, got {load}")
    chosen = list(jobs)
    if window is not None:
        start, end = window
        if start < 0 or end <= start:
            raise TraceError(f"--window {start}:{end}: need 0 <= START < END")
        if start >= len(chosen):
            raise TraceError(f"--window {start}:{end}: the trace has only {len(chosen)} jobs")
        chosen = chosen[start:end]
    if max_jobs is not None:
        if max_jobs < 1:
            raise TraceError(f"--max-jobs must be >= 1, got {max_jobs}")
        chosen = chosen[:max_jobs]
    if not chosen:
        raise TraceError("the trace selection is empty")
    t0 = chosen[0].submit_s
    out: list[SimJob] = []
    for i, j in enumerate(chosen):
        c = SimJob(
            j.job_id,
            (j.submit_s - t0) / load,
            j.duration_s,
            j.gpus,
            vc=j.vc,
            cpus=j.cpus,
            memory_mb=j.memory_mb,
            gpu_milli=j.gpu_milli,
            gpu_models=j.gpu_models,
            qos=j.qos,
            time_limit_s=j.time_limit_s,
        )
        c.order = i
        out.append(c)
    return out


def parse_window(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    parts = text.split(":")
    if len(parts) != 2 or not all(x.strip().isdigit() for x in parts):
        raise TraceError(f"--window {text!r}: expected START:END, e.g. 60000:80000")
    return int(parts[0]), int(parts[1])
