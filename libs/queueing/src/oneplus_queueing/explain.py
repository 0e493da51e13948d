"""Pending reasons in the words of `squeue`: which code, and a message a person can act on."""

from __future__ import annotations

import time

from oneplus_contracts import JobSpec
from oneplus_placement.diagnosis import Explanation
from oneplus_placement.hosts import HostFilter

from .capacity import whole_gpus
from .model import ReasonCode

# Placement's blocking constraints that are about where GPUs sit rather than how many there are.
_TOPOLOGY = frozenset({"domain", "domain_size", "max_leaves", "nvlink_domain", "rank_size", "gpu_kind", "group_domain"})


def where_usable(spec: JobSpec) -> str:
    """Which GPUs a job may use, as a phrase after "GPUs" ("" when any)."""
    parts = []
    if spec.resources.gpu_models:
        parts.append(f"on {' or '.join(spec.resources.gpu_models)}")
    if spec.constraint:
        parts.append(f"on nodes with {spec.constraint}")
    hosts = HostFilter.of(spec)
    if hosts is not None:
        parts.append(hosts.text)
    return (" " + " ".join(parts)) if parts else ""


def count_message(spec: JobSpec, free_gpus: int) -> str:
    """`needs N GPUs; F are free`, F counted among the GPUs the job may use."""
    need = whole_gpus(spec)
    where = where_usable(spec)
    return f"needs {need} GPUs{where}; {free_gpus} {'of those ' if where else ''}are free"


def classify_failure(spec: JobSpec, explanation: Explanation | None, free_gpus: int) -> tuple[ReasonCode, str]:
    """`Topology` when enough GPUs are free but not in a shape or domain the gang can use, else `Resources`.
    `free_gpus`: free among the GPUs the job may use (`Capacity.free_gpus_for`)."""
    need = whole_gpus(spec)
    if explanation is None:
        return "Resources", count_message(spec, free_gpus)
    if explanation.constraint in ("constraint", "level", "nodelist"):  # a feature, level or node the cluster lacks
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
        topo.nodes,
        spec.constraint,
        tuple(spec.nodelist),
        tuple(spec.exclude_nodes),
    )


def fmt_ts(ts: float | None) -> str:
    """Wall-clock times as UTC; a simulator's clock (which starts near zero) as seconds."""
    if ts is None:
        return "an unknown time"
    if ts < 1e9:
        return f"t={ts:g}s"
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))
