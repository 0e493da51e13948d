"""`jobs explain` and the cycle's reasons on a cluster of several GPU models (issue 44, point 3).

The demo cluster: two H100 boards (n000, n001), an A100 board (n002) and an L40S box (n003). Before, a pending gang
that needs H100s was told it "would fit if" jobs on the A100 and the L40S were preempted, that 12 GPUs were free
(every model's), and the solver printed the same placement clause twice.
"""

from __future__ import annotations

from oneplus_contracts import JobSpec, RankResources
from oneplus_placement import explain_pending
from oneplus_queueing.config import default_config, load_queue_config
from oneplus_queueing.cycle import schedule_cycle
from oneplus_queueing.fairshare import UsageHistory
from oneplus_queueing.model import PendingJob
from oneplus_stores.clusterview import merge_reason
from oneplus_topology import load_preset
from oneplus_topology.cluster import Cluster, Fabric
from queueing_world import World

PRESETS = ("h100_sxm_8gpu_nvswitch_nv18",) * 2 + ("dgx_a100_8gpu_nv12_12nic", "l40s_8gpu_pcie_node_sys")
NOW = 10_000.0


def demo_world() -> World:
    nodes = [
        load_preset(preset).model_copy(update={"node": f"n{i:03d}", "leaf": f"leaf{i // 2}", "spine": "spine0"})
        for i, preset in enumerate(PRESETS)
    ]
    return World(cluster=Cluster(name="demo", fabric=Fabric(nodes_per_leaf=2, leaves_per_spine=2), nodes=nodes))


def busy_world() -> World:
    """Both H100 boards held by preemptible jobs of priority 100; 2 GPUs of the A100 and of the L40S by priority 0."""
    w = demo_world()
    w.run("h100-a", [(0, range(8))], started=0.0, priority=100)
    w.run("h100-b", [(1, range(8))], started=0.0, priority=100)
    w.run("low-a100", [(2, range(2))], started=0.0, priority=0)
    w.run("low-l40s", [(3, range(2))], started=0.0, priority=0)
    return w


def h100_gang(priority: int = 900) -> JobSpec:
    return JobSpec(name="want", ranks=2, priority=priority, resources=RankResources(gpus=8, gpu_models=["H100"]))


def preemptible(w: World) -> list[tuple[str, object, int]]:
    return [(j.job_id, j.allocation, j.spec.priority) for j in w.running.values()]


def test_preemption_candidates_are_only_jobs_on_gpus_the_gang_may_use() -> None:
    w = busy_world()
    why = explain_pending(w.state, h100_gang(), preemptible=preemptible(w))  # type: ignore[arg-type]
    assert why.preempt_to_fit == ("h100-a", "h100-b"), "the A100 and L40S jobs free nothing an H100 gang can use"
    assert "low-a100" not in why.message and "low-l40s" not in why.message


def test_a_victim_the_placement_does_not_need_is_spared() -> None:
    """A gang of any model: the cheapest prefix would free the small jobs too; only the H100 boards make room."""
    w = busy_world()
    spec = JobSpec(name="any", ranks=2, priority=900, resources=RankResources(gpus=8))
    why = explain_pending(w.state, spec, preemptible=preemptible(w))  # type: ignore[arg-type]
    assert why.preempt_to_fit == ("h100-a", "h100-b")


def test_the_cycle_counts_free_gpus_among_the_models_the_job_may_use() -> None:
    w = busy_world()
    job = PendingJob("want", h100_gang(), NOW - 10)
    config = load_queue_config("preemption: {enabled: false}\n")
    d = schedule_cycle(NOW, w.state, [job], list(w.running.values()), config, UsageHistory())
    why = d.reasons["want"]
    assert why.code == "Resources"
    assert why.message.startswith("needs 16 GPUs on H100; 0 of those are free"), why.message
    assert "12" not in why.message


def test_a_gang_that_waits_for_one_model_says_so() -> None:
    w = demo_world()
    w.run("h100-a", [(0, range(8))], started=0.0, preemptible=False)
    w.run("h100-b", [(1, range(8))], started=0.0, preemptible=False)
    job = PendingJob("any", JobSpec(name="any", ranks=2, resources=RankResources(gpus=8)), NOW - 10)
    d = schedule_cycle(NOW, w.state, [job], list(w.running.values()), default_config(), UsageHistory())
    assert "any" not in d.placements, "an A100 board and an L40S box are not one gang's GPUs"
    why = d.reasons["any"]
    assert why.code == "Topology"
    assert "waits for one GPU model" in why.message


def test_a_queue_that_mixes_models_places_the_gang_across_them() -> None:
    w = demo_world()
    w.run("h100-a", [(0, range(8))], started=0.0, preemptible=False)
    w.run("h100-b", [(1, range(8))], started=0.0, preemptible=False)
    config = load_queue_config("queues: [{name: default, mix_gpu_models: true}]\n")
    job = PendingJob("any", JobSpec(name="any", ranks=2, resources=RankResources(gpus=8)), NOW - 10)
    d = schedule_cycle(NOW, w.state, [job], list(w.running.values()), config, UsageHistory())
    assert sorted(r.node for r in d.placements["any"].ranks) == ["n002", "n003"]


def test_the_solvers_message_says_each_clause_once() -> None:
    """The cycle's reason carries the placement clause and the reserved block; the explanation repeats the first."""
    reason = (
        "needs 16 GPUs (2 ranks x 8) under one leaf; best leaf leaf0 has 8 free; leaf leaf0 (n000, n001) is reserved "
        "for it from t=100s"
    )
    explained = (
        "needs 16 GPUs (2 ranks x 8) under one leaf; best leaf leaf0 has 8 free; 1 higher-priority job ahead (j-a); "
        "would fit if preemptible job j-b were preempted"
    )
    merged = merge_reason("Resources", reason, explained)
    assert merged == (
        "Resources: needs 16 GPUs (2 ranks x 8) under one leaf; best leaf leaf0 has 8 free; leaf leaf0 (n000, n001) "
        "is reserved for it from t=100s; 1 higher-priority job ahead (j-a); would fit if preemptible job j-b were "
        "preempted"
    )
    clauses = merged.split("; ")
    assert len(clauses) == len(set(clauses))


def test_a_count_reason_is_not_followed_by_the_same_need_in_other_words() -> None:
    merged = merge_reason(
        "Resources",
        "needs 16 GPUs on H100; 0 of those are free",
        "needs 16 GPUs (2 ranks x 8) on H100 GPUs in the cluster; the cluster has 0 free; would fit if preemptible "
        "jobs a, b were preempted",
    )
    assert (
        merged
        == "Resources: needs 16 GPUs on H100; 0 of those are free; would fit if preemptible jobs a, b were preempted"
    )
