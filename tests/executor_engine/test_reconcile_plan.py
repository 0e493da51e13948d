"""After a restart: adopt what Redis says is current, remove the rest, report reservations with nothing here."""

from __future__ import annotations

from oneplus_node_executor.runtime.base import RunningRanks
from oneplus_node_executor.runtime.reconcile import plan_reconcile


def test_current_token_is_adopted_stale_and_unreserved_are_orphans_and_empty_reservations_leak() -> None:
    found = [
        RunningRanks("job-a", 3, (0, 1)),  # current
        RunningRanks("job-b", 1, (0,)),  # Redis moved on to token 2 (placed elsewhere or relaunching)
        RunningRanks("job-c", 5, (2,), exited=True),  # finished while the executor was down, still reserved
        RunningRanks("job-d", 4, (0,)),  # no reservation at all: released while we were down
    ]
    plan = plan_reconcile(found, {"job-a": 3, "job-b": 2, "job-c": 5, "job-e": 9})
    assert [(r.job_id, r.token) for r in plan.adopt] == [("job-a", 3), ("job-c", 5)]
    assert [(r.job_id, r.token) for r in plan.orphans] == [("job-b", 1), ("job-d", 4)]
    assert plan.leaked == {"job-b": 2, "job-e": 9}


def test_nothing_found_and_nothing_reserved_is_a_clean_node() -> None:
    plan = plan_reconcile([], {})
    assert (plan.adopt, plan.orphans, plan.leaked) == ([], [], {})
