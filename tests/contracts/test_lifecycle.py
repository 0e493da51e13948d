"""The job state machine: legal paths fold, illegal or stale events are refused the same way everywhere."""

from __future__ import annotations

import pytest
from oneplus_contracts import (
    Allocation,
    IllegalTransition,
    JobAccepted,
    JobCancelRequested,
    JobCheckpointed,
    JobFinished,
    JobNodeFinished,
    JobPlaced,
    JobPreempting,
    JobRecord,
    JobRequeued,
    JobRunning,
    JobSpec,
    JobStarting,
    RankPlacement,
    apply_event,
    parse_job_event,
)
from pydantic import ValidationError

SPEC = JobSpec(name="t", resources={"gpus": 2}, ranks=2)  # type: ignore[arg-type]
ALLOC = Allocation(ranks=[RankPlacement(rank=0, node="a", gpus=[0, 1]), RankPlacement(rank=1, node="b", gpus=[0, 1])])


def fold(*events: object) -> JobRecord:
    rec = None
    for e in events:
        rec = apply_event(rec, e)  # type: ignore[arg-type]
    assert rec is not None
    return rec


def test_a_job_runs_from_accepted_to_succeeded() -> None:
    rec = fold(
        JobAccepted(job_id="j", spec=SPEC),
        JobPlaced(job_id="j", allocation=ALLOC, token=7),
        JobRunning(job_id="j", node="a", token=7),
        JobNodeFinished(job_id="j", node="a", token=7, exit_code=0, reason="exited"),
        JobNodeFinished(job_id="j", node="b", token=7, exit_code=0, reason="exited"),
        JobFinished(job_id="j", state="SUCCEEDED", reason="ok", token=7),
    )
    assert rec.state == "SUCCEEDED" and rec.nodes_done == {"a": 0, "b": 0} and rec.placed_ts and rec.started_ts


def test_a_slow_nodes_starting_after_a_fast_nodes_running_is_kept_without_moving_the_state_back() -> None:
    rec = fold(
        JobAccepted(job_id="j", spec=SPEC),
        JobPlaced(job_id="j", allocation=ALLOC, token=7),
        JobStarting(job_id="j", node="a", token=7),
        JobRunning(job_id="j", node="a", token=7),
        JobStarting(job_id="j", node="b", token=7),
    )
    assert rec.state == "RUNNING" and rec.nodes_started == ["a", "b"]
    rec = apply_event(rec, JobPreempting(job_id="j", token=7, reason="for k"))
    assert apply_event(rec, JobStarting(job_id="j", node="b", token=7)).state == "PREEMPTING"
    with pytest.raises(IllegalTransition, match="stale token"):
        apply_event(rec, JobStarting(job_id="j", node="b", token=6))


def test_an_event_with_a_stale_token_is_refused() -> None:
    rec = fold(JobAccepted(job_id="j", spec=SPEC), JobPlaced(job_id="j", allocation=ALLOC, token=7))
    with pytest.raises(IllegalTransition, match="stale token"):
        apply_event(rec, JobRunning(job_id="j", node="a", token=6))


def test_a_requeue_of_an_earlier_attempt_does_not_end_the_next_one() -> None:
    rec = fold(
        JobAccepted(job_id="j", spec=SPEC),
        JobPlaced(job_id="j", allocation=ALLOC, token=7),
        JobRequeued(job_id="j", reason="preempted", token=7),
    )
    assert rec.state == "ACCEPTED" and rec.token is None and rec.ended_token == 7
    again = apply_event(rec, JobPlaced(job_id="j", allocation=ALLOC, token=9))
    with pytest.raises(IllegalTransition, match="stale token 7"):
        apply_event(again, JobRequeued(job_id="j", reason="lease expired", token=7, fault="infrastructure"))
    ended = apply_event(again, JobRequeued(job_id="j", reason="lease expired", token=9, fault="infrastructure"))
    assert ended.ended_token == 9 and ended.infra_requeues == 1


def test_nothing_applies_after_a_terminal_state() -> None:
    rec = fold(JobAccepted(job_id="j", spec=SPEC), JobFinished(job_id="j", state="CANCELLED", reason="x"))
    with pytest.raises(IllegalTransition, match="already CANCELLED"):
        apply_event(rec, JobPlaced(job_id="j", allocation=ALLOC, token=1))


def test_a_second_accept_of_the_same_job_is_refused() -> None:
    rec = fold(JobAccepted(job_id="j", spec=SPEC))
    with pytest.raises(IllegalTransition, match="already exists"):
        apply_event(rec, JobAccepted(job_id="j", spec=SPEC))


def test_preemption_requeues_with_the_checkpoint_and_counts_it() -> None:
    rec = fold(
        JobAccepted(job_id="j", spec=SPEC),
        JobPlaced(job_id="j", allocation=ALLOC, token=7),
        JobRunning(job_id="j", node="a", token=7),
        JobPreempting(job_id="j", token=7, reason="for k"),
        JobCheckpointed(job_id="j", node="a", token=7, checkpoint_ts=123.0, acknowledged=True),
        JobRequeued(job_id="j", reason="preempted"),
    )
    assert rec.state == "ACCEPTED" and rec.checkpoint_ts == 123.0 and rec.preemptions == 1
    assert rec.allocation is None and rec.token is None


def test_a_gangs_checkpoint_is_its_nodes_latest_whatever_order_their_reports_fold_in() -> None:
    """Each node of a gang reports its own checkpoint; under load the later save can be folded first (an elastic
    shrink's smaller gang resumed from the earlier one in a parallel test run)."""
    start = (
        JobAccepted(job_id="j", spec=SPEC),
        JobPlaced(job_id="j", allocation=ALLOC, token=7),
        JobPreempting(job_id="j", token=7, reason="for k"),
    )
    late_first = fold(
        *start,
        JobCheckpointed(job_id="j", node="b", token=7, checkpoint_ts=124.0, acknowledged=True),
        JobCheckpointed(job_id="j", node="a", token=7, checkpoint_ts=123.0, acknowledged=True),
        JobRequeued(job_id="j", reason="preempted"),
    )
    assert late_first.checkpoint_ts == 124.0
    unacknowledged = fold(
        *start,
        JobCheckpointed(job_id="j", node="a", token=7, checkpoint_ts=123.0, acknowledged=True),
        JobCheckpointed(job_id="j", node="b", token=7, checkpoint_ts=125.0, acknowledged=False),
    )
    assert unacknowledged.checkpoint_ts == 123.0  # a save the job did not acknowledge is no checkpoint


def test_cancel_request_is_remembered_on_the_record() -> None:
    rec = fold(JobAccepted(job_id="j", spec=SPEC), JobCancelRequested(job_id="j", by="ann"))
    assert rec.cancel_requested and rec.state == "ACCEPTED"


def test_events_round_trip_through_json_by_their_type() -> None:
    e = JobPlaced(job_id="j", allocation=ALLOC, token=3)
    back = parse_job_event(e.model_dump_json())
    assert isinstance(back, JobPlaced) and back == e


@pytest.mark.parametrize(
    ("resources", "message"),
    [
        ({"gpus": 0}, "greater than 0"),
        ({"gpus": -1}, "greater than 0"),
        ({"gpus": 1.5}, "whole number"),
        ({"gpus": 1, "colour": "red"}, "Extra inputs"),
    ],
)
def test_bad_rank_resources_are_refused_by_name(resources: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        JobSpec(name="x", resources=resources)  # type: ignore[arg-type]


def test_an_unknown_checkpoint_signal_is_refused() -> None:
    with pytest.raises(ValidationError, match="unknown checkpoint signal"):
        JobSpec(name="x", resources={"gpus": 1}, checkpoint={"signal": "SIGFOO"})  # type: ignore[arg-type]
    assert JobSpec(name="x", resources={"gpus": 1}, checkpoint={"signal": "usr1"}).checkpoint.signal == "SIGUSR1"  # type: ignore[arg-type]


def test_the_nodes_that_reported_are_remembered_per_attempt() -> None:
    rec = fold(
        JobAccepted(job_id="j", spec=SPEC),
        JobPlaced(job_id="j", allocation=ALLOC, token=7),
        JobRunning(job_id="j", node="b", token=7),
        JobNodeFinished(job_id="j", node="a", token=7, exit_code=0, reason="exited"),
    )
    assert rec.nodes_started == ["b", "a"]
    rec = apply_event(rec, JobPreempting(job_id="j", token=7, reason="for k"))
    rec = apply_event(rec, JobRequeued(job_id="j", reason="preempted"))
    assert rec.nodes_started == []
    rec = apply_event(rec, JobPlaced(job_id="j", allocation=ALLOC, token=8))
    assert rec.nodes_started == [] and rec.token == 8


def test_an_infrastructure_requeue_spends_the_retry_budget_not_the_preemption_count() -> None:
    rec = fold(
        JobAccepted(job_id="j", spec=SPEC),
        JobPlaced(job_id="j", allocation=ALLOC, token=7),
        JobRunning(job_id="j", node="a", token=7),
        JobNodeFinished(job_id="j", node="a", token=7, exit_code=137, reason="node lost", fault="infrastructure"),
    )
    assert rec.infra_nodes == ["a"]
    rec = apply_event(rec, JobNodeFinished(job_id="j", node="a", token=7, exit_code=0, reason="exited"))
    assert rec.infra_nodes == [], "a node's last word on the attempt counts"
    rec = apply_event(rec, JobRequeued(job_id="j", reason="infrastructure fault", fault="infrastructure"))
    assert (rec.state, rec.infra_requeues, rec.preemptions, rec.infra_nodes) == ("ACCEPTED", 1, 0, [])
