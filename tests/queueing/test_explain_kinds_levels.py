"""Issue 44's counting and victims on issue 41's level tree: a TP group over the trays of one NVL72 domain is
eligible tray by tray, so the free GPUs it may use and the jobs whose preemption would make room are counted on the
trays (`bench/clusters/nvl72_2rack_h100.yaml`: two domains of 18 four-GPU trays, then eight H100 boards)."""

from __future__ import annotations

from pathlib import Path

from oneplus_contracts import JobSpec, RankResources, TopologyConstraint
from oneplus_placement import explain_pending
from oneplus_queueing.capacity import Capacity
from oneplus_queueing.config import default_config
from oneplus_queueing.model import CycleStats
from oneplus_topology.cluster import load_cluster
from queueing_world import World

NVL72 = Path(__file__).resolve().parents[2] / "bench" / "clusters" / "nvl72_2rack_h100.yaml"


def tp16(priority: int = 900) -> JobSpec:
    return JobSpec(
        name="tp16",
        ranks=4,
        priority=priority,
        resources=RankResources(gpus=4, gpu_models=["GB200"]),
        topology=TopologyConstraint(group_gpus=16),
    )


def test_free_gpus_a_tp_group_over_trays_may_use_are_the_trays() -> None:
    w = World(cluster=load_cluster(NVL72))
    capacity = Capacity.for_config(w.state, CycleStats(), default_config(), [tp16()])
    assert capacity.free_gpus_for(tp16()) == 144, "36 trays of 4 GB200; no tray alone holds a group of 16"


def test_preempting_the_trays_of_one_domain_is_named_for_a_tp_group_over_trays() -> None:
    w = World(cluster=load_cluster(NVL72))
    w.run("low-0", [(i, range(4)) for i in range(18)], started=0.0, priority=0)
    w.run("low-1", [(i, range(4)) for i in range(18, 36)], started=0.0, priority=0)
    running = [(j.job_id, j.allocation, j.spec.priority) for j in w.running.values()]
    why = explain_pending(w.state, tp16(), preemptible=running)  # type: ignore[arg-type]
    assert why.preempt_to_fit in (("low-0",), ("low-1",)), why.message
