"""The job state machine: a pure fold of events into a `JobRecord`.

Every service that changes a job's state goes through `apply_event`, so an illegal transition is
refused the same way everywhere and a job's history can be replayed from the stream.
"""

from __future__ import annotations

from .events import (
    TERMINAL_STATES,
    JobAccepted,
    JobCancelRequested,
    JobCheckpointed,
    JobEvent,
    JobFinished,
    JobNodeFinished,
    JobPlaced,
    JobPreempting,
    JobRecord,
    JobRejected,
    JobRequeued,
    JobRunning,
    JobStarting,
    JobSubmitted,
)


class IllegalTransition(ValueError):
    """An event that does not apply to the job's current state (stale or out of order)."""


def _require(rec: JobRecord | None, event: JobEvent, *states: str) -> JobRecord:
    if rec is None:
        raise IllegalTransition(f"{event.type} for unknown job {event.job_id}")
    if states and rec.state not in states:
        raise IllegalTransition(f"{event.type} not allowed in state {rec.state} (job {rec.job_id})")
    return rec


def _token_matches(rec: JobRecord, token: int | None, event: JobEvent) -> None:
    if token is not None and rec.token is not None and token != rec.token:
        raise IllegalTransition(f"{event.type} carries stale token {token}, current {rec.token}")


def apply_event(rec: JobRecord | None, event: JobEvent) -> JobRecord:
    """Return the record after `event`; raise `IllegalTransition` when it does not apply."""
    if rec is not None and rec.state in TERMINAL_STATES:
        raise IllegalTransition(f"job {rec.job_id} is already {rec.state}")
    match event:
        case JobSubmitted() | JobAccepted():
            if rec is not None and rec.state != "SUBMITTED":
                raise IllegalTransition(f"job {event.job_id} already exists in state {rec.state}")
            state = "ACCEPTED" if isinstance(event, JobAccepted) else "SUBMITTED"
            warnings = event.warnings if isinstance(event, JobAccepted) else []
            return JobRecord(
                job_id=event.job_id,
                spec=event.spec,
                state=state,
                submitted_ts=rec.submitted_ts if rec else event.ts,
                updated_ts=event.ts,
                source=event.source,
                warnings=warnings,
                traceparent=rec.traceparent if rec else None,
            )
        case JobRejected():
            if rec is None:
                raise IllegalTransition("a rejected submission has no record")
            return rec.model_copy(update={"state": "REJECTED", "reason": event.reason, "updated_ts": event.ts})
        case JobPlaced():
            r = _require(rec, event, "ACCEPTED")
            return r.model_copy(
                update={
                    "state": "PLACED",
                    "allocation": event.allocation,
                    "token": event.token,
                    "attempt": event.attempt,
                    "nodes_started": [],
                    "nodes_running": [],
                    "nodes_done": {},
                    "node_reasons": {},
                    "infra_nodes": [],
                    "reason": None,
                    "placed_ts": event.ts,
                    "updated_ts": event.ts,
                }
            )
        case JobStarting():
            # Nodes of a gang start independently: a slow node's `starting` may follow a fast node's `running`
            # or a preemption; it is history all the same, and it never moves the job's state backwards.
            r = _require(rec, event, "PLACED", "STARTING", "RUNNING", "PREEMPTING", "CHECKPOINTED")
            _token_matches(r, event.token, event)
            state = "STARTING" if r.state == "PLACED" else r.state
            return r.model_copy(update={"state": state, "nodes_started": _with(r, event.node), "updated_ts": event.ts})
        case JobRunning():
            r = _require(rec, event, "PLACED", "STARTING", "RUNNING")
            _token_matches(r, event.token, event)
            started = r.started_ts if r.state == "RUNNING" and r.started_ts else event.ts
            return r.model_copy(
                update={
                    "state": "RUNNING",
                    "started_ts": started,
                    "nodes_started": _with(r, event.node),
                    "nodes_running": r.nodes_running
                    if event.node in r.nodes_running
                    else [*r.nodes_running, event.node],
                    "updated_ts": event.ts,
                }
            )
        case JobNodeFinished():
            r = _require(rec, event, "PLACED", "STARTING", "RUNNING", "PREEMPTING", "CHECKPOINTED")
            _token_matches(r, event.token, event)
            done = dict(r.nodes_done)
            done[event.node] = event.exit_code
            why = {**r.node_reasons, event.node: event.reason}
            infra = [n for n in r.infra_nodes if n != event.node]
            if event.fault == "infrastructure":
                infra.append(event.node)
            return r.model_copy(
                update={
                    "nodes_started": _with(r, event.node),
                    "nodes_done": done,
                    "node_reasons": why,
                    "infra_nodes": infra,
                    "updated_ts": event.ts,
                }
            )
        case JobFinished():
            r = _require(rec, event)
            _token_matches(r, event.token, event)
            return r.model_copy(
                update={
                    "state": event.state,
                    "reason": event.reason,
                    "finished_ts": event.ts,
                    "updated_ts": event.ts,
                }
            )
        case JobCancelRequested():
            r = _require(rec, event)
            return r.model_copy(update={"reason": event.reason, "cancel_requested": True, "updated_ts": event.ts})
        case JobPreempting():
            r = _require(rec, event, "PLACED", "STARTING", "RUNNING")
            _token_matches(r, event.token, event)
            return r.model_copy(update={"state": "PREEMPTING", "reason": event.reason, "updated_ts": event.ts})
        case JobCheckpointed():
            r = _require(rec, event, "PREEMPTING", "RUNNING", "CHECKPOINTED")
            _token_matches(r, event.token, event)
            state = "CHECKPOINTED" if r.state in ("PREEMPTING", "CHECKPOINTED") else r.state
            # Without the job's acknowledgement there is no new checkpoint: the last one stands. A gang's nodes report
            # theirs in any order: a node that saved earlier, folded later, does not set the checkpoint back.
            ck = r.checkpoint_ts
            if event.acknowledged:
                ck = event.checkpoint_ts if ck is None else max(ck, event.checkpoint_ts)
            return r.model_copy(update={"state": state, "checkpoint_ts": ck, "updated_ts": event.ts})
        case JobRequeued():
            r = _require(rec, event, "PREEMPTING", "CHECKPOINTED", "PLACED", "STARTING", "RUNNING")
            _token_matches(r, event.token, event)
            ck = event.checkpoint_ts if event.checkpoint_ts is not None else r.checkpoint_ts
            saved = 0.0
            if ck is not None and r.started_ts is not None and ck > r.started_ts:
                saved = ck - r.started_ts  # this attempt's work up to its checkpoint survives the restart
            return r.model_copy(
                update={
                    "progress_s": r.progress_s + saved,
                    "state": "ACCEPTED",
                    "allocation": None,
                    "token": None,
                    "nodes_started": [],
                    "nodes_running": [],
                    "nodes_done": {},
                    "node_reasons": {},
                    "infra_nodes": [],
                    "reason": event.reason,
                    "checkpoint_ts": ck,
                    # A platform fault is not a preemption: it spends the job's infrastructure retry budget.
                    "preemptions": r.preemptions + (event.fault != "infrastructure"),
                    "infra_requeues": r.infra_requeues + (event.fault == "infrastructure"),
                    "ended_token": r.token,
                    "updated_ts": event.ts,
                }
            )
    raise IllegalTransition(f"unknown event {event!r}")  # pragma: no cover - the union is exhaustive


def _with(rec: JobRecord, node: str) -> list[str]:
    """The record's reporting nodes with `node` among them (each once, in report order)."""
    return rec.nodes_started if node in rec.nodes_started else [*rec.nodes_started, node]
