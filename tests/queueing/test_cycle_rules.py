"""One cycle's rules: quotas and borrowing, reasons, nominations, in-flight preemptions, fair share, bounded work."""

from __future__ import annotations

import pytest
from oneplus_contracts import Allocation, JobSpec, RankPlacement
from oneplus_queueing.config import BackfillPolicy, JobSizePolicy, QueueConfig, default_config, load_queue_config
from oneplus_queueing.cycle import schedule_cycle
from oneplus_queueing.fairshare import UsageHistory
from oneplus_queueing.model import CycleCarry, PendingJob
from oneplus_topology.cluster import synthetic_cluster
from pydantic import ValidationError
from queueing_world import World, spec

TEAMS = """
queues:
  - {name: org, guarantee_gpus: 16, borrow_limit_gpus: 0}
  - {name: red, parent: org, guarantee_gpus: 4, borrow_limit_gpus: 4}
  - {name: blue, parent: org, guarantee_gpus: 8}
  - {name: other}
"""


def by_age(cfg: QueueConfig) -> QueueConfig:
    """The config with the job-size factor off: these rules act on a head chosen by age, whatever the job sizes."""
    return cfg.model_copy(update={"job_size": JobSizePolicy(weight=0)})


def _cycle(w: World, pending: list[PendingJob], cfg=None, now: float = 100.0, **kw):  # type: ignore[no-untyped-def]
    cfg = cfg or by_age(default_config())
    return schedule_cycle(now, w.state, pending, list(w.running.values()), cfg, kw.pop("usage", UsageHistory()), **kw)


def test_a_queue_borrows_up_to_its_limit_then_gets_quota_exceeded() -> None:
    w = World(n_nodes=4, nodes_per_leaf=2)
    cfg = load_queue_config(TEAMS)
    jobs = [PendingJob(f"r{i}", spec(f"r{i}", 2, queue="red"), float(i)) for i in range(5)]
    d = _cycle(w, jobs, cfg)
    assert sorted(d.placements) == ["r0", "r1", "r2", "r3"]  # guarantee 4 + borrow 4 = 8 GPUs
    assert d.reasons["r4"].code == "QuotaExceeded"
    assert "queue red holds 8 GPUs; 2 more would exceed its limit of 8" in d.reasons["r4"].message


def test_an_organisation_limit_binds_its_teams_together() -> None:
    w = World(n_nodes=4, nodes_per_leaf=2)
    cfg = by_age(load_queue_config(TEAMS))
    jobs = [
        PendingJob("b0", spec("b0", 8, ranks=2, queue="blue"), 0.0),
        PendingJob("r0", spec("r0", 2, queue="red"), 1.0),
        PendingJob("o0", spec("o0", 8, queue="other"), 2.0),
    ]
    d = _cycle(w, jobs, cfg)
    assert set(d.placements) == {"b0", "o0"}
    assert d.reasons["r0"].code == "QuotaExceeded"
    assert "queue org holds 16 GPUs" in d.reasons["r0"].message


def test_unknown_queue_and_priority_class_get_invalid_queue_and_others_still_run() -> None:
    w = World()
    jobs = [
        PendingJob("lost", spec("lost", 1, queue="nowhere"), 0.0),
        PendingJob("odd", spec("odd", 1, priority_class="vip"), 0.0),
        PendingJob("fine", spec("fine", 1), 0.0),
    ]
    d = _cycle(w, jobs)
    assert d.reasons["lost"].code == "InvalidQueue" and "unknown queue 'nowhere'" in d.reasons["lost"].message
    assert d.reasons["odd"].code == "InvalidQueue" and "unknown priority class 'vip'" in d.reasons["odd"].message
    assert list(d.placements) == ["fine"]


def test_topology_reason_when_gpus_are_free_but_not_in_one_leaf() -> None:
    w = World(n_nodes=4, nodes_per_leaf=2)
    w.run("x", [(0, list(range(8)))], started=0, preemptible=False)
    w.run("y", [(2, list(range(8)))], started=0, preemptible=False)
    d = _cycle(w, [PendingJob("tp", spec("tp", 8, ranks=2, domain="leaf"), 0.0)])
    assert d.reasons["tp"].code == "Topology"
    assert "under one leaf" in d.reasons["tp"].message
    d = _cycle(w, [PendingJob("big", spec("big", 8, ranks=3), 0.0)])
    assert d.reasons["big"].code == "Resources"


def test_a_job_that_would_delay_the_protected_job_waits_with_reason_priority() -> None:
    w = World(n_nodes=2, nodes_per_leaf=2)
    w.run("long", [(0, list(range(8)))], started=0, time_limit_s=1000, preemptible=False)
    w.run("short", [(1, [0, 1, 2, 3])], started=0, time_limit_s=200, preemptible=False)
    head = PendingJob("head", spec("head", 8, ranks=2, preemptible=False), 0.0)
    slow = PendingJob("slow", spec("slow", 4, time_limit_s=1000, preemptible=False), 1.0)
    quick = PendingJob("quick", spec("quick", 4, time_limit_s=50, preemptible=False), 2.0)
    d = _cycle(w, [head, slow, quick])
    assert d.reservation is not None and d.reservation.job_id == "head"
    assert d.reservation.start_ts == 1000 and d.reservation.domain == "leaf"
    assert d.reasons["slow"].code == "Priority" and "reserved for head" in d.reasons["slow"].message
    assert "quick" in d.placements  # ends at 150, before the reserved start
    assert "reserved for it from t=1000s" in d.reasons["head"].message


def test_a_start_is_unknown_when_a_blocker_has_no_time_limit() -> None:
    w = World(n_nodes=1, nodes_per_leaf=1)
    w.run("forever", [(0, list(range(8)))], started=0, preemptible=False)
    d = _cycle(w, [PendingJob("head", spec("head", 8), 0.0), PendingJob("bf", spec("bf", 1, time_limit_s=1), 1.0)])
    assert d.reservation is not None and d.reservation.start_ts is None
    assert "once jobs without a time limit end" in d.reasons["head"].message
    assert d.reasons["bf"].code == "Resources"


def test_nominated_gpus_are_not_given_to_anyone_else_in_the_same_cycle() -> None:
    w = World(n_nodes=1, nodes_per_leaf=1)
    w.run("low", [(0, [0, 1, 2, 3])], started=-3600)  # past the default hour a victim is protected
    boss = PendingJob("boss", spec("boss", 8, priority=10), 0.0)
    small = PendingJob("small", spec("small", 2, priority=5), 1.0)
    d = _cycle(w, [boss, small])
    assert [c.victims for c in d.preemptions] == [("low",)]
    assert d.reasons["boss"].code == "Preempting"
    assert d.nominations["boss"].ranks[0].gpus == list(range(8))
    assert "small" not in d.placements  # the 4 free GPUs are the boss's now


def test_in_flight_victims_are_not_chosen_twice_and_their_gpus_stay_nominated() -> None:
    w = World(n_nodes=1, nodes_per_leaf=1)
    w.run("low", [(0, [0, 1, 2, 3])], started=-3600)  # past the default hour a victim is protected
    boss = PendingJob("boss", spec("boss", 8, priority=10), 0.0)
    small = PendingJob("small", spec("small", 2, priority=5), 1.0)
    first = _cycle(w, [boss, small])
    # The victim is checkpointing (PREEMPTING) when the next cycle runs.
    w.finish("low")
    w.run("low", [(0, [0, 1, 2, 3])], started=-3600, preempting=True)
    second = _cycle(w, [boss, small], now=101.0, carry=first.carry)
    assert second.preemptions == []
    assert second.reasons["boss"].code == "Preempting" and "waiting for low" in second.reasons["boss"].message
    assert "small" not in second.placements
    # Without the carried nomination the boss still claims the GPUs being freed first, as the top of the queue.
    third = _cycle(w, [boss, small], now=101.0)
    assert third.preemptions == [] and "small" not in third.placements
    w.finish("low")
    fourth = _cycle(w, [boss, small], now=102.0, carry=second.carry)
    assert fourth.placements["boss"] == first.nominations["boss"]


def test_a_stale_nomination_is_dropped() -> None:
    w = World(n_nodes=1, nodes_per_leaf=1)
    w.run("squatter", [(0, [0, 1])], started=0, preemptible=False)
    stale = Allocation(ranks=[RankPlacement(rank=0, node="node-00", gpus=[0, 1, 2, 3])])
    d = _cycle(w, [PendingJob("p", spec("p", 4), 0.0)], carry=CycleCarry(nominations={"p": stale}))
    assert d.placements["p"].ranks[0].gpus != [0, 1, 2, 3]


def test_fair_share_serves_the_queue_that_used_less_first() -> None:
    w = World(n_nodes=1, nodes_per_leaf=1)
    cfg = load_queue_config("queues: [{name: a}, {name: b}]")
    usage = UsageHistory(usage={"a": 1e6, "b": 10.0}, as_of=0.0)
    jobs = [
        PendingJob("from-a", spec("from-a", 8, queue="a"), 0.0),
        PendingJob("from-b", spec("from-b", 8, queue="b"), 5.0),
    ]
    d = _cycle(w, jobs, cfg, usage=usage)
    assert d.order == ["from-b", "from-a"]
    assert list(d.placements) == ["from-b"]


def test_the_rate_limit_spans_all_wishes_of_a_cycle() -> None:
    w = World(n_nodes=2, nodes_per_leaf=2)
    for k in range(4):
        w.run(f"low{k}", [(k // 2, [4 * (k % 2) + i for i in range(4)])], started=-3600)
    cfg = load_queue_config("preemption: {rate_limit_gangs: 2}")
    bosses = [PendingJob(f"boss{k}", spec(f"boss{k}", 4, priority=10), float(k)) for k in range(4)]
    d = _cycle(w, bosses, cfg)
    assert sum(len(c.victims) for c in d.preemptions) == 2


def test_a_full_cluster_and_thousands_of_pending_jobs_cost_few_placements() -> None:
    w = World(n_nodes=2, nodes_per_leaf=2)
    w.run("hog", [(0, list(range(8))), (1, list(range(8)))], started=0, preemptible=False, time_limit_s=100)
    jobs = [PendingJob(f"j{i:04d}", spec(f"j{i:04d}", 1 + i % 4, time_limit_s=50), float(i)) for i in range(3000)]
    d = _cycle(w, jobs)
    assert len(d.reasons) == 3000 and not d.placements
    assert d.stats.placement_calls <= 10
    codes = {r.code for r in d.reasons.values()}
    assert codes == {"Resources", "Priority"}


def test_backfill_examines_only_the_first_jobs_behind_the_head() -> None:
    w = World(n_nodes=1, nodes_per_leaf=1)
    w.run("hog", [(0, list(range(6)))], started=0, preemptible=False, time_limit_s=100)
    cfg = by_age(load_queue_config("backfill: {scan_limit: 2}"))
    jobs = [PendingJob("head", spec("head", 8), 0.0)]
    jobs += [PendingJob(f"s{i}", spec(f"s{i}", 4, time_limit_s=10), 1.0 + i) for i in range(5)]
    d = _cycle(w, jobs, cfg)
    assert d.reservation is not None and d.reservation.job_id == "head"
    assert {j: d.reasons[j].code for j in ("s2", "s3", "s4")} == dict.fromkeys(("s2", "s3", "s4"), "Priority")
    assert "backfill looks at the first 2 behind the protected job head" in d.reasons["s4"].message


def test_a_cycle_is_a_pure_function_of_its_inputs() -> None:
    w = World(n_nodes=4, nodes_per_leaf=2)
    w.run("low", [(0, list(range(8)))], started=0)
    w.run("mid", [(1, list(range(4)))], started=0, priority=5, time_limit_s=500)
    before = (list(w.state.whole), list(w.state.free), list(w.state.cpu_used))
    jobs = [PendingJob("boss", spec("boss", 8, ranks=3, priority=10), 0.0)]
    jobs += [PendingJob(f"s{i}", spec(f"s{i}", 1 + i % 3, time_limit_s=50 * (i + 1)), float(i)) for i in range(8)]
    a = _cycle(w, jobs, seed=3)
    b = _cycle(w, list(reversed(jobs)), seed=3)
    assert (list(w.state.whole), list(w.state.free), list(w.state.cpu_used)) == before
    assert a.placements == b.placements and a.order == b.order
    assert [(c.preemptor, c.victims) for c in a.preemptions] == [(c.preemptor, c.victims) for c in b.preemptions]
    assert a.reservation == b.reservation and a.reasons == b.reasons


def test_favouring_small_requests_serves_fewer_gpu_hours_first_and_ageing_still_lifts_the_big_one() -> None:
    w = World(n_nodes=1, nodes_per_leaf=1)
    w.run("busy", [(0, list(range(6)))], started=0, time_limit_s=10_000, preemptible=False)
    big = PendingJob("big", spec("big", 2, time_limit_s=36_000), 0.0)  # 20 GPU-hours, waiting longer
    small = PendingJob("small", spec("small", 1, time_limit_s=3_600), 50.0)  # 1 GPU-hour
    fifo = _cycle(w, [big, small])
    assert fifo.order == ["big", "small"] and list(fifo.placements) == ["big"]
    by_default = _cycle(w, [big, small], default_config())  # the default weighs sizes (2,000 a decade)
    assert by_default.order == ["small", "big"] and list(by_default.placements) == ["small"]
    cfg = default_config().model_copy(update={"job_size": JobSizePolicy(weight=1000)})
    favour = _cycle(w, [big, small], cfg)
    assert favour.order == ["small", "big"] and list(favour.placements) == ["small"]
    # log10(20) × 1000 = 1301 points behind; ageing gives 1000 a day, so after 1.3 days it leads a fresh small one.
    now = 1.31 * 86_400
    fresh = PendingJob("fresh", spec("fresh", 1, time_limit_s=3_600), now)
    assert _cycle(w, [big, fresh], cfg, now=now).order == ["big", "fresh"]
    assert _cycle(w, [big, fresh], cfg, now=1.29 * 86_400).order == ["fresh", "big"]
    with pytest.raises(ValidationError):
        JobSizePolicy(weight=-1)


def test_a_blocked_job_is_protected_only_once_it_has_waited_min_age_reserve() -> None:
    w = World(n_nodes=1, nodes_per_leaf=1)
    w.run("busy", [(0, [0, 1, 2, 3])], started=0, time_limit_s=1_000, preemptible=False)
    head = PendingJob("head", spec("head", 8, preemptible=False), 0.0)
    slow = PendingJob("slow", spec("slow", 4, time_limit_s=5_000, preemptible=False), 1.0)
    d = _cycle(w, [head, slow])
    assert d.reservation is not None and d.reservation.job_id == "head" and "slow" not in d.placements
    cfg = by_age(default_config()).model_copy(update={"backfill": BackfillPolicy(min_age_reserve_s=600)})
    young = _cycle(w, [head, slow], cfg, now=100.0)
    assert young.reservation is None and list(young.placements) == ["slow"]
    assert young.reasons["head"].code == "Resources"
    old = _cycle(w, [head, slow], cfg, now=700.0)
    assert old.reservation is not None and old.reservation.job_id == "head" and "slow" not in old.placements


def test_the_protected_job_stays_ahead_of_higher_scoring_newcomers_of_its_priority() -> None:
    w = World(n_nodes=1, nodes_per_leaf=1)
    w.run("busy", [(0, [0, 1, 2, 3])], started=0, time_limit_s=1_000, preemptible=False)
    big = PendingJob("big", spec("big", 8, time_limit_s=3_600, preemptible=False), 0.0)  # 8 GPU-hours
    first = _cycle(w, [big], default_config(), now=100.0)
    assert first.reservation is not None and first.reservation.job_id == "big"
    assert first.reservation.start_ts == 1_000.0 and first.carry.protected == "big"
    # A newcomer asking fewer GPU-hours scores higher under the job-size factor (the default).
    small = PendingJob("small", spec("small", 2, time_limit_s=3_600, preemptible=False), 101.0)
    loose = _cycle(w, [big, small], default_config(), now=101.0)
    assert loose.order == ["small", "big"] and "small" in loose.placements  # without the carry the promise slips
    assert loose.reservation is not None and loose.reservation.start_ts is not None
    assert loose.reservation.start_ts > 1_000.0
    kept = _cycle(w, [big, small], default_config(), now=101.0, carry=first.carry)
    assert kept.order == ["big", "small"] and kept.placements == {}
    assert kept.reservation is not None and kept.reservation.job_id == "big" and kept.reservation.start_ts == 1_000.0
    assert kept.reasons["small"].code == "Priority"
    # A job of a higher priority still goes first: it could evict the protected job anyway.
    urgent = PendingJob("urgent", spec("urgent", 2, priority=10, time_limit_s=3_600, preemptible=False), 101.0)
    d = _cycle(w, [big, urgent], default_config(), now=101.0, carry=first.carry)
    assert d.order == ["urgent", "big"] and "urgent" in d.placements


def _nvl72_world() -> World:
    racks = synthetic_cluster(
        36, "gb200_nvl72_compute_tray_4gpu", nodes_per_leaf=36, nodes_per_nvlink_domain=18, prefix="tray"
    )
    return World(cluster=racks)


def test_the_cycle_places_a_tp_group_over_trays_of_one_nvlink_domain() -> None:
    w = _nvl72_world()
    tp16 = JobSpec(name="tp", ranks=4, resources={"gpus": 4}, topology={"group_gpus": 16})  # type: ignore[arg-type]
    d = _cycle(w, [PendingJob("tp", tp16, 0.0)])
    alloc = d.placements["tp"]
    assert alloc.domain == "nvlink"
    assert len({w.cluster.node(r.node).nvlink_domain for r in alloc.ranks}) == 1


def test_a_level_the_cluster_lacks_waits_as_bad_constraints() -> None:
    d = _cycle(World(n_nodes=2), [PendingJob("r", spec("r", 8, ranks=2, domain="rack"), 0.0)])
    assert d.reasons["r"].code == "BadConstraints"
    assert "its levels are node, leaf, spine, cluster" in d.reasons["r"].message


def test_a_tp_group_that_no_domain_has_room_for_waits_as_topology_though_the_gpus_are_free() -> None:
    """Each rack keeps 7 free trays (28 GPUs): 56 free in all, but a TP-32 group never leaves its rack."""
    w = _nvl72_world()
    busy = [k for k in range(36) if k % 18 >= 7]
    w.run("x", [(k, [0, 1, 2, 3]) for k in busy], started=0, preemptible=False)
    tp32 = JobSpec(name="tp", ranks=8, resources={"gpus": 4}, topology={"group_gpus": 32})  # type: ignore[arg-type]
    d = _cycle(w, [PendingJob("tp", tp32, 0.0)])
    assert d.reasons["tp"].code == "Topology"
    assert "inside one nvlink domain" in d.reasons["tp"].message
