"""The job owner's preemption, as decisions: the `preempting` record of each victim a cycle evicts, the commands that
ask its nodes to checkpoint and stop, and when a victim that has not stopped within its grace period is killed.

The owner commits `preempting` itself (fenced, like its other events) and only then sends the commands, so a node's
end (exit 143) is always folded after it. The grace timer is kept by the owner: its deadline is read from the record
(`updated_ts` of a PREEMPTING record is its `preempting` event's, unless a node's end came since), so a new owner
after a takeover finds every running timer again without a working set of its own.
"""

from __future__ import annotations

from oneplus_contracts import JobPreempting, JobRecord, PreemptRanks

from .apply import Eviction

# After the checkpoint grace: the node's own stop (SIGTERM, 10 s, then kill) and its report's way back.
STOP_SLACK_S = 15.0


def eviction_reason(e: Eviction, preemptor: JobRecord | None) -> str:
    """What the victim's record says about why it stands aside."""
    spec = e.victim.spec
    if e.grows and e.resize_to is not None and spec.elastic is not None:
        el = spec.elastic
        have = len(e.victim.allocation.ranks)
        return f"elastic resize: {have} -> {len(e.resize_to.ranks)} ranks ({el.min_ranks}..{el.max_ranks})"
    if e.resize_to is not None and spec.elastic is not None:
        return f"elastic shrink to {len(e.resize_to.ranks)} ranks for {e.preemptor}"
    priority = f" (priority {preemptor.spec.priority})" if preemptor is not None else ""
    return f"preempted for {e.preemptor}{priority}"


def preempting_event(victim: JobRecord, preemptor: str, reason: str) -> JobPreempting | None:
    """The victim's `preempting`, for the attempt it runs now; None when it holds no GPUs (nothing to stop)."""
    if victim.token is None or victim.allocation is None:
        return None
    return JobPreempting(
        event_id=f"preempting-{victim.job_id}-{victim.token}",
        job_id=victim.job_id,
        token=victim.token,
        preemptor=preemptor,
        reason=reason,
    )


def preempt_commands(victim: JobRecord) -> list[PreemptRanks]:
    """One preempt command per node of the attempt that has not ended: its checkpoint signal and grace period."""
    if victim.token is None or victim.allocation is None:
        return []
    return [
        PreemptRanks(
            command_id=f"preempt-{victim.job_id}-{victim.token}-{node}",
            job_id=victim.job_id,
            node=node,
            token=victim.token,
            signal=victim.spec.checkpoint.signal,
            grace_s=float(victim.spec.checkpoint.grace_s),
            reason=victim.reason or "preempted",
        )
        for node in victim.allocation.nodes
        if node not in victim.nodes_done
    ]


def escalation_due(rec: JobRecord, now: float, slack_s: float = STOP_SLACK_S) -> list[str]:
    """The nodes to kill the victim's ranks on: it was asked to checkpoint more than its grace (and the stop's slack)
    ago and no node has checkpointed or ended since. Empty while the timer runs, or once it stepped aside."""
    if slack_s < 0:
        raise ValueError(f"slack_s={slack_s}: an escalation slack cannot be negative")
    if rec.state != "PREEMPTING" or rec.allocation is None or rec.token is None:
        return []
    if now < rec.updated_ts + float(rec.spec.checkpoint.grace_s) + slack_s:
        return []
    return [n for n in rec.allocation.nodes if n not in rec.nodes_done]
