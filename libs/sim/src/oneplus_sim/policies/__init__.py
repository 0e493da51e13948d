"""Scheduling policies the simulator compares; `make_policy` builds one by its report name."""

from __future__ import annotations

from oneplus_queueing.config import QueueConfig

from ..engine import Policy
from .baselines import FifoFirstFit, K8sDefault, KueueTas, SlurmTree
from .nvlink import KueueTasSlices, SlurmBlock

BASELINES = ("k8s-default", "slurm-tree", "kueue-tas", "fifo-firstfit", "slurm-block", "kueue-tas-slices")
POLICY_NAMES = ("oneplus", *BASELINES)
ELASTIC_POLICY = "oneplus-elastic"  # oneplus with the --elastic rule's jobs elastic; run beside oneplus (fixed)


def make_policy(name: str, seed: int = 0, oneplus_config: QueueConfig | None = None) -> Policy:
    """A policy by name; `oneplus_config` replaces the `oneplus` policy's queue config (sim_queue_config())."""
    if name == "k8s-default":
        return K8sDefault(seed)
    if name == "slurm-tree":
        return SlurmTree()
    if name == "kueue-tas":
        return KueueTas()
    if name == "fifo-firstfit":
        return FifoFirstFit()
    if name == "slurm-block":
        return SlurmBlock()
    if name == "kueue-tas-slices":
        return KueueTasSlices()
    if name in ("oneplus", ELASTIC_POLICY):
        from .oneplus import OnePlusPolicy

        return OnePlusPolicy(seed, config=oneplus_config, elastic=name == ELASTIC_POLICY)
    raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICY_NAMES)}")


__all__ = [
    "BASELINES",
    "ELASTIC_POLICY",
    "POLICY_NAMES",
    "FifoFirstFit",
    "K8sDefault",
    "KueueTas",
    "KueueTasSlices",
    "SlurmBlock",
    "SlurmTree",
    "make_policy",
]
