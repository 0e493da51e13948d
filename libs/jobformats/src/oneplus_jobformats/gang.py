"""Turning replica types (Master/Worker, Launcher/Worker, nodes) into one gang of identical ranks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .fields import FieldReader, child
from .pods import PodShape

# OnePlus places every rank on a GPU node; a rank that asks for no GPU takes the smallest share the contracts allow.
CPU_ONLY_GPU_SHARE = 0.001
_RESTART = {"Always": "Always", "OnFailure": "OnFailure", "Never": "Never", "ExitCode": "OnFailure"}
_PULL = {"Always", "IfNotPresent", "Never"}


def cpu_only_remark() -> str:
    return (
        f"asks for no GPU; OnePlus runs every rank on a GPU node, so each rank takes the smallest GPU share "
        f"({CPU_ONLY_GPU_SHARE})"
    )


@dataclass
class ReplicaGroup:
    """One replica type of a Kubeflow job: how many pods and what each asks for."""

    role: str
    replicas: int
    shape: PodShape
    path: str
    restart_policy: str | None = None


def _fmt(shape: PodShape) -> str:
    return f"{shape.gpus} GPU, {shape.cpus or 'default'} CPU, {shape.memory_mb or 'default'} MB"


def gang_fields(r: FieldReader, groups: list[ReplicaGroup], fields: dict[str, Any], origin: dict[str, str]) -> None:
    """Ranks, per-rank resources, image, command and env of the gang, with a warning wherever groups differ."""
    live = [g for g in groups if g.replicas > 0]
    if not live:
        where = groups[0].path if groups else "spec"
        raise r.error(where, "the job has no replicas (every replica count is 0)")
    ref = live[0]
    fields["ranks"] = sum(g.replicas for g in live)
    origin["ranks"] = " + ".join(child(g.path, "replicas") for g in live)
    gpus = max(g.shape.gpus for g in live)
    cpus = [g.shape.cpus for g in live if g.shape.cpus is not None]
    mems = [g.shape.memory_mb for g in live if g.shape.memory_mb is not None]
    shapes = {(g.shape.gpus, g.shape.cpus, g.shape.memory_mb) for g in live}
    if len(shapes) > 1:
        detail = "; ".join(f"{g.role}: {_fmt(g.shape)}" for g in live)
        r.warn(ref.path, f"replica types ask for different resources ({detail}); every rank gets the largest of each")
    resources: dict[str, Any] = {"gpus": gpus if gpus > 0 else CPU_ONLY_GPU_SHARE}
    if gpus == 0:
        r.warn(ref.shape.resources_path or ref.path, cpu_only_remark())
    if cpus:
        resources["cpus"] = max(cpus)
    if mems:
        resources["memory_mb"] = max(mems)
    # A cap holds only if every replica type has one (one rank shape for all); the largest is kept.
    cpu_caps = [g.shape.cpu_limit for g in live]
    if all(c is not None for c in cpu_caps):
        resources["cpu_limit"] = max(c for c in cpu_caps if c is not None)
    mem_caps = [g.shape.memory_limit_mb for g in live]
    if all(m is not None for m in mem_caps):
        resources["memory_limit_mb"] = max(m for m in mem_caps if m is not None)
    models = next((g.shape.gpu_models for g in live if g.shape.gpu_models), None)
    if models:
        resources["gpu_models"] = models
    fields["resources"] = resources
    origin["resources"] = ref.shape.resources_path
    _same_everywhere(r, live, fields, origin)
    topo = next((g.shape for g in live if g.shape.domain), None)
    if topo is not None:
        fields["topology"] = {"domain": topo.domain, "mode": topo.domain_mode or "preferred"}


def _same_everywhere(r: FieldReader, live: list[ReplicaGroup], fields: dict[str, Any], origin: dict[str, str]) -> None:
    """Image, command, env, pull and restart policy come from the first group; others that differ are named."""
    ref = live[0]
    for g in live[1:]:
        for what, a, b in (
            ("image", ref.shape.image, g.shape.image),
            ("command", ref.shape.entrypoint, g.shape.entrypoint),
            ("args", ref.shape.command, g.shape.command),
            ("restartPolicy", ref.restart_policy, g.restart_policy),
        ):
            if a != b:
                r.warn(g.path, f"{what} {b!r} differs from {ref.role}'s {a!r}; every rank uses {ref.role}'s")
    if ref.shape.image:
        fields["image"] = ref.shape.image
    if ref.shape.entrypoint is not None:
        fields["entrypoint"] = ref.shape.entrypoint
    if ref.shape.command:
        fields["command"] = ref.shape.command
    env: dict[str, str] = {}
    for g in reversed(live):
        env.update(g.shape.env)
    if env:
        fields["env"] = env
    if ref.shape.pull_policy:
        if ref.shape.pull_policy not in _PULL:
            raise r.error(ref.path, f"imagePullPolicy must be one of {sorted(_PULL)} (got {ref.shape.pull_policy!r})")
        fields["pull_policy"] = ref.shape.pull_policy
    if ref.restart_policy:
        if ref.restart_policy not in _RESTART:
            raise r.error(
                child(ref.path, "restartPolicy"), f"must be one of {sorted(_RESTART)} (got {ref.restart_policy!r})"
            )
        if ref.restart_policy == "ExitCode":
            r.warn(
                child(ref.path, "restartPolicy"), "ExitCode is treated as OnFailure (OnePlus restarts on any failure)"
            )
        fields["restart_policy"] = _RESTART[ref.restart_policy]
