"""The dry-run view of a job spec: the keys the checks read, then the full spec."""

from __future__ import annotations

from typing import Any

from oneplus_contracts import JobSpec


def _number(value: float) -> int | float:
    """Whole numbers print as integers (8, not 8.0); shares stay fractional."""
    return int(value) if float(value).is_integer() else round(float(value), 6)


def dry_run_summary(spec: JobSpec, warnings: list[str], *, kind: str | None = None) -> dict[str, Any]:
    """`name, queue, priority, ranks, gpus_per_rank, total_gpus, cpus_per_rank, memory_mb_per_rank, time_limit_s,
    checkpoint_signal, checkpoint_grace_s, max_leaves, warnings`, plus team, user, topology and the spec itself."""
    out: dict[str, Any] = {
        "name": spec.name,
        "queue": spec.queue,
        "priority": spec.priority,
        "ranks": spec.ranks,
        "gpus_per_rank": _number(spec.resources.gpus),
        "total_gpus": _number(spec.total_gpus),
        "cpus_per_rank": _number(spec.resources.cpus),
        "memory_mb_per_rank": spec.resources.memory_mb,
        "time_limit_s": spec.time_limit_s,
        "checkpoint_signal": spec.checkpoint.signal,
        "checkpoint_grace_s": spec.checkpoint.grace_s,
        "max_leaves": spec.topology.max_leaves,
        "warnings": list(warnings),
        "team": spec.team,
        "user": spec.user,
        "priority_class": spec.priority_class,
        "preemptible": spec.preemptible,
        "exclusive": spec.topology.exclusive,
        "domain": spec.topology.domain,
        "gpu_models": spec.resources.gpu_models,
        "image": spec.image,
        "spec": spec.model_dump(mode="json"),
    }
    if kind is not None:
        out["format"] = kind
    return out
