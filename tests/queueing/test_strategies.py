"""Queueing strategies chosen per queue (Kueue's best-effort and strict FIFO), in the cycle the solver and the
simulator share.

Two 8-GPU nodes, each half held. In queue `team`, `big` (a whole node, submitted first) cannot start, and one node
is reserved for it; `small` (2 GPUs, submitted later) fits on the other. Best effort: `small` starts. Strict:
`small` waits behind `big`, and a job of another queue that fits still starts.
"""

from __future__ import annotations

import pytest
from oneplus_queueing.config import QueueConfig, QueueConfigError, load_queue_config
from oneplus_queueing.cycle import schedule_cycle
from oneplus_queueing.fairshare import UsageHistory
from oneplus_queueing.model import PendingJob
from oneplus_queueing.ordering import RankedJob
from oneplus_queueing.report import queues_rows
from oneplus_queueing.strategies import STRATEGIES, serving_order
from queueing_world import World, spec

QUEUES = """
queues:
  - {name: team, queueing: %s}
  - {name: other}
job_size: {weight: 0}
"""


def config(strategy: str) -> QueueConfig:
    return load_queue_config(QUEUES % strategy)


def world() -> World:
    w = World(n_nodes=2, nodes_per_leaf=2)
    w.run("r0", [(0, [0, 1, 2, 3])], started=0, queue="other")
    w.run("r1", [(1, [0, 1, 2, 3])], started=0, queue="other")
    return w


BIG = PendingJob("big", spec("big", 8, queue="team"), 10.0)
SMALL = PendingJob("small", spec("small", 2, queue="team"), 20.0)
ELSEWHERE = PendingJob("elsewhere", spec("elsewhere", 1, queue="other"), 30.0)


def cycle(strategy: str, *pending: PendingJob):  # type: ignore[no-untyped-def]
    w = world()
    return schedule_cycle(100.0, w.state, list(pending), list(w.running.values()), config(strategy), UsageHistory())


def test_best_effort_lets_a_later_job_that_fits_start_past_one_that_waits() -> None:
    d = cycle("best-effort-fifo", BIG, SMALL)
    assert set(d.placements) == {"small"}
    assert d.reasons["big"].code == "Topology", "8 GPUs free in all, none of them a whole node"


def test_strict_fifo_holds_the_queue_behind_its_first_waiting_job_and_leaves_other_queues_alone() -> None:
    d = cycle("strict-fifo", BIG, SMALL, ELSEWHERE)
    assert set(d.placements) == {"elsewhere"}, "the other queue's job fits and is not held back"
    assert d.reasons["small"].code == "Priority"
    assert d.reasons["small"].message == "queue team is strict-fifo: it waits behind big"
    assert d.reasons["big"].code == "Topology", "8 GPUs free in all, none of them a whole node"


def test_strict_fifo_serves_its_queue_by_priority_then_submission_whatever_the_scores() -> None:
    # `late` scores higher (fair share, age and size aside, its spec priority is the same): submission decides.
    early = PendingJob("early", spec("early", 2, queue="team"), 50.0)
    late = PendingJob("late", spec("late", 2, queue="team"), 60.0)
    urgent = PendingJob("urgent", spec("urgent", 2, queue="team", priority=5), 70.0)
    other = PendingJob("o", spec("o", 1, queue="other"), 55.0)
    ranked = [
        RankedJob(j, j.spec.priority, True, s) for j, s in ((late, 9.0), (other, 8.0), (early, 7.0), (urgent, 6.0))
    ]
    order = [r.job_id for r in serving_order(ranked, config("strict-fifo"))]
    assert order == ["urgent", "o", "early", "late"], "the queue's jobs take its places in priority, then age order"
    assert [r.job_id for r in serving_order(ranked, config("best-effort-fifo"))] == ["late", "o", "early", "urgent"]


def test_the_strategy_is_checked_in_the_config_and_shown_per_queue() -> None:
    with pytest.raises(QueueConfigError, match="queueing"):
        load_queue_config("queues: [{name: team, queueing: lifo}]\n")
    assert sorted(STRATEGIES) == ["best-effort-fifo", "strict-fifo"]
    rows = {r.queue: r for r in queues_rows(0.0, config("strict-fifo"), [], [], UsageHistory())}
    assert rows["team"].queueing == "strict-fifo" and rows["other"].queueing == "best-effort-fifo"
    assert rows["team"].cells()[-1] == "strict-fifo"
