"""Elastic gangs in the simulator: the oneplus policy's own cycle starts them small, grows and shrinks them."""

from __future__ import annotations

import pytest
from oneplus_sim.elastic import ElasticRuleError, make_elastic
from oneplus_sim.engine import Simulation
from oneplus_sim.policies.oneplus import OnePlusPolicy, sim_queue_config
from sim_helpers import h100, job

# Victims and growing gangs have no minimum run time here (the scenarios last minutes, not hours), and a cycle runs
# at every event (no minimum interval), so that the times are exact.
CONFIG = sim_queue_config({"preemption": {"min_runtime_s": 0}})


def _trace():  # type: ignore[no-untyped-def]
    """A (4 GPUs, not preemptible) runs 0..1000; E (8 GPUs, elastic 1..2 ranks of 4) arrives at 1, 10,000 s of work."""
    jobs = [job("A", 0.0, 4, 1000.0, cls="high"), job("E", 1.0, 8, 10_000.0)]
    assert make_elastic(jobs, "half") == 2
    assert (jobs[1].ranks, jobs[1].gpus_per_rank, jobs[1].elastic_min, jobs[1].elastic_max) == (2, 4, 1, 2)
    jobs[0].elastic_min = jobs[0].elastic_max = 0  # A stays a fixed gang of one rank
    jobs[0].ranks, jobs[0].gpus_per_rank = 1, 4
    return jobs


def test_an_elastic_gang_starts_at_half_size_grows_when_gpus_free_and_ends_before_its_fixed_twin() -> None:
    elastic = Simulation(h100(1), _trace(), OnePlusPolicy(config=CONFIG, elastic=True, cycle_interval_s=0.0)).run()
    fixed_jobs = _trace()
    fixed_jobs[1].elastic_min = fixed_jobs[1].elastic_max = 0
    fixed = Simulation(h100(1), fixed_jobs, OnePlusPolicy(config=CONFIG, cycle_interval_s=0.0)).run()
    e = elastic.records["E"]
    assert e.first_start_s == 1.0 and [len(p) for p in e.placements] == [1, 2]  # 1 rank, then both after A ended
    assert elastic.counters["elastic_grows"] == 1 and e.preemptions == 0 and e.lost_gpu_s == 0
    # Half speed for 999 s (≈ 500 s of work), 30 s of checkpoint grace, then the 9,500 s left at full speed.
    assert e.finish_s is not None and e.finish_s == pytest.approx(1000 + 30 + 10_000 - 999 / 2, abs=1.0)
    assert fixed.records["E"].first_start_s == 1000.0
    assert e.finish_s < (fixed.records["E"].finish_s or 0)


def test_an_elastic_victim_shrinks_for_a_higher_priority_gang_and_goes_on() -> None:
    jobs = [job("E", 0.0, 8, 10_000.0, cls="low"), job("H", 100.0, 4, 500.0, cls="high")]
    make_elastic(jobs, "half")
    jobs[1].elastic_min = jobs[1].elastic_max = 0
    jobs[1].ranks, jobs[1].gpus_per_rank = 1, 4
    res = Simulation(h100(1), jobs, OnePlusPolicy(config=CONFIG, elastic=True, cycle_interval_s=0.0)).run()
    e, h = res.records["E"], res.records["H"]
    assert res.counters["elastic_shrinks"] == 1
    assert [len(p) for p in e.placements][:2] == [2, 1]  # it gave up one rank of 4 GPUs, not the gang
    assert h.first_start_s == pytest.approx(100 + 30)  # after the victim's checkpoint grace
    assert e.lost_gpu_s == 0  # it checkpointed at the signal


def test_an_unknown_elastic_rule_is_refused_naming_the_rules() -> None:
    with pytest.raises(ElasticRuleError, match=r"--elastic: unknown rule 'all'; choose from half"):
        make_elastic([job("A", 0.0, 4, 10.0)], "all")
