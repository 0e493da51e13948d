"""Elastic gangs in the scheduling cycle: the largest size that fits, growth into free GPUs, shrinking as a victim."""

from __future__ import annotations

from collections.abc import Sequence

from oneplus_contracts import Allocation, ElasticRange, RankPlacement
from oneplus_queueing.apply import apply_decision
from oneplus_queueing.cycle import schedule_cycle
from oneplus_queueing.fairshare import UsageHistory
from oneplus_queueing.model import CycleDecision, PendingJob, RunningJob
from queueing_world import World, spec, unfloored


def elastic_spec(name: str, gpus: float, ranks: int, low: int, *, priority: int = 0, time_limit_s: int | None = None):  # type: ignore[no-untyped-def]
    s = spec(name, gpus, ranks, priority=priority, time_limit_s=time_limit_s)
    return s.model_copy(update={"elastic": ElasticRange(min_ranks=low, max_ranks=ranks)})


def run_elastic(w: World, job_id: str, where: Sequence[tuple[int, Sequence[int]]], high: int, low: int) -> RunningJob:
    """An elastic gang already running with len(where) ranks out of `low`..`high`."""
    s = elastic_spec(job_id, len(where[0][1]), len(where), low).model_copy(
        update={"elastic": ElasticRange(min_ranks=low, max_ranks=high)}
    )
    alloc = Allocation(ranks=[RankPlacement(rank=r, node=w.node(n), gpus=list(g)) for r, (n, g) in enumerate(where)])
    w.state.apply(alloc)
    job = w.running[job_id] = RunningJob(job_id, s, alloc, 0.0)
    return job


def cycle(w: World, pending: Sequence[PendingJob], now: float = 100.0, decision: CycleDecision | None = None):  # type: ignore[no-untyped-def]
    return schedule_cycle(
        now,
        w.state,
        list(pending),
        list(w.running.values()),
        unfloored(),
        UsageHistory(),
        carry=decision.carry if decision is not None else None,
    )


def test_an_elastic_job_starts_at_the_largest_size_that_fits_and_runs_with_that_many_ranks() -> None:
    w = World(n_nodes=2)
    w.run("big", [(1, range(8)), (0, [0, 1, 2, 3])])  # 12 of 16 GPUs held: 4 free on node-00
    job = PendingJob("el", elastic_spec("el", 1, 8, 2), 0.0)
    d = cycle(w, [job])
    alloc = d.placements["el"]
    assert len(alloc.ranks) == 4  # 8 asked, 4 fit, min 2
    applied = apply_decision(d, w.state, {"el": job}, w.running, UsageHistory())
    assert applied.started[0].spec.ranks == 4 and applied.started[0].gpus == 4
    assert w.running["el"].spec.elastic == ElasticRange(min_ranks=2, max_ranks=8)


def test_an_elastic_job_that_fits_not_even_at_its_minimum_waits_for_its_minimum() -> None:
    w = World(n_nodes=2)
    w.run("big", [(1, range(8)), (0, [0, 1, 2, 3])])
    d = cycle(w, [PendingJob("el", elastic_spec("el", 1, 8, 5), 0.0)])
    assert "el" not in d.placements
    assert d.reasons["el"].code == "Resources" and "5 GPUs" in d.reasons["el"].message


def test_a_running_elastic_job_grows_into_free_gpus_by_a_restart_at_the_larger_size() -> None:
    w = World(n_nodes=2)
    run_elastic(w, "el", [(0, [0]), (0, [1])], high=8, low=2)  # 2 of 8 ranks; 14 GPUs free
    d = cycle(w, [])
    (choice,) = d.preemptions
    assert choice.kind == "resize" and choice.victims == ("el",) and choice.preemptor == "el"
    assert len(choice.resized["el"].ranks) == 8 and d.nominations["el"] == choice.resized["el"]
    # The restart: the job checkpoints, gives its GPUs back and comes back pending; the nomination places it at 8.
    usage = UsageHistory()
    applied = apply_decision(d, w.state, {}, w.running, usage)
    assert [e.grows for e in applied.evicted] == [True]
    assert usage.preemptions_since(0.0) == 0  # growing evicts nobody: the rate limit does not count it
    held = w.running["el"]
    assert held.preempting
    again = cycle(w, [], now=101.0, decision=d)
    assert again.nominations["el"] == d.nominations["el"] and not again.preemptions  # kept while it checkpoints
    w.finish("el")
    back = PendingJob("el", held.spec.model_copy(update={"ranks": 8}), 0.0, 1)
    after = cycle(w, [back], now=102.0, decision=again)
    assert len(after.placements["el"].ranks) == 8


def test_no_growth_while_a_higher_priority_job_waits_for_gpus() -> None:
    w = World(n_nodes=2)
    run_elastic(w, "el", [(0, [0]), (0, [1])], high=8, low=2)
    waiting = PendingJob("vip", spec("vip", 8, ranks=3, priority=10), 0.0)  # 24 GPUs: never fits on 16
    d = cycle(w, [waiting])
    assert not [c for c in d.preemptions if c.kind == "resize"]
    assert "el" not in d.nominations
    same = PendingJob("peer", spec("peer", 8, ranks=3, priority=0), 0.0)  # same priority: it does not hold it back
    assert [c.kind for c in cycle(w, [same]).preemptions] == ["resize"]


def test_an_elastic_victim_shrinks_by_the_ranks_needed_instead_of_being_preempted_whole() -> None:
    w = World(n_nodes=2)
    # 4 ranks of 4 GPUs on both nodes, min 1: a priority-10 gang of 8 GPUs on one node needs two of its ranks.
    run_elastic(w, "el", [(0, [0, 1, 2, 3]), (0, [4, 5, 6, 7]), (1, [0, 1, 2, 3]), (1, [4, 5, 6, 7])], 4, 1)
    boss = PendingJob("boss", spec("boss", 8, priority=10), 50.0)
    d = cycle(w, [boss])
    (choice,) = d.preemptions
    assert choice.victims == ("el",) and choice.kind == "priority"
    kept = choice.resized["el"]
    assert len(kept.ranks) == 2 and choice.freed_gpus == 8  # only the part it gives up counts
    assert [r.rank for r in kept.ranks] == [0, 1] and kept.nodes == [w.node(0)]
    assert choice.nominated.nodes == [w.node(1)]
    assert d.nominations["el"] == kept
    # Live, the victim may still read as running the next cycle: what it keeps stays nominated for it meanwhile.
    assert cycle(w, [boss], now=100.5, decision=d).nominations["el"] == kept
    usage = UsageHistory()
    applied = apply_decision(d, w.state, {"boss": boss}, w.running, usage)
    assert [e.freed_gpus for e in applied.evicted] == [8.0]
    # It checkpoints and stops; both come back on their nominations: the boss on node-01, el on its two kept ranks.
    victim = w.finish("el")
    back = PendingJob("el", victim.spec.model_copy(update={"ranks": 4}), 0.0, 1)
    after = cycle(w, [boss, back], now=101.0, decision=d)
    assert after.placements["boss"].nodes == [w.node(1)]
    assert after.placements["el"] == kept


def test_an_elastic_victim_at_its_minimum_is_preempted_whole() -> None:
    w = World(n_nodes=1)
    run_elastic(w, "el", [(0, [0, 1, 2, 3]), (0, [4, 5, 6, 7])], 4, 2)
    d = cycle(w, [PendingJob("boss", spec("boss", 8, priority=10), 50.0)])
    (choice,) = d.preemptions
    assert choice.victims == ("el",) and not choice.resized and choice.freed_gpus == 8
