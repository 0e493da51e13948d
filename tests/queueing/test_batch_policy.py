"""`placement: cp-sat`: a queue's first waiting jobs placed jointly in the cycle the solver and the simulator share.

Hand-checked world: 8 empty 8-GPU nodes and, in arrival order, eight 2-GPU jobs then eight 6-GPU jobs. Best fit one
by one packs the 2-GPU jobs four to a node (two nodes), so only six 6-GPU jobs fit: 52 of 64 GPUs. Jointly, every
node takes one 2-GPU and one 6-GPU job: 64 of 64.
"""

from __future__ import annotations

import pytest
from oneplus_queueing.config import QueueConfig, load_queue_config
from oneplus_queueing.cycle import schedule_cycle
from oneplus_queueing.fairshare import UsageHistory
from oneplus_queueing.model import CycleDecision, PendingJob
from pydantic import ValidationError
from queueing_world import World, spec

QUEUES = """
queues:
  - {name: team, placement: %s}
  - {name: other}
job_size: {weight: 0}
batch: {time_limit_s: 2.0}
"""
NOW = 1000.0


def config(placement: str, extra: str = "") -> QueueConfig:
    return load_queue_config(QUEUES % placement + extra)


def jobs(queue: str = "team", first_ts: float = NOW - 100) -> list[PendingJob]:
    sizes = [2] * 8 + [6] * 8
    return [PendingJob(f"j{i:02d}", spec(f"j{i:02d}", g, queue=queue), first_ts + i) for i, g in enumerate(sizes)]


def cycle(cfg: QueueConfig, pending: list[PendingJob], world: World | None = None) -> CycleDecision:
    w = world or World(n_nodes=8, nodes_per_leaf=8)
    return schedule_cycle(NOW, w.state, pending, list(w.running.values()), cfg, UsageHistory())


def gpus(d: CycleDecision) -> int:
    return sum(len(r.gpus) for a in d.placements.values() for r in a.ranks)


def test_best_fit_one_by_one_strands_what_the_joint_plan_places() -> None:
    best_fit = cycle(config("best-fit"), jobs())
    assert gpus(best_fit) == 52 and len(best_fit.placements) == 14
    joint = cycle(config("cp-sat"), jobs())
    assert joint.stats.batch_solves == 1
    assert gpus(joint) == 64 and len(joint.placements) == 16
    nodes = [a.ranks[0].node for a in joint.placements.values()]
    assert all(nodes.count(n) == 2 for n in set(nodes)), "one 2-GPU and one 6-GPU job on every node"


def test_a_job_the_plan_leaves_out_waits_with_a_reason_naming_the_batch() -> None:
    # Twelve 6-GPU jobs after the eight 2-GPU ones: 64 GPUs cannot hold them all; the joint plan keeps 2+6 pairs.
    pending = jobs() + [PendingJob(f"k{i}", spec(f"k{i}", 6, queue="team"), NOW - 50 + i) for i in range(4)]
    d = cycle(config("cp-sat"), pending)
    assert gpus(d) == 64
    waiting = [j.job_id for j in pending if j.job_id not in d.placements]
    assert waiting and all(d.reasons[j].code == "Resources" for j in waiting)
    assert all("places its first waiting jobs jointly (cp-sat)" in d.reasons[j].message for j in waiting)
    assert "64 GPUs placed, against 52 one by one" in d.reasons[waiting[0]].message


def test_a_window_best_fit_places_whole_never_runs_cp_sat() -> None:
    pending = jobs()[:8]  # the 2-GPU jobs alone fit anywhere
    d = cycle(config("cp-sat"), pending)
    assert d.stats.batch_solves == 0 and len(d.placements) == 8


def test_jobs_waiting_longer_than_max_wait_are_served_by_best_fit_first() -> None:
    # Submitted long ago: out of the window, so best fit serves them in order and the plan never forms.
    d = cycle(config("cp-sat"), jobs(first_ts=0.0))
    assert d.stats.batch_solves == 0 and gpus(d) == 52


def test_a_plan_whose_gpus_an_earlier_job_took_is_dropped_for_best_fit() -> None:
    # A job of another queue, served first (higher priority), takes a whole node the plan had counted on.
    first = PendingJob("urgent", spec("urgent", 8, queue="other", priority=100), NOW - 500)
    d = cycle(config("cp-sat"), [first, *jobs()])
    assert "urgent" in d.placements
    held = [j for j in d.placements if j != "urgent"]
    assert len(held) >= 12, "the rest of the queue still placed, by the plan or by best fit"
    world = World(n_nodes=8, nodes_per_leaf=8)
    for alloc in d.placements.values():
        world.state.apply(alloc)  # raises if any GPU was given twice


def test_other_queues_keep_best_fit() -> None:
    d = cycle(config("cp-sat"), jobs(queue="other"))
    assert d.stats.batch_solves == 0 and gpus(d) == 52


@pytest.mark.parametrize(
    ("batch", "field"),
    [("{window: 1}", "window"), ("{time_limit_s: 0}", "time_limit_s"), ("{max_wait_s: -1}", "max_wait_s")],
)
def test_bad_batch_settings_are_refused_by_name(batch: str, field: str) -> None:
    with pytest.raises((ValidationError, ValueError), match=field):
        load_queue_config(f"queues: [{{name: team, placement: cp-sat}}]\nbatch: {batch}\n")
