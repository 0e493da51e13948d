"""`explain_pending`: the blocking constraint and level, the queue ahead, and the preemption that makes room."""

from __future__ import annotations

from oneplus_contracts import Allocation, JobSpec, RankPlacement
from oneplus_placement import ClusterSnapshot, explain_pending
from placement_boards import HGX_H100, preset_cluster


def held(node: str, gpus: list[int]) -> Allocation:
    return Allocation(ranks=[RankPlacement(rank=0, node=node, gpus=gpus)])


def leaf_job(gpus: int, priority: int = 50) -> JobSpec:
    return JobSpec(
        name="big",
        ranks=gpus // 8,
        resources={"gpus": 8},  # type: ignore[arg-type]
        topology={"domain": "leaf", "mode": "required"},  # type: ignore[arg-type]
        priority=priority,
    )


def busy_cluster() -> tuple[ClusterSnapshot, Allocation, Allocation]:
    """Two leaves of two nodes; leaf0 has one node held by `victim`, leaf1 one node held by `other`."""
    snap = ClusterSnapshot.from_cluster(preset_cluster(HGX_H100, 4, nodes_per_leaf=2))
    victim = held("node-00", list(range(8)))
    other = held("node-03", list(range(8)))
    return snap.with_allocation(victim).with_allocation(other), victim, other


def test_explanation_names_level_best_domain_queue_and_victim() -> None:
    snap, victim, other = busy_cluster()
    exp = explain_pending(
        snap,
        leaf_job(16),
        ahead=["train-a", "train-b"],
        preemptible=[("victim", victim, 10), ("other", other, 20)],
    )
    assert exp.level == "leaf" and not exp.fits_now
    assert exp.message == (
        "needs 16 GPUs (2 ranks x 8) under one leaf; best leaf leaf0 has 8 free; "
        "2 higher-priority jobs ahead (train-a, train-b); would fit if preemptible job victim were preempted"
    )
    assert exp.preempt_to_fit == ("victim",)
    assert exp.ahead == ("train-a", "train-b")


def test_only_lower_priority_jobs_are_offered_as_victims() -> None:
    snap, victim, other = busy_cluster()
    exp = explain_pending(snap, leaf_job(16, priority=5), preemptible=[("victim", victim, 10), ("other", other, 20)])
    assert exp.preempt_to_fit == ()
    assert "would fit" not in exp.message


def test_several_victims_are_named_when_one_is_not_enough() -> None:
    snap = ClusterSnapshot.from_cluster(preset_cluster(HGX_H100, 2, nodes_per_leaf=2))
    a, b = held("node-00", list(range(8))), held("node-01", list(range(8)))
    snap = snap.with_allocation(a).with_allocation(b)
    exp = explain_pending(snap, leaf_job(16), preemptible=[("a", a, 1), ("b", b, 2)])
    assert exp.preempt_to_fit == ("a", "b")
    assert exp.message.endswith("would fit if preemptible jobs a, b were preempted")


def test_a_job_that_can_never_fit_does_not_suggest_preemption() -> None:
    snap, victim, _ = busy_cluster()
    exp = explain_pending(snap, leaf_job(64), preemptible=[("victim", victim, 0)])
    assert exp.constraint == "domain_size" and "can never fit" in exp.message
    assert exp.preempt_to_fit == ()


def test_a_job_that_fits_now_says_so_and_what_it_waits_for() -> None:
    snap = ClusterSnapshot.from_cluster(preset_cluster(HGX_H100, 2))
    exp = explain_pending(snap, leaf_job(8), ahead=["first"])
    assert exp.fits_now and exp.constraint == "queue"
    assert exp.message.startswith("fits now: 8 GPUs on node (node-00)")
    assert "1 higher-priority job ahead (first)" in exp.message


def test_an_invalid_spec_is_explained_not_raised() -> None:
    snap = ClusterSnapshot.from_cluster(preset_cluster(HGX_H100, 1))
    spec = JobSpec(name="tp", ranks=3, resources={"gpus": 2}, topology={"group_gpus": 4})  # type: ignore[arg-type]
    exp = explain_pending(snap, spec)
    assert exp.level == "request" and "multiple of 2 ranks" in exp.message
    assert exp.to_dict()["constraint"] == "spec"
