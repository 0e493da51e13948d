"""The job owner's preemption decisions (oneplus_queueing.preemption): each victim's `preempting` for the attempt it
runs, the preempt commands for its nodes that have not ended, and the grace timer that kills a victim which neither
checkpointed nor ended in time, read from its record alone (a new owner after a takeover finds it the same)."""

from __future__ import annotations

import pytest
from oneplus_contracts import (
    Allocation,
    CheckpointPolicy,
    ElasticRange,
    JobAccepted,
    JobCheckpointed,
    JobEvent,
    JobNodeFinished,
    JobPlaced,
    JobPreempting,
    JobRecord,
    JobSpec,
    RankPlacement,
    apply_event,
)
from oneplus_queueing.apply import Eviction
from oneplus_queueing.model import RunningJob
from oneplus_queueing.preemption import (
    STOP_SLACK_S,
    escalation_due,
    eviction_reason,
    preempt_commands,
    preempting_event,
)

GRACE_S = 30
SPEC = JobSpec(
    name="train",
    resources={"gpus": 2},
    ranks=2,
    checkpoint=CheckpointPolicy(signal="SIGUSR2", grace_s=GRACE_S),
)
ALLOC = Allocation(ranks=[RankPlacement(rank=0, node="n1", gpus=[0, 1]), RankPlacement(rank=1, node="n2", gpus=[0, 1])])
T0 = 1_000.0  # when the owner recorded `preempting`


def fold(*events: JobEvent) -> JobRecord:
    rec: JobRecord | None = None
    for event in events:
        rec = apply_event(rec, event)
    assert rec is not None
    return rec


def running(spec: JobSpec = SPEC) -> JobRecord:
    return fold(JobAccepted(job_id="j", spec=spec), JobPlaced(job_id="j", allocation=ALLOC, token=4))


def preempting(*after: JobEvent) -> JobRecord:
    event = preempting_event(running(), "urgent", "preempted for urgent")
    assert event is not None
    return fold(
        JobAccepted(job_id="j", spec=SPEC),
        JobPlaced(job_id="j", allocation=ALLOC, token=4),
        event.model_copy(update={"ts": T0}),
        *after,
    )


def test_preempting_is_for_the_attempt_the_victim_runs_now() -> None:
    event = preempting_event(running(), "urgent", "preempted for urgent")
    assert isinstance(event, JobPreempting)
    assert (event.job_id, event.token, event.preemptor) == ("j", 4, "urgent")
    assert event.event_id == "preempting-j-4", "one id per attempt: a cycle that chooses it again is a duplicate"
    assert preempting_event(fold(JobAccepted(job_id="p", spec=SPEC)), "urgent", "x") is None, "a pending job"


def test_the_commands_carry_the_victims_signal_and_grace_to_every_node_still_running() -> None:
    rec = preempting(JobNodeFinished(job_id="j", node="n2", token=4, exit_code=0, reason="exit 0"))
    cmds = preempt_commands(rec)
    assert [(c.node, c.token, c.signal, c.grace_s) for c in cmds] == [("n1", 4, "SIGUSR2", float(GRACE_S))]
    assert cmds[0].command_id == "preempt-j-4-n1"
    assert cmds[0].reason == "preempted for urgent"


def test_the_timer_runs_out_after_the_grace_and_the_stops_slack() -> None:
    rec = preempting()
    due = T0 + GRACE_S + STOP_SLACK_S
    assert escalation_due(rec, due - 0.1) == []
    assert escalation_due(rec, due) == ["n1", "n2"]


def test_a_victim_that_checkpointed_or_whose_nodes_ended_is_not_killed() -> None:
    late = T0 + 10 * GRACE_S
    checkpointed = preempting(
        JobCheckpointed(job_id="j", node="n1", token=4, checkpoint_ts=T0 + 1, acknowledged=True, ts=T0 + 1)
    )
    assert escalation_due(checkpointed, late) == []
    one_ended = preempting(
        JobNodeFinished(job_id="j", node="n1", token=4, exit_code=143, reason="checkpointed", ts=T0 + 1)
    )
    assert escalation_due(one_ended, late) == ["n2"], "only the node that has not ended is killed"
    assert escalation_due(running(), late) == [], "a running job has no timer"


def test_a_negative_slack_is_refused() -> None:
    with pytest.raises(ValueError, match=r"slack_s=-1\.0: an escalation slack cannot be negative"):
        escalation_due(preempting(), T0, slack_s=-1.0)


def test_the_reason_says_what_the_victim_stands_aside_for() -> None:
    urgent = fold(JobAccepted(job_id="urgent", spec=SPEC.model_copy(update={"priority": 100})))
    victim = RunningJob.from_record(running())
    assert eviction_reason(Eviction(victim, "urgent"), urgent) == "preempted for urgent (priority 100)"
    elastic = SPEC.model_copy(update={"elastic": ElasticRange(min_ranks=1, max_ranks=4)})
    grower = RunningJob.from_record(running(elastic))
    bigger = Allocation(ranks=[*ALLOC.ranks, RankPlacement(rank=2, node="n3", gpus=[0, 1])])
    assert eviction_reason(Eviction(grower, "j", bigger), None) == "elastic resize: 2 -> 3 ranks (1..4)"
    smaller = Allocation(ranks=ALLOC.ranks[:1])
    assert eviction_reason(Eviction(grower, "urgent", smaller), urgent) == "elastic shrink to 1 ranks for urgent"
