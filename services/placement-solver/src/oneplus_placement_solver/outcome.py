"""How a job's attempt ends once its nodes report: pure, so the rule is tested without a broker."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from oneplus_contracts import JobRecord


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
    return AttemptOutcome("finish", "SUCCEEDED", "all ranks exited 0", exit_code=0)
