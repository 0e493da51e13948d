"""Exit codes into reasons a user can act on, and the restart policy."""

from __future__ import annotations

from oneplus_node_executor.runtime.exits import RankEnd, describe_end, rank_end, should_restart, summarize


def test_all_ranks_zero_is_success() -> None:
    assert summarize([RankEnd(0, 0), RankEnd(1, 0)]) == (0, "all 2 local rank(s) exited 0")


def test_lowest_failing_rank_decides_and_the_rest_are_counted() -> None:
    code, reason = summarize([RankEnd(2, 1), RankEnd(1, 3), RankEnd(0, 0)])
    assert code == 3
    assert reason == "rank 1 exited with code 3 (1 more rank(s) failed)"


def test_signal_deaths_and_oom_are_named() -> None:
    assert describe_end(RankEnd(0, 137)) == "rank 0 was killed by SIGKILL (exit code 137)"
    oom = rank_end(4, {"ExitCode": 137, "OOMKilled": True}, memory_mb=512)
    assert describe_end(oom) == "rank 4 was killed: out of memory (limit 512 MB)"
    assert describe_end(rank_end(1, {"ExitCode": 127, "Error": "exec: nope: not found"})) == (
        "rank 1 failed: exec: nope: not found"
    )
    assert describe_end(RankEnd(0, 2, restarts=3)) == "rank 0 exited with code 2 after 3 restart(s)"


def test_a_stopped_job_says_why() -> None:
    assert summarize([RankEnd(0, 143)], stopped_reason="preempted") == (143, "stopped by the executor: preempted")


def test_restart_policies() -> None:
    failed, ok = RankEnd(0, 1), RankEnd(0, 0)
    assert not should_restart("Never", failed, 0, 3)
    assert should_restart("OnFailure", failed, 0, 3) and not should_restart("OnFailure", ok, 0, 3)
    assert should_restart("Always", ok, 2, 3) and not should_restart("Always", ok, 3, 3)
