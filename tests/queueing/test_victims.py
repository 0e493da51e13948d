"""Victim choice: least lost work, verified by placement, whole gangs only, and every protection respected."""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from oneplus_placement.greedy import place_gang
from oneplus_queueing.config import default_config, load_queue_config
from oneplus_queueing.cycle import schedule_cycle
from oneplus_queueing.fairshare import UsageHistory
from oneplus_queueing.model import PendingJob, RunningJob, VictimChoice
from oneplus_queueing.victims import choose_victims
from queueing_world import World, spec, unfloored

RESTART = default_config().preemption.restart_cost_s


def _cost(job: RunningJob, now: float) -> float:
    return job.lost_work_gpu_s(now) + job.gpus * RESTART


def _brute_force(world: World, preemptor: PendingJob, eligible: list[RunningJob], now: float) -> float | None:
    """The least cost over every subset of eligible victims that lets the preemptor be placed."""
    best = None
    for r in range(len(eligible) + 1):
        for combo in itertools.combinations(eligible, r):
            for v in combo:
                world.state.release(v.allocation)
            fits = place_gang(world.state, preemptor.spec).allocation is not None
            for v in combo:
                world.state.apply(v.allocation)
            if fits:
                cost = sum(_cost(v, now) for v in combo)
                best = cost if best is None else min(best, cost)
    return best


def _hand_built() -> World:
    """node-00: A (4 GPUs, checkpointed 10 s ago), B (4 GPUs, 1000 s of work); node-01: C, D (2 GPUs), E (4)."""
    w = World(n_nodes=2, nodes_per_leaf=2)
    w.run("A", [(0, [0, 1, 2, 3])], started=0, checkpoint=990)
    w.run("B", [(0, [4, 5, 6, 7])], started=0)
    w.run("C", [(1, [0, 1])], started=0, checkpoint=900)
    w.run("D", [(1, [2, 3])], started=0, checkpoint=900)
    w.run("E", [(1, [4, 5, 6, 7])], started=0, checkpoint=950)
    return w


def test_the_victim_set_with_the_least_lost_work_is_chosen_on_a_hand_built_cluster() -> None:
    w = _hand_built()
    now = 1000.0
    boss = PendingJob("boss", spec("boss", 8, priority=10), 900.0)
    choice = choose_victims(now, w.state, boss, list(w.running.values()), unfloored())
    assert choice is not None
    # A alone is the cheapest job, but A + B cost 4520 GPU-s; node-01's three jobs cost 1080.
    assert sorted(choice.victims) == ["C", "D", "E"]
    assert choice.lost_work_gpu_s == 2 * 100 + 2 * 100 + 4 * 50 + 8 * RESTART
    assert choice.lost_work_gpu_s == _brute_force(w, boss, list(w.running.values()), now)
    assert choice.nominated.nodes == ["node-01"]
    assert choice.kind == "priority"
    assert choice.freed_gpus == 8


def test_the_state_given_to_choose_victims_is_not_changed() -> None:
    w = _hand_built()
    before = (list(w.state.whole), list(w.state.free))
    choose_victims(
        1000.0,
        w.state,
        PendingJob("boss", spec("boss", 8, priority=10), 0.0),
        list(w.running.values()),
        unfloored(),
    )
    assert (list(w.state.whole), list(w.state.free)) == before


def test_victims_free_a_placeable_domain_not_just_enough_gpus() -> None:
    """16 GPUs required under one leaf: victims spread over two leaves would free enough GPUs but no leaf."""
    w = World(n_nodes=4, nodes_per_leaf=2)
    w.run("cheap-l0", [(0, list(range(8)))], started=990)  # leaf0: cheap, but leaf0's other node is busy too
    w.run("dear-l0", [(1, list(range(8)))], started=0, preemptible=False)
    w.run("cheap-l1", [(2, list(range(8)))], started=980)
    w.run("mid-l1", [(3, list(range(8)))], started=900)
    boss = PendingJob("boss", spec("boss", 8, ranks=2, priority=10, domain="leaf"), 0.0)
    choice = choose_victims(1000.0, w.state, boss, list(w.running.values()), unfloored())
    assert choice is not None
    assert sorted(choice.victims) == ["cheap-l1", "mid-l1"]
    assert choice.nominated.domain == "leaf"
    assert sorted(choice.nominated.nodes) == ["node-02", "node-03"]


def test_non_preemptible_min_runtime_and_lower_priority_rules_are_respected() -> None:
    w = World(n_nodes=1, nodes_per_leaf=1)
    w.run("pinned", [(0, [0, 1, 2, 3])], started=0, preemptible=False)
    w.run("young", [(0, [4, 5])], started=950, min_runtime_s=300)
    w.run("peer", [(0, [6, 7])], started=0, priority=10)
    boss = PendingJob("boss", spec("boss", 2, priority=10), 0.0)
    cfg = unfloored()
    running = list(w.running.values())
    assert choose_victims(1000.0, w.state, boss, running, cfg) is None  # peer has equal priority, young is young
    later = choose_victims(1250.0, w.state, boss, running, cfg)
    assert later is not None and later.victims == ("young",)


def test_by_default_a_victim_gets_an_hour_before_priority_preemption() -> None:
    w = World(n_nodes=1, nodes_per_leaf=1)
    w.run("young", [(0, list(range(8)))], started=1000)
    boss = PendingJob("boss", spec("boss", 8, priority=10), 1000.0)
    running = list(w.running.values())
    assert choose_victims(4599.0, w.state, boss, running, default_config()) is None
    chosen = choose_victims(4600.0, w.state, boss, running, default_config())
    assert chosen is not None and chosen.victims == ("young",) and chosen.kinds == ("priority",)


def test_a_preemptor_held_back_by_protection_is_told_when_and_why() -> None:
    w = World(n_nodes=1, nodes_per_leaf=1)
    w.run("young", [(0, list(range(8)))], started=1000)
    boss = PendingJob("boss", spec("boss", 8, priority=10), 1000.0)
    d = schedule_cycle(1100.0, w.state, [boss], list(w.running.values()), default_config(), UsageHistory())
    assert d.preemptions == [] and d.reservation is not None and d.reservation.start_ts == 4600.0
    msg = d.reasons["boss"].message
    assert "reserved for it from t=4600s, when young may be preempted" in msg
    assert "preemption.min_runtime_s" in msg


def test_a_preemptor_waits_out_the_preemption_delay() -> None:
    w = World(n_nodes=1, nodes_per_leaf=1)
    w.run("low", [(0, list(range(8)))], started=0)
    cfg = load_queue_config("preemption: {min_runtime_s: 0, preemption_delay_s: 60}")
    boss = PendingJob("boss", spec("boss", 8, priority=10), 950.0)
    running = list(w.running.values())
    assert choose_victims(1000.0, w.state, boss, running, cfg) is None
    assert choose_victims(1010.0, w.state, boss, running, cfg) is not None


def test_a_job_preempted_repeatedly_gains_protection() -> None:
    cfg = load_queue_config(
        "preemption: {min_runtime_s: 0, max_preemptions_per_job: 3, restart_cost_s: 60, protection_backoff: 2}"
    )
    boss = PendingJob("boss", spec("boss", 8, priority=10), 0.0)
    for preemptions, started, chosen in [
        (0, 990, True),
        (1, 870, True),
        (1, 900, False),
        (2, 800, False),
        (2, 700, True),
        (3, 0, False),
    ]:
        w = World(n_nodes=1, nodes_per_leaf=1)
        w.run("victim", [(0, list(range(8)))], started=started, preemptions=preemptions)
        got = choose_victims(1000.0, w.state, boss, list(w.running.values()), cfg)
        # protected for 60 s x 2^k after each restart, and never again after the third preemption
        assert (got is not None) == chosen, (preemptions, started)


def test_the_rate_limit_caps_victim_gangs_per_window() -> None:
    cfg = load_queue_config("preemption: {min_runtime_s: 0, rate_limit_gangs: 3, rate_window_s: 300}")
    w = World(n_nodes=1, nodes_per_leaf=1)
    w.run("v1", [(0, [0, 1, 2, 3])], started=0)
    w.run("v2", [(0, [4, 5, 6, 7])], started=0)
    boss = PendingJob("boss", spec("boss", 8, priority=10), 0.0)
    running = list(w.running.values())
    usage = UsageHistory()
    usage.record_preemption(800.0, "x", "y", 1)
    assert choose_victims(1000.0, w.state, boss, running, cfg, usage=usage) is not None  # 1 of 3 used: 2 left
    usage.record_preemption(900.0, "x2", "y", 1)
    assert choose_victims(1000.0, w.state, boss, running, cfg, usage=usage) is None  # a 2-gang set exceeds the 1 left
    assert choose_victims(1101.0, w.state, boss, running, cfg, usage=usage) is not None  # the first slid out


def test_victims_of_a_gang_spanning_nodes_are_whole_gangs() -> None:
    w = World(n_nodes=2, nodes_per_leaf=2)
    gang = w.run("gang", [(0, [0, 1, 2, 3]), (1, [0, 1, 2, 3])], started=0, checkpoint=999)
    w.run("solo", [(0, [4, 5, 6, 7])], started=0)
    w.run("pinned", [(1, [4, 5, 6, 7])], started=0, preemptible=False)
    boss = PendingJob("boss", spec("boss", 8, priority=10), 0.0)
    choice = choose_victims(1000.0, w.state, boss, list(w.running.values()), unfloored())
    # Only node-00 can be freed; the gang goes whole, its ranks on node-01 included.
    assert choice is not None and sorted(choice.victims) == ["gang", "solo"]
    assert choice.nominated.nodes == ["node-00"]
    assert choice.freed_gpus == 12
    _assert_whole(w, choice)
    assert gang.allocation.nodes == ["node-00", "node-01"]


def _assert_whole(w: World, choice: VictimChoice) -> None:
    """Releasing every victim's whole gang makes the nomination fit; no GPU of a non-victim is nominated."""
    victims = [w.running[v] for v in choice.victims]
    others = {
        (r.node, g)
        for j in w.running.values()
        if j.job_id not in choice.victims
        for r in j.allocation.ranks
        for g in r.gpus
    }
    nominated = {(r.node, g) for r in choice.nominated.ranks for g in r.gpus}
    assert not nominated & others
    for v in victims:
        w.state.release(v.allocation)
    w.state.apply(choice.nominated)
    w.state.release(choice.nominated)
    for v in victims:
        w.state.apply(v.allocation)


@st.composite
def _running_world(draw: st.DrawFn) -> tuple[World, list[RunningJob], PendingJob]:
    w = World(n_nodes=3, nodes_per_leaf=3)
    free = {n: list(range(8)) for n in range(3)}
    for k in range(draw(st.integers(4, 12))):
        per_rank = draw(st.sampled_from([1, 2, 2, 4, 4]))
        ranks = draw(st.integers(1, 2))
        nodes = [n for n in range(3) if len(free[n]) >= per_rank]
        if len(nodes) < ranks:
            continue
        where = []
        for n in draw(st.permutations(nodes))[:ranks]:
            where.append((n, free[n][:per_rank]))
            free[n] = free[n][per_rank:]
        w.run(
            f"j{k}",
            where,
            started=float(draw(st.integers(0, 900))),
            priority=draw(st.sampled_from([0, 1, 3])),
            preemptible=draw(st.sampled_from([True, True, False])),
            checkpoint=float(draw(st.integers(900, 1000))),
        )
    size = draw(st.sampled_from([(1, 4), (1, 8), (2, 4), (2, 8), (3, 4), (3, 8)]))
    boss = PendingJob("boss", spec("boss", size[1], ranks=size[0], priority=2), 0.0)
    return w, list(w.running.values()), boss


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_running_world())
def test_victim_gangs_are_never_left_partial_and_the_choice_is_least_lost_work(
    case: tuple[World, list[RunningJob], PendingJob],
) -> None:
    w, running, boss = case
    now = 1000.0
    if place_gang(w.state, boss.spec).allocation is not None:
        return  # it fits already: no one need be preempted
    choice = choose_victims(now, w.state, boss, running, unfloored())
    eligible = [j for j in running if j.spec.preemptible and j.spec.priority < 2]
    best = _brute_force(w, boss, eligible, now)
    if choice is None:
        assert best is None
        return
    assert set(choice.victims) <= {j.job_id for j in eligible}
    _assert_whole(w, choice)
    assert best is not None
    assert choice.lost_work_gpu_s == best or len(eligible) > 6  # exact while every subset gets a trial


def test_victims_free_one_nvlink_domain_for_a_tp_group_that_must_stay_in_one() -> None:
    """Two NVL72 racks under one leaf, each with 16 free trays and two busy ones: a TP-72 gang needs a whole rack.
    The cheap jobs are one in each rack; freeing both would give 72 GPUs under the leaf but in no one rack."""
    from oneplus_contracts import JobSpec
    from oneplus_topology.cluster import synthetic_cluster

    racks = synthetic_cluster(
        36, "gb200_nvl72_compute_tray_4gpu", nodes_per_leaf=36, nodes_per_nvlink_domain=18, prefix="tray"
    )
    w = World(cluster=racks)
    w.run("cheap0", [(0, [0, 1, 2, 3])], started=0, checkpoint=999)
    w.run("cheap1", [(18, [0, 1, 2, 3])], started=0, checkpoint=999)
    w.run("dear0", [(1, [0, 1, 2, 3])], started=0)
    w.run("dear1", [(19, [0, 1, 2, 3])], started=0, checkpoint=500)
    tp72 = JobSpec(name="tp72", ranks=18, priority=10, resources={"gpus": 4}, topology={"group_gpus": 72})  # type: ignore[arg-type]
    choice = choose_victims(1000.0, w.state, PendingJob("tp72", tp72, 900.0), list(w.running.values()), unfloored())
    assert choice is not None
    # Rack 1's pair (4 + 2,000 GPU-s of lost work, and restarts) is cheaper than rack 0's (4 + 4,000).
    assert sorted(choice.victims) == ["cheap1", "dear1"]
