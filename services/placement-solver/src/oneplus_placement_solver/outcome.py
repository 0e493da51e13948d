"""How a job's attempt ends once its nodes report: pure, so the rule is tested without a broker."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from oneplus_contracts import JobEvent, JobFinished, JobRecord, JobRequeued


@dataclass(frozen=True)
class AttemptOutcome:
    action: Literal["wait", "finish", "requeue", "stop_others"]
    state: Literal["SUCCEEDED", "FAILED", "CANCELLED"] | None = None
    reason: str = ""
    exit_code: int | None = None
    stop_nodes: tuple[str, ...] = ()


def _node_failed(rec: JobRecord, node: str, code: int) -> str:
    """The exit code and, when the node said why (an image it could not find, say), its words."""
    why = rec.node_reasons.get(node)
    return f"rank on {node} exited with code {code}" + (f": {why}" if why else "")


NODE_LOST = "node lost"  # how the solver words the end of ranks on a node the registry declared lost
STOPPED = "cancelled:"  # how an executor words the end of ranks the solver (or a user) stopped
SIMULATED = "simulated"  # how a simulated runtime's exits begin (oneplus_node_executor.runtime.simulated)
SIMULATED_SUCCESS = "simulated: all ranks exited 0 (runtime simulated: no process ran)"
INFRA_RETRIES = 3  # requeues after platform faults before a job fails (ONEPLUS_INFRA_RETRIES)


def _infra(rec: JobRecord, node: str) -> bool:
    return node in rec.infra_nodes or rec.node_reasons.get(node, "").startswith(NODE_LOST)


def _causes(rec: JobRecord, failed: dict[str, int]) -> list[str]:
    """The failed nodes that failed by themselves, not because the gang was stopped after another node failed."""
    own = [n for n in failed if not rec.node_reasons.get(n, "").startswith(STOPPED)]
    return sorted(own or failed)


def attempt_outcome(rec: JobRecord, infra_retries: int = INFRA_RETRIES) -> AttemptOutcome:
    """Decide what the nodes' reports so far mean for the job.

    Only the job's own exit fails it: ranks the platform ended (a node lost, an executor that lost them, a
    reservation fenced out) requeue it, `infra_retries` times at most."""
    cancel_requested = rec.cancel_requested
    if rec.allocation is None:
        return AttemptOutcome("wait")
    nodes = rec.allocation.nodes
    done = rec.nodes_done
    failed = {n: c for n, c in done.items() if c != 0}
    pending = tuple(n for n in nodes if n not in done)
    if rec.state in ("PREEMPTING", "CHECKPOINTED"):
        if pending:
            return AttemptOutcome("wait")
        if not failed:
            # Every rank finished its work by itself while the preemption was under way: nothing to resume.
            return AttemptOutcome("finish", "SUCCEEDED", "all ranks exited 0 (before the preemption stopped them)", 0)
        return AttemptOutcome("requeue", reason=rec.reason or "preempted")
    launcher = _launcher_outcome(rec, infra_retries)
    if launcher is not None:
        return launcher
    if pending:
        if failed and not cancel_requested:
            node, code = next(iter(failed.items()))
            return AttemptOutcome(
                "stop_others", reason=_node_failed(rec, node, code), stop_nodes=pending, exit_code=code
            )
        return AttemptOutcome("wait")
    if cancel_requested:
        return AttemptOutcome("finish", "CANCELLED", rec.reason or "cancelled", exit_code=None)
    if failed:
        causes = _causes(rec, failed)
        if all(_infra(rec, n) for n in causes):
            # The work did not fail, the platform did (Slurm requeues on NODE_FAIL): run it again elsewhere.
            why = "; ".join(f"{n}: {rec.node_reasons.get(n) or f'exit {failed[n]}'}" for n in causes)
            if rec.infra_requeues < infra_retries:
                return AttemptOutcome("requeue", reason=f"infrastructure fault ({why}); requeued")
            node = causes[0]
            return AttemptOutcome(
                "finish",
                "FAILED",
                f"infrastructure fault ({why}); not requeued: its {infra_retries} retries are spent",
                exit_code=failed[node],
            )
        node = next(n for n in causes if not _infra(rec, n))
        return AttemptOutcome("finish", "FAILED", _node_failed(rec, node, failed[node]), exit_code=failed[node])
    if any(why.startswith(SIMULATED) for why in rec.node_reasons.values()):
        return AttemptOutcome("finish", "SUCCEEDED", SIMULATED_SUCCESS, exit_code=0)
    return AttemptOutcome("finish", "SUCCEEDED", "all ranks exited 0", exit_code=0)


def _launcher_outcome(rec: JobRecord, infra_retries: int) -> AttemptOutcome | None:
    """An MPIJob with a launcher ends with its launcher (mpi-operator v2): once the launcher's node (the first) has
    reported, the other nodes' workers are stopped and their exit is not the job's. None: the general rule decides
    (no launcher, the launcher still runs, or the launcher was itself stopped because a worker failed first)."""
    if rec.spec.launcher is None or rec.allocation is None or rec.cancel_requested:
        return None
    first = rec.allocation.nodes[0]
    if first not in rec.nodes_done or rec.node_reasons.get(first, "").startswith(STOPPED):
        return None
    if _infra(rec, first) and rec.nodes_done[first] != 0:
        return None  # the platform ended the launcher's node: requeue or fail as for any node
    code = rec.nodes_done[first]
    why = rec.node_reasons.get(first) or f"launcher exited with code {code}"
    pending = tuple(n for n in rec.allocation.nodes if n not in rec.nodes_done)
    if pending:
        return AttemptOutcome(
            "stop_others",
            reason=f"the launcher ended ({why}): stopping the workers",
            stop_nodes=pending,
            exit_code=code,
        )
    if code == 0:
        return AttemptOutcome("finish", "SUCCEEDED", f"the launcher exited 0 on {first} ({why})", exit_code=0)
    return AttemptOutcome("finish", "FAILED", f"the launcher on {first} exited with code {code}: {why}", exit_code=code)


def attempt_end(rec: JobRecord, out: AttemptOutcome) -> tuple[JobEvent, str] | None:
    """The event that ends the attempt as `out` decided (finished, or requeued from its checkpoint) and the reason
    its reservation's release is audited with; None while the attempt goes on."""
    job_id, token = rec.job_id, rec.token
    if out.action == "finish" and out.state is not None:
        finished = JobFinished(
            event_id=f"finished-{job_id}-{token}",
            job_id=job_id,
            state=out.state,
            reason=out.reason,
            token=token,
            exit_code=out.exit_code,
        )
        return finished, out.reason
    if out.action == "requeue":
        infra = rec.state not in ("PREEMPTING", "CHECKPOINTED")  # a victim's requeue is no platform fault
        requeued = JobRequeued(
            event_id=f"requeued-{job_id}-{token}",
            job_id=job_id,
            reason=out.reason,
            token=token,
            checkpoint_ts=rec.checkpoint_ts,
            fault="infrastructure" if infra else None,
        )
        return requeued, "requeued"
    return None
