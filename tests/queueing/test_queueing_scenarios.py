"""The issue's scenarios on the pure policy, with a real cluster state and the real placement."""

from __future__ import annotations

import random

import pytest
from oneplus_queueing.config import default_config, load_queue_config
from oneplus_queueing.cycle import schedule_cycle
from oneplus_queueing.fairshare import UsageHistory
from oneplus_queueing.model import PendingJob
from queueing_world import Loop, World, spec, unfloored

TWO_QUEUES = """
queues:
  - {name: alpha, guarantee_gpus: 8}
  - {name: beta, guarantee_gpus: 8}
"""


def test_no_starvation_under_a_steady_stream_of_small_jobs() -> None:
    """A 16-GPU gang waiting behind a stream of 1-GPU jobs starts within one time limit of becoming the head."""
    world = World(n_nodes=2, nodes_per_leaf=2)
    loop = Loop(world, default_config())
    rng = random.Random(7)
    for n, t in enumerate(range(0, 1000, 5)):  # a new small job every 5 s, with a 30-120 s limit it mostly uses
        limit = rng.choice([30, 60, 120])
        job = PendingJob(f"small-{n:04d}", spec(f"small-{n:04d}", 1, time_limit_s=limit), float(t))
        loop.submit(float(t), job, rng.uniform(0.5, 1.0) * limit)
        if t == 200:
            big = PendingJob("big", spec("big", 8, ranks=2, time_limit_s=300), float(t))
            loop.submit(float(t), big, 300.0)
    loop.run_until(1000)
    assert "big" in loop.started_at, "the big gang starved"
    assert loop.started_at["big"] <= 200 + 120 + 1e-6
    # It had a protected block from the moment it was the head, and small jobs kept running meanwhile.
    first = next(d for d in loop.decisions if d.reservation is not None and d.reservation.job_id == "big")
    assert first.reservation is not None and first.reservation.start_ts is not None
    assert loop.started_at["big"] <= first.reservation.start_ts
    backfilled = [j for j, t in loop.started_at.items() if j.startswith("small") and 200 < t < loop.started_at["big"]]
    assert backfilled, "nothing was backfilled while the gang waited"


@pytest.mark.parametrize("ageing_weight", [0, 5000])
def test_ageing_lets_a_low_priority_gang_overtake_a_stream_of_higher_priority_jobs(ageing_weight: int) -> None:
    """Nothing waits forever: age alone lifts the gang to the head; without ageing the same stream starves it."""
    world = World(n_nodes=2, nodes_per_leaf=2)
    cfg = load_queue_config(
        f"priority_classes: {{small: {{value: 5000}}}}\nageing: {{weight: {ageing_weight}, period_s: 300}}"
    )
    loop = Loop(world, cfg)
    for i, t in enumerate(range(0, 1500, 5)):
        s = spec(f"s{i:03d}", 1, time_limit_s=60, priority_class="small")
        loop.submit(float(t), PendingJob(f"s{i:03d}", s, float(t)), 60.0)
    big = spec("big", 8, ranks=2, time_limit_s=300, preemptible=False)  # else the stream's priority evicts it
    loop.submit(100.0, PendingJob("big", big, 100.0), 300.0)
    loop.run_until(1500)
    if ageing_weight:
        assert "big" in loop.started_at
        # It overtakes once it has waited 300 s longer than a waiting small job, then waits one time limit.
        assert loop.started_at["big"] <= 100 + 300 + 60 + 60 + 1e-6
    else:
        assert "big" not in loop.started_at


def test_a_queues_guarantee_is_restored_by_reclaim_within_one_cycle() -> None:
    cfg = load_queue_config(TWO_QUEUES)  # the default hour of victim protection does not hold back reclaim
    world = World(n_nodes=2, nodes_per_leaf=2)
    # beta borrowed the whole cluster: four 4-GPU jobs, each of higher priority than alpha's.
    for k, (node, gpus, ckpt) in enumerate(
        [(0, range(4), 900), (0, range(4, 8), 500), (1, range(4), 990), (1, range(4, 8), 100)]
    ):
        world.run(f"b{k}", [(node, list(gpus))], queue="beta", priority=50, started=0, checkpoint=ckpt)
    pending = [PendingJob(f"a{k}", spec(f"a{k}", 4, queue="alpha"), 990.0 + k) for k in range(2)]
    d = schedule_cycle(1000.0, world.state, pending, list(world.running.values()), cfg, UsageHistory())
    assert {c.preemptor for c in d.preemptions} == {"a0", "a1"}
    victims = {v for c in d.preemptions for v in c.victims}
    assert all(c.kind == "reclaim" for c in d.preemptions)
    # The two jobs with the newest checkpoints lose the least work, and beta keeps exactly its guarantee.
    assert victims == {"b0", "b2"}
    assert {j: d.reasons[j].code for j in ("a0", "a1")} == {"a0": "Preempting", "a1": "Preempting"}
    for v in victims:
        world.finish(v)
    running = list(world.running.values())
    d2 = schedule_cycle(1001.0, world.state, pending, running, cfg, UsageHistory(), carry=d.carry)
    assert set(d2.placements) == {"a0", "a1"}
    for c in d.preemptions:  # each preemptor lands on exactly the GPUs nominated for it
        assert d2.placements[c.preemptor] == c.nominated


def test_reclaim_still_honours_the_borrowers_own_minimum_run_time() -> None:
    cfg = load_queue_config("queues: [{name: alpha, guarantee_gpus: 4}, {name: beta, guarantee_gpus: 4}]")
    world = World(n_nodes=1, nodes_per_leaf=1)  # beta borrows alpha's 4 GPUs
    world.run("b0", [(0, list(range(8)))], queue="beta", priority=50, started=0, min_runtime_s=2000)
    pending = [PendingJob("a0", spec("a0", 4, queue="alpha"), 990.0)]
    d = schedule_cycle(1000.0, world.state, pending, list(world.running.values()), cfg, UsageHistory())
    assert d.preemptions == []
    d = schedule_cycle(2000.0, world.state, pending, list(world.running.values()), cfg, UsageHistory())
    assert [(c.victims, c.kind) for c in d.preemptions] == [(("b0",), "reclaim")]


def test_reclaim_never_takes_a_queue_below_its_guarantee() -> None:
    cfg = unfloored(load_queue_config(TWO_QUEUES))  # the urgent job evicts a-old within seconds of its start
    world = World(n_nodes=2, nodes_per_leaf=2)
    world.run("b0", [(0, list(range(8)))], queue="beta", started=0)  # beta at exactly its guarantee
    world.run("a-old", [(1, list(range(8)))], queue="alpha", started=0)
    late = PendingJob("a-new", spec("a-new", 4, queue="alpha"), 10.0)
    d = schedule_cycle(10.0, world.state, [late], list(world.running.values()), cfg, UsageHistory())
    assert d.preemptions == []
    assert d.reasons["a-new"].code == "Resources"
    # With a higher priority it may evict its own queue's job, still never beta's.
    urgent = PendingJob("a-new", spec("a-new", 4, queue="alpha", priority=100), 10.0)
    d = schedule_cycle(10.0, world.state, [urgent], list(world.running.values()), cfg, UsageHistory())
    assert [c.victims for c in d.preemptions] == [("a-old",)]


@pytest.mark.parametrize("seed", range(12))
def test_backfill_never_delays_the_protected_job(seed: int) -> None:
    rng = random.Random(seed)
    world = World(n_nodes=4, nodes_per_leaf=2)
    cfg = load_queue_config(
        "priority_classes: {scavenger: {value: 0}, normal: {value: 100}}\n"
        "default_priority_class: normal\nageing: {weight: 10}"
    )
    loop = Loop(world, cfg)
    # Fill the cluster with gangs of various time limits that really end earlier or on time.
    t = 0.0
    for i in range(10):
        limit = rng.choice([100, 200, 400])
        job = PendingJob(f"fill{i}", spec(f"fill{i}", rng.choice([2, 4, 8]), time_limit_s=limit), t)
        loop.submit(t, job, rng.uniform(0.5, 1.0) * limit)
    head = PendingJob("head", spec("head", 8, ranks=3, time_limit_s=500, domain="spine"), 1.0)
    loop.submit(1.0, head, 500.0)
    for i in range(60):  # a stream of small jobs: some end quickly, some are scavengers with no limit
        at = 1.0 + i * rng.uniform(2, 10)
        scav = rng.random() < 0.3
        s = spec(
            f"bf{i}",
            rng.choice([1, 2, 4]),
            priority_class="scavenger" if scav else None,
            time_limit_s=None if scav else rng.choice([30, 60, 300, 1000]),
        )
        loop.submit(at, PendingJob(f"bf{i}", s, at), rng.uniform(10, 300))
    loop.run_until(5000)
    promised = [
        d.reservation.start_ts
        for d in loop.decisions
        if d.reservation is not None and d.reservation.job_id == "head" and d.reservation.start_ts
    ]
    assert "head" in loop.started_at
    if promised:  # the first promise is an upper bound on the real start, and no later promise is later
        assert loop.started_at["head"] <= promised[0] + 1e-6
        assert max(promised) <= promised[0] + 1e-6


ORGS = """
queues:
  - {name: orgA, guarantee_gpus: 8}
  - {name: a1, parent: orgA, guarantee_gpus: 4}
  - {name: a2, parent: orgA, guarantee_gpus: 4}
  - {name: orgB, guarantee_gpus: 8}
  - {name: b1, parent: orgB, guarantee_gpus: 8}
"""


def test_reclaim_works_at_every_level_of_the_tree() -> None:
    cfg = load_queue_config(ORGS)
    # Across organisations: orgB borrowed orgA's half of the cluster.
    w = World(n_nodes=2, nodes_per_leaf=2)
    w.run("b-x", [(0, list(range(8)))], queue="b1", started=0, priority=100)
    w.run("b-y", [(1, list(range(8)))], queue="b1", started=0, priority=100)
    d = schedule_cycle(
        100.0, w.state, [PendingJob("a", spec("a", 4, queue="a1"), 0.0)], list(w.running.values()), cfg, UsageHistory()
    )
    assert [(c.victims, c.kind) for c in d.preemptions] == [(("b-x",), "reclaim")]
    # Inside an organisation: team a2 borrowed its sibling's guarantee; orgB is within its own and is left alone.
    w = World(n_nodes=2, nodes_per_leaf=2)
    w.run("a2-x", [(0, [0, 1, 2, 3])], queue="a2", started=0, priority=100)
    w.run("a2-y", [(0, [4, 5, 6, 7])], queue="a2", started=50, priority=100)
    w.run("b-z", [(1, list(range(8)))], queue="b1", started=0)
    d = schedule_cycle(
        100.0, w.state, [PendingJob("a", spec("a", 4, queue="a1"), 0.0)], list(w.running.values()), cfg, UsageHistory()
    )
    assert [(c.victims, c.kind) for c in d.preemptions] == [(("a2-y",), "reclaim")]  # less work lost than a2-x
