"""Fair share: GPU usage per queue with exponential decay, and a Fair-Tree factor per leaf queue.

Slurm's Fair Tree ranks siblings by Level FS = S / U (S: the sibling's share of its siblings' weights, U: its share of
their decayed usage), walks the tree depth first in that order, and gives each leaf a factor by its rank: the first
leaf gets 1.0, the last 1/n. A queue that has used less than its share therefore always sorts ahead of one that has
used more, whatever happens deeper in the tree.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .config import QueueConfig
from .model import RunningJob

_LN2 = math.log(2.0)


@dataclass(frozen=True, slots=True)
class PreemptionRecord:
    ts: float
    victim: str
    preemptor: str
    gpus: float


@dataclass
class UsageHistory:
    """Decayed GPU-seconds per leaf queue, and the recent preemptions (for the rate limit).

    The caller owns it: `charge` it with the running jobs before a cycle, `record_preemption` when a victim is
    evicted. `schedule_cycle` only reads it, so a cycle stays a function of its inputs.
    """

    half_life_s: float = 7 * 24 * 3600.0
    as_of: float = 0.0
    usage: dict[str, float] = field(default_factory=dict)
    preemptions: list[PreemptionRecord] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.half_life_s <= 0:
            raise ValueError(f"half_life_s must be positive, got {self.half_life_s}")

    @classmethod
    def for_config(cls, config: QueueConfig, now: float = 0.0) -> UsageHistory:
        return cls(half_life_s=config.fairshare.half_life_s, as_of=now)

    def _decay(self, dt: float) -> float:
        return math.pow(2.0, -dt / self.half_life_s)

    def charge(self, now: float, running: Iterable[RunningJob]) -> None:
        """Decay what was recorded up to `now` and add each running job's GPU-seconds since `as_of`."""
        if now < self.as_of:
            raise ValueError(f"usage was charged up to {self.as_of}; cannot charge back to {now}")
        dt = now - self.as_of
        k = self._decay(dt)
        for q in self.usage:
            self.usage[q] *= k
        for job in running:
            t0 = max(self.as_of, job.started_ts)
            if t0 >= now:
                continue
            # Exact integral of gpus * 2^(-(now - t)/h) over [t0, now]: independent of how often we charge.
            added = job.gpus * self.half_life_s / _LN2 * (1.0 - self._decay(now - t0))
            self.usage[job.queue] = self.usage.get(job.queue, 0.0) + added
        self.as_of = now
        horizon = now - 24 * 3600.0
        if self.preemptions and self.preemptions[0].ts < horizon:
            self.preemptions = [p for p in self.preemptions if p.ts >= horizon]

    def usage_at(self, now: float) -> dict[str, float]:
        """Decayed usage per leaf queue as of `now`, without charging anything."""
        k = self._decay(max(0.0, now - self.as_of))
        return {q: u * k for q, u in self.usage.items()}

    def record_preemption(self, ts: float, victim: str, preemptor: str, gpus: float) -> None:
        self.preemptions.append(PreemptionRecord(ts, victim, preemptor, gpus))

    def preemptions_since(self, ts: float) -> int:
        return sum(1 for p in self.preemptions if p.ts >= ts)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able data: the caller keeps it where a restarted scheduler finds it."""
        return {
            "half_life_s": self.half_life_s,
            "as_of": self.as_of,
            "usage": dict(self.usage),
            "preemptions": [[p.ts, p.victim, p.preemptor, p.gpus] for p in self.preemptions],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> UsageHistory:
        return cls(
            half_life_s=float(data["half_life_s"]),
            as_of=float(data["as_of"]),
            usage={str(q): float(u) for q, u in data["usage"].items()},
            preemptions=[PreemptionRecord(float(t), str(v), str(p), float(g)) for t, v, p, g in data["preemptions"]],
        )


@dataclass(frozen=True, slots=True)
class FairShareEntry:
    queue: str
    share: float  # its weight over its siblings' weights
    usage_share: float  # its decayed usage over its siblings'
    level_fs: float  # share / usage_share; inf when unused
    factor: float  # leaves only: 1.0 for the first in Fair Tree order, 1/n for the last; 0 for inner queues


def fair_tree(config: QueueConfig, usage: Mapping[str, float]) -> dict[str, FairShareEntry]:
    """Fair-Tree entries for every queue; leaf usage is summed up the tree."""
    total: dict[str, float] = {q.name: 0.0 for q in config.queues}
    for leaf, u in usage.items():
        if leaf not in total:
            continue  # usage of a queue since removed from the config no longer counts
        for q in config.path(leaf):
            total[q] += u
    level: dict[str, tuple[float, float, float]] = {}
    order: list[tuple[tuple[float, ...], str]] = []

    def visit(parent: str | None, key: tuple[float, ...]) -> None:
        kids = config.children(parent)
        w_sum = sum(config.queue(k).weight for k in kids)
        u_sum = sum(total[k] for k in kids)
        ranked = []
        for k in kids:
            s = config.queue(k).weight / w_sum
            u = total[k] / u_sum if u_sum > 0 else 0.0
            lfs = s / u if u > 0 else math.inf
            level[k] = (s, u, lfs)
            ranked.append((-lfs, k))
        for neg_lfs, k in sorted(ranked):
            child_key = (*key, neg_lfs)
            if config.children(k):
                visit(k, child_key)
            else:
                order.append((child_key, k))

    visit(None, ())
    n = len(order)
    factors: dict[str, float] = {}
    first_of_tie = 0
    for i, (key, leaf) in enumerate(order):
        if i > 0 and key != order[i - 1][0]:
            first_of_tie = i
        factors[leaf] = (n - first_of_tie) / n
    return {
        q: FairShareEntry(q, s, u, lfs, factors.get(q, 0.0))
        for q, (s, u, lfs) in ((q, level[q]) for q in (spec.name for spec in config.queues))
    }


def fairshare_factors(config: QueueConfig, usage: Mapping[str, float]) -> dict[str, float]:
    """Leaf queue → Fair-Tree factor in (0, 1]; higher means the queue is owed more."""
    return {q: e.factor for q, e in fair_tree(config, usage).items() if config.is_leaf(q)}
