"""Slurm's array index expressions, the tasks an array makes, and their variables (pure)."""

from __future__ import annotations

import pytest
from oneplus_contracts import ArrayError, JobAccepted, JobArray, JobCancelRequested, JobSpec
from oneplus_contracts.array_facts import expand_fact
from oneplus_contracts.arrays import (
    array_environment,
    array_state,
    array_tasks,
    compact,
    fill_pattern,
    split_task_id,
)
from pydantic import ValidationError


@pytest.mark.parametrize(
    ("text", "ids", "limit"),
    [
        ("0-999%50", list(range(1000)), 50),
        ("1,3,5-9:2", [1, 3, 5, 7, 9], None),
        ("7", [7], None),
        ("0-15:4", [0, 4, 8, 12], None),
        ("3,1,2,1", [1, 2, 3], None),
    ],
)
def test_index_expressions_as_slurm_reads_them(text: str, ids: list[int], limit: int | None) -> None:
    array = JobArray.parse(text)
    assert list(array.task_ids) == ids and array.max_running == limit and array.tasks == len(ids)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("5-1", "--array=5-1: 5-1: the range ends (1) before it starts (5)"),
        ("1-9:0", "--array=1-9:0: 1-9:0: the step must be 1 or more (got 0)"),
        ("0-9%0", "--array=0-9%0: %0: at most 0 tasks at once would never run one"),
        ("0-9%x", "--array=0-9%x: %x: the task limit must be a whole number"),
        ("a-b", "--array=a-b: 'a-b' is not an id"),
        ("", "--array=: no task ids"),
    ],
)
def test_what_slurm_refuses_is_refused_naming_the_value(text: str, says: str) -> None:
    with pytest.raises(ArrayError) as err:
        JobArray.parse(text)
    assert str(err.value).startswith(says)


def test_max_array_size_bounds_the_ids_as_slurm_does() -> None:
    JobArray.parse("0-1000", max_array_size=1001)  # Slurm's default allows ids 0..1000
    with pytest.raises(ArrayError, match=r"task id 1001 is above the site's max_array_size \(1001: ids 0-1000"):
        JobArray.parse("0-1001", max_array_size=1001)
    with pytest.raises(ArrayError, match="task id 10000 is above"):
        JobArray.parse("0-10000").check_size(10_000)


def test_a_spec_takes_the_text_form_and_refuses_a_bad_one() -> None:
    spec = JobSpec(name="s", resources={"gpus": 1}, array="0-9%2")
    assert spec.array is not None and (spec.array.indices, spec.array.max_running) == ("0-9", 2)
    with pytest.raises(ValidationError, match="the range ends"):
        JobSpec(name="s", resources={"gpus": 1}, array="9-0")
    with pytest.raises(ValidationError, match="aftercorr is for job arrays"):
        JobSpec(name="s", resources={"gpus": 1}, dependencies=[{"type": "aftercorr", "job_ids": ["a"]}])


def test_compact_form() -> None:
    assert compact([1, 3, 5, 7, 9]) == "1-9:2"
    assert compact(list(range(7, 1000))) == "7-999"
    assert compact([1, 4, 7, 8, 9]) == "1-7:3,8-9"
    assert compact([1, 2]) == "1-2" and compact([1, 5]) == "1,5" and compact([3]) == "3"


def test_each_task_knows_its_array() -> None:
    tasks = array_tasks("j-abc", JobArray.parse("1,3,5-9:2%2"))
    t = tasks[2]
    assert (t.task_id, t.count, t.min, t.max, t.step, t.max_running) == (5, 5, 1, 9, 2, 2)
    assert array_environment(t) == {
        "SLURM_ARRAY_JOB_ID": "j-abc",
        "SLURM_ARRAY_TASK_ID": "5",
        "SLURM_ARRAY_TASK_COUNT": "5",
        "SLURM_ARRAY_TASK_MIN": "1",
        "SLURM_ARRAY_TASK_MAX": "9",
        "SLURM_ARRAY_TASK_STEP": "2",
    }
    assert array_tasks("a", JobArray.parse("1,2,5"))[0].step == 1  # no one step: 1
    assert split_task_id("j-abc_17") == ("j-abc", 17) and split_task_id("j-abc") is None


def test_output_patterns() -> None:
    assert fill_pattern("slurm-%A_%a.out", "j-1", 4) == "slurm-j-1_4.out"
    assert fill_pattern("%x-%j-%%a-%a", "j-1", 4) == "%x-%j-%%a-4"


def test_one_accepted_fact_stands_for_every_task() -> None:
    spec = JobSpec(
        name="s",
        resources={"gpus": 1},
        array="0-2",
        labels={"slurm/output": "o-%A_%a"},
        dependencies=[{"type": "aftercorr", "job_ids": ["prev"]}, {"type": "afterok", "job_ids": ["x"]}],
    )
    tasks = expand_fact(JobAccepted(event_id="accepted-j", job_id="j", spec=spec), lambda _: [])
    assert tasks is not None and [t.job_id for t in tasks] == ["j_0", "j_1", "j_2"]
    first = tasks[1]
    assert isinstance(first, JobAccepted)
    assert first.event_id == "accepted-j_1" and first.spec.array is None and first.spec.array_task is not None
    assert first.spec.labels["slurm/output"] == "o-j_1"
    assert [(d.type, d.job_ids) for d in first.spec.dependencies] == [("afterok", ["x"]), ("afterok", ["prev_1"])]
    plain = JobAccepted(job_id="p", spec=JobSpec(name="p", resources={"gpus": 1}))
    assert expand_fact(plain, lambda _: []) is None
    cancels = expand_fact(JobCancelRequested(event_id="c", job_id="j"), lambda a: ["j_0", "j_2"] if a == "j" else [])
    assert cancels is not None and [(c.job_id, c.event_id) for c in cancels] == [("j_0", "c-j_0"), ("j_2", "c-j_2")]
    assert expand_fact(JobCancelRequested(job_id="q"), lambda _: []) is None


def test_an_arrays_state_for_its_dependents() -> None:
    assert array_state(["SUCCEEDED", "SUCCEEDED"]) == "SUCCEEDED"
    assert array_state(["SUCCEEDED", "RUNNING"]) == "RUNNING"
    assert array_state(["SUCCEEDED", "ACCEPTED", "RUNNING"]) == "ACCEPTED"
    assert array_state(["SUCCEEDED", "FAILED"]) == "FAILED"
    assert array_state(["SUCCEEDED", "CANCELLED"]) == "CANCELLED"
    assert array_state([]) is None
