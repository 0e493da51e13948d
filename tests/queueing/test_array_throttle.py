"""The `%N` of a job array in the cycle (pure): at most N of its tasks hold GPUs, the rest wait with
`JobArrayTaskLimit`; other arrays and jobs are not held back; tasks are served in task id order."""

from __future__ import annotations

from dataclasses import replace

from oneplus_contracts import JobArray
from oneplus_contracts.array_facts import task_specs
from oneplus_queueing.config import default_config
from oneplus_queueing.cycle import schedule_cycle
from oneplus_queueing.fairshare import UsageHistory
from oneplus_queueing.model import PendingJob
from queueing_world import World, spec


def tasks(array_id: str, text: str) -> list[PendingJob]:
    s = spec(array_id, 1).model_copy(update={"array": JobArray.parse(text)})
    return [PendingJob(job_id, t, 1.0) for job_id, t in task_specs(array_id, s)]


def test_at_most_n_tasks_of_an_array_are_placed_and_the_others_say_why() -> None:
    w = World(n_nodes=2)  # 16 GPUs
    pending = tasks("a", "0-11%3") + tasks("b", "0-2") + [PendingJob("solo", spec("solo", 1), 2.0)]
    d = schedule_cycle(100.0, w.state, pending, [], default_config(), UsageHistory())
    assert sorted(j for j in d.placements if j.startswith("a_")) == ["a_0", "a_1", "a_2"]  # task id order, not text
    assert {"b_0", "b_1", "b_2", "solo"} <= d.placements.keys()  # no limit on b, nor on a plain job
    assert d.reasons["a_11"].code == "JobArrayTaskLimit" and "%3" in d.reasons["a_11"].message


def test_running_tasks_count_against_the_limit() -> None:
    w = World(n_nodes=2)
    a = tasks("a", "0-9%2")
    for i, job in enumerate(a[:2]):  # two tasks already hold GPUs: their specs name the array
        w.running[job.job_id] = replace(w.run(job.job_id, [(0, [i])]), spec=job.spec)
    d = schedule_cycle(100.0, w.state, a[2:], list(w.running.values()), default_config(), UsageHistory())
    assert not d.placements and {r.code for r in d.reasons.values()} == {"JobArrayTaskLimit"}
    w.finish("a_0")
    d = schedule_cycle(100.0, w.state, a[2:], list(w.running.values()), default_config(), UsageHistory())
    assert list(d.placements) == ["a_2"]


def test_tasks_placed_by_an_earlier_cycle_and_not_recorded_yet_count_too() -> None:
    """The live solver decides the next cycle while the last one's placements are being bound: those tasks are
    neither pending nor running there (an e2e run of `0-11%3` saw four tasks at once under load)."""
    w = World(n_nodes=2)
    a = tasks("a", "0-9%3")
    d = schedule_cycle(100.0, w.state, a[2:], [], default_config(), UsageHistory(), in_flight={"a": 2})
    assert list(d.placements) == ["a_2"], "two of its three are being bound"
    assert d.reasons["a_3"].code == "JobArrayTaskLimit"
    d = schedule_cycle(100.0, w.state, a[3:], [], default_config(), UsageHistory(), in_flight={"a": 3, "b": 9})
    assert not d.placements
