"""`apply_decision` and `evictions`: the steps every driver (solver, simulator, test harness) takes after a cycle."""

from __future__ import annotations

from oneplus_contracts import Allocation
from oneplus_queueing.apply import apply_decision, evictions
from oneplus_queueing.cycle import schedule_cycle
from oneplus_queueing.fairshare import UsageHistory
from oneplus_queueing.model import CycleDecision, PendingJob, VictimChoice
from queueing_world import World, spec, unfloored


def test_a_preemptor_evicts_its_victims_once_each_counted_by_their_own_gpus_and_the_free_gpus_start_a_job() -> None:
    w = World(n_nodes=2, nodes_per_leaf=2)
    w.run("low", [(0, range(8))], started=0)
    w.run("keep", [(1, range(6))], started=0, preemptible=False)
    boss = PendingJob("boss", spec("boss", 8, priority=10), 0.0)
    small = PendingJob("small", spec("small", 2), 0.0)
    usage = UsageHistory()
    d = schedule_cycle(100.0, w.state, [boss, small], list(w.running.values()), unfloored(), usage)
    assert [c.victims for c in d.preemptions] == [("low",)] and "small" in d.placements
    pending = {j.job_id: j for j in (boss, small)}
    applied = apply_decision(d, w.state, pending, w.running, usage)
    assert [e.victim.job_id for e in applied.evicted] == ["low"] and applied.evicted[0].preemptor == "boss"
    assert w.running["low"].preempting, "the victim holds its GPUs until it has checkpointed"
    assert [r.job_id for r in applied.started] == ["small"] and w.running["small"].started_ts == 100.0
    assert not {("node-01", g) for g in d.placements["small"].ranks[0].gpus} & w.free_gpus()
    assert [(p.victim, p.preemptor, p.gpus) for p in usage.preemptions] == [("low", "boss", 8.0)]
    # The next cycle may name the victim again while it leaves: it is not evicted or counted twice.
    again = apply_decision(CycleDecision(now=101.0, preemptions=d.preemptions), w.state, {}, w.running, usage)
    assert again.evicted == [] and len(usage.preemptions) == 1


def test_evictions_skip_jobs_no_longer_running_and_name_each_victim_once() -> None:
    w = World(n_nodes=1, nodes_per_leaf=1)
    a = w.run("a", [(0, [0, 1])], started=0)
    choice = VictimChoice("p", ("a", "gone", "a"), ("priority",) * 3, a.allocation, 0.0, 2.0, 0.0)
    twice = VictimChoice("q", ("a",), ("priority",), a.allocation, 0.0, 2.0, 0.0)
    got = evictions(CycleDecision(now=1.0, preemptions=[choice, twice]), w.running)
    assert [(e.victim.job_id, e.preemptor) for e in got] == [("a", "p")]


def test_a_world_that_assumes_takes_each_placement_by_job_and_leaves_the_cluster_state_alone() -> None:
    """The live solver's binder: each placement is assumed for its job; the victims are evicted as for the others."""
    w = World(n_nodes=2, nodes_per_leaf=2)
    w.run("low", [(0, range(8))], started=0)
    boss = PendingJob("boss", spec("boss", 8, priority=10), 0.0)
    small = PendingJob("small", spec("small", 2), 0.0)
    usage = UsageHistory()
    d = schedule_cycle(100.0, w.state, [boss, small], list(w.running.values()), unfloored(), usage)
    free = w.free_gpus()

    class Binder:
        def __init__(self) -> None:
            self.assumed: dict[str, Allocation] = {}

        def assume(self, job_id: str, alloc: Allocation) -> None:
            self.assumed[job_id] = alloc

    binder = Binder()
    applied = apply_decision(d, binder, {j.job_id: j for j in (boss, small)}, w.running, usage)
    assert binder.assumed == d.placements and list(binder.assumed) == ["small"]
    assert w.free_gpus() == free, "assumed, not applied to the world's cluster state"
    assert [r.job_id for r in applied.started] == ["small"] and [e.victim.job_id for e in applied.evicted] == ["low"]
    assert [(p.victim, p.preemptor) for p in usage.preemptions] == [("low", "boss")]
