"""Checks a job must pass before it is accepted, beyond its schema: queue, and whether it can ever fit."""

from __future__ import annotations

from collections.abc import Sequence

from oneplus_contracts import JobSpec, NodeRecord
from oneplus_queueing.config import QueueConfig, QueueConfigError


class Inadmissible(ValueError):
    """The job can never run as asked; the message says why in terms the submitter can act on."""


def admit(spec: JobSpec, queues: QueueConfig, nodes: Sequence[NodeRecord]) -> None:
    try:
        queues.validate_job(spec)
    except QueueConfigError as exc:
        raise Inadmissible(str(exc)) from exc
    live = [n for n in nodes if n.status != "lost"]
    if not live:
        return  # no node has reported yet: the job waits, `jobs explain` says why
    total = sum(len(n.topology.gpus) for n in live)
    if spec.total_gpus > total:
        raise Inadmissible(
            f"gang of {spec.total_gpus:g} GPUs ({spec.ranks} ranks x {spec.resources.gpus:g}) is larger than the "
            f"cluster ({total} GPUs on {len(live)} nodes)"
        )
    largest = max(len(n.topology.gpus) for n in live)
    if spec.resources.gpus > largest:
        raise Inadmissible(
            f"a rank asks for {spec.resources.gpus:g} GPUs but the largest node has {largest}; "
            f"split the job into more ranks"
        )
    models = spec.resources.gpu_models
    if models:
        names = {n.topology.gpu_model for n in live} | {g.name for n in live for g in n.topology.gpus}
        if not any(m.lower() in name.lower() for m in models for name in names):
            raise Inadmissible(f"no node has a GPU model matching {models}; the cluster has {sorted(names)}")
