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
        "nodes": spec.topology.nodes,
        "domain": spec.topology.domain,
        "gpu_models": spec.resources.gpu_models,
        "image": spec.image,
        "cpu_limit_per_rank": None if spec.resources.cpu_limit is None else _number(spec.resources.cpu_limit),
        "memory_limit_mb_per_rank": spec.resources.memory_limit_mb,
        "resource_notes": resource_notes(spec),
        "entrypoint": spec.entrypoint,
        "command": spec.command,
        "framework": spec.framework,
        # A job array: how many tasks (jobs) it makes and how many may run at once (%N; null: no limit).
        "array": None
        if spec.array is None
        else {"tasks": spec.array.tasks, "max_running": spec.array.max_running, "indices": spec.array.indices},
        # Where and when it may run: --nodelist (only these nodes), --exclude, --begin (Unix seconds).
        "nodelist": spec.nodelist or None,
        "exclude_nodes": spec.exclude_nodes or None,
        "begin_at": spec.begin_at,
        # An elastic gang: it starts with the most ranks of this range that fit and grows or shrinks inside it.
        "elastic": None
        if spec.elastic is None
        else {"min_ranks": spec.elastic.min_ranks, "max_ranks": spec.elastic.max_ranks},
        "spec": spec.model_dump(mode="json"),
    }
    if spec.components is not None:
        out["components"] = components_summary(spec)
    if kind is not None:
        out["format"] = kind
    return out


def components_summary(spec: JobSpec) -> list[dict[str, Any]]:
    """A heterogeneous job's components, each as the checks read a job: its ranks, GPUs and where they go."""
    out: list[dict[str, Any]] = []
    for n, (start, part) in enumerate(zip(spec.component_offsets(), spec.component_specs(), strict=True)):
        out.append(
            {
                "component": n,
                "ranks": part.ranks,
                "first_rank": start,
                "gpus_per_rank": _number(part.resources.gpus),
                "total_gpus": _number(part.total_gpus),
                "cpus_per_rank": _number(part.resources.cpus),
                "memory_mb_per_rank": part.resources.memory_mb,
                "gpu_models": part.resources.gpu_models,
                "ntasks": part.slurm.ntasks if part.slurm is not None else part.ranks,
                "topology": part.topology.model_dump(mode="json"),
                "nodelist": part.nodelist or None,
                "constraint": part.constraint,
            }
        )
    return out


def resource_notes(spec: JobSpec) -> list[str]:
    """What a rank reserves and what caps it, said plainly (a request reserves, a limit caps)."""
    r = spec.resources
    notes = [f"each rank reserves {_number(r.cpus)} CPU(s) and {r.memory_mb} MiB (requests)"]
    if r.cpu_limit is None:
        notes.append("CPU: no limit; a rank may use any CPU of its cpuset (its GPUs' NUMA node)")
    else:
        notes.append(f"CPU: capped at {_number(r.cpu_limit)}")
    if r.memory_limit_mb is None:
        notes.append("memory: no limit; a rank may use its node's free memory")
    else:
        notes.append(f"memory: capped at {r.memory_limit_mb} MiB")
    if spec.topology.exclusive:
        notes.append("exclusive: each of the job's nodes is held whole (all its GPUs and CPUs); no other job shares it")
    if spec.framework in ("pytorchjob", "trainjob"):
        notes.append(
            "each rank gets PET_NNODES=ranks, PET_NODE_RANK=its rank, PET_MASTER_ADDR/PET_MASTER_PORT=rank 0's "
            "MASTER_ADDR/MASTER_PORT, PET_NPROC_PER_NODE, WORLD_SIZE and RANK"
        )
        if spec.elastic is not None:
            notes.append(
                f"elastic gang: starts with the most ranks from {spec.elastic.min_ranks} to {spec.elastic.max_ranks} "
                "that fit; grows when GPUs free up, shrinks toward the minimum before being preempted (each change "
                "a checkpoint and restart; WORLD_SIZE is the ranks it runs with)"
            )
        if "PET_RDZV_BACKEND" in spec.env:
            notes.append(
                f"elastic: PET_NNODES={spec.env.get('PET_NNODES', spec.ranks)}, PET_RDZV_BACKEND="
                f"{spec.env['PET_RDZV_BACKEND']}, PET_RDZV_ENDPOINT=rank 0's MASTER_ADDR:MASTER_PORT"
            )
    return notes
