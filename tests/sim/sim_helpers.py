"""Small hand-made clusters and jobs for the simulator tests."""

from __future__ import annotations

from pathlib import Path

from oneplus_sim.cluster import SimCluster, uniform_cluster
from oneplus_sim.engine import SimResult, Simulation
from oneplus_sim.policies import make_policy
from oneplus_sim.trace import PRIORITY_CLASSES, SimJob

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "data" / "traces"


def h100(nodes: int = 1, per_leaf: int = 1, oversub: float = 2.0) -> SimCluster:
    return uniform_cluster(nodes, "h100_sxm_8gpu_nvswitch_nv18", per_leaf, oversubscription=oversub)


def job(
    job_id: str,
    submit: float,
    gpus: int,
    duration: float,
    *,
    node_gpus: int = 8,
    cls: str = "normal",
    checkpoint: float | None = None,
    f: float = 0.0,
    order: int | None = None,
) -> SimJob:
    """A whole-GPU job split into ranks as the trace rule does, with explicit class, checkpoint and f."""
    j = SimJob(job_id, submit, duration, float(gpus))
    if gpus <= node_gpus:
        j.ranks, j.gpus_per_rank = 1, gpus
    else:
        j.ranks, j.gpus_per_rank = gpus // node_gpus, node_gpus
    j.priority_class, j.priority = cls, PRIORITY_CLASSES[cls]
    j.preemptible = cls != "high"
    j.checkpoint_interval_s = checkpoint
    j.comm_fraction = f
    j.order = order if order is not None else int(submit * 1000)
    return j


def simulate(cluster: SimCluster, jobs: list[SimJob], policy: str, seed: int = 0, **kw: float) -> SimResult:
    return Simulation(cluster, jobs, make_policy(policy, seed), **kw).run()


def finish_times(res: SimResult) -> dict[str, float | None]:
    return {k: r.finish_s for k, r in res.records.items()}


def start_times(res: SimResult) -> dict[str, float | None]:
    return {k: r.first_start_s for k, r in res.records.items()}
