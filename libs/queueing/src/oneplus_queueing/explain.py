"""Pending reasons in the words of `squeue`: which code, and a message a person can act on."""

from __future__ import annotations

import time

from oneplus_contracts import JobSpec
from oneplus_placement.diagnosis import Explanation

from .capacity import whole_gpus
from .model import ReasonCode

# Placement's blocking constraints that are about where GPUs sit rather than how many there are.
_TOPOLOGY = frozenset({"domain", "domain_size", "max_leaves", "nvlink_domain", "rank_size", "group_domain"})


def classify_failure(spec: JobSpec, explanation: Explanation | None, free_gpus: int) -> tuple[ReasonCode, str]:
    """`Topology` when enough GPUs are free but not in a shape or domain the gang can use, else `Resources`."""
    need = whole_gpus(spec)
    if explanation is None:
        return "Resources", f"needs {need} GPUs; {free_gpus} are free"
    if explanation.constraint in ("constraint", "level"):  # a feature or a level the cluster does not have
        return "BadConstraints", explanation.message
    if explanation.constraint in _TOPOLOGY:
        return "Topology", explanation.message
    if explanation.constraint == "capacity" and need and free_gpus >= need:
        return "Topology", explanation.message
    return "Resources", explanation.message


def shape_key(spec: JobSpec) -> tuple[object, ...]:
    """What placement looks at: two jobs with the same key fit or fail together on the same state."""
    res = spec.resources
    topo = spec.topology
    return (
        spec.ranks,
        res.gpus,
        res.cpus,
        res.memory_mb,
        tuple(res.gpu_models or ()),
        topo.domain,
        topo.mode,
        topo.group_gpus,
        topo.group_domain,
        topo.max_leaves,
        topo.exclusive,
        spec.constraint,
    )


def fmt_ts(ts: float | None) -> str:
    """Wall-clock times as UTC; a simulator's clock (which starts near zero) as seconds."""
    if ts is None:
        return "an unknown time"
    if ts < 1e9:
        return f"t={ts:g}s"
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))
