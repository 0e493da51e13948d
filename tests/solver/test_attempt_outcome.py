"""How the solver reads the nodes' reports of one attempt: wait, finish, stop the rest, or requeue."""

from __future__ import annotations

from oneplus_contracts import Allocation, JobRecord, JobSpec, RankPlacement
from oneplus_placement_solver.launch import launch_commands, silent_nodes
from oneplus_placement_solver.outcome import attempt_outcome

ALLOC = Allocation(ranks=[RankPlacement(rank=0, node="a", gpus=[0]), RankPlacement(rank=1, node="b", gpus=[0])])


def rec(state: str = "RUNNING", done: dict[str, int] | None = None, **kw: object) -> JobRecord:
    return JobRecord(
        job_id="j",
        spec=JobSpec(name="t", ranks=2, resources={"gpus": 1}),  # type: ignore[arg-type]
        state=state,  # type: ignore[arg-type]
        submitted_ts=0.0,
        updated_ts=0.0,
        allocation=ALLOC,
        token=4,
        nodes_done=done or {},
        **kw,  # type: ignore[arg-type]
    )


def test_waits_until_every_node_reported() -> None:
    assert attempt_outcome(rec(done={"a": 0})).action == "wait"


def test_all_nodes_exit_zero_is_success() -> None:
    out = attempt_outcome(rec(done={"a": 0, "b": 0}))
    assert (out.action, out.state) == ("finish", "SUCCEEDED")


def test_a_simulated_success_says_it_was_simulated() -> None:
    """On the simulated runtime nothing ran: the record says so instead of "all ranks exited 0"."""
    real = attempt_outcome(rec(done={"a": 0, "b": 0}, node_reasons={"a": "all 1 local rank(s) exited 0"}))
    assert real.reason == "all ranks exited 0"
    why = "simulated: exited 0 after 1 s (no process ran)"
    out = attempt_outcome(rec(done={"a": 0, "b": 0}, node_reasons={"a": why, "b": why}))
    assert (out.state, out.reason) == ("SUCCEEDED", "simulated: all ranks exited 0 (runtime simulated: no process ran)")


def test_one_failed_node_stops_the_others_then_fails_the_job_with_its_code() -> None:
    out = attempt_outcome(rec(done={"a": 3}))
    assert out.action == "stop_others" and out.stop_nodes == ("b",) and "code 3" in out.reason
    out = attempt_outcome(rec(done={"a": 3, "b": 143}))
    assert (out.action, out.state, out.exit_code) == ("finish", "FAILED", 3)


def test_a_failure_reason_carries_the_nodes_own_words() -> None:
    out = attempt_outcome(rec(done={"a": 127, "b": 0}, node_reasons={"a": "image localhost/nope:latest not found"}))
    assert out.state == "FAILED" and "localhost/nope:latest" in out.reason and "code 127" in out.reason


def test_a_preempted_attempt_is_requeued_once_all_nodes_stopped() -> None:
    assert attempt_outcome(rec("CHECKPOINTED", {"a": 143})).action == "wait"
    assert attempt_outcome(rec("CHECKPOINTED", {"a": 143, "b": 143})).action == "requeue"


def test_a_job_that_finished_its_work_during_its_preemption_succeeds_instead_of_requeueing() -> None:
    out = attempt_outcome(rec("CHECKPOINTED", {"a": 0, "b": 0}))
    assert (out.action, out.state) == ("finish", "SUCCEEDED")


def test_a_cancelled_job_ends_cancelled_not_failed() -> None:
    out = attempt_outcome(rec(done={"a": 143, "b": 143}, cancel_requested=True, reason="cancelled by ann"))
    assert (out.action, out.state, out.reason) == ("finish", "CANCELLED", "cancelled by ann")


def test_launch_commands_give_each_node_its_ranks_and_one_master() -> None:
    cmds = launch_commands(rec("PLACED", checkpoint_ts=5.0, progress_s=2.0), ALLOC, 4)
    assert [c.node for c in cmds] == ["a", "b"] and [c.node_rank for c in cmds] == [0, 1]
    assert {c.master_addr for c in cmds} == {"a"} and len({c.master_port for c in cmds}) == 1
    assert all(c.world_size == 2 and c.token == 4 for c in cmds)
    assert cmds[1].ranks == [ALLOC.ranks[1]] and cmds[0].resume_progress_s == 2.0
    assert len({c.command_id for c in cmds}) == 2, "ids dedupe a replay, not two nodes"


def test_only_nodes_silent_since_the_placement_get_their_launch_again_and_only_within_the_dedupe_window() -> None:
    placed = rec("RUNNING", placed_ts=100.0, nodes_started=["a"])
    assert silent_nodes(placed, 4, now=120.0, after_s=10, until_s=500) == ["b"]
    assert silent_nodes(placed, 4, now=105.0, after_s=10, until_s=500) == [], "too soon: its report may be on the way"
    assert silent_nodes(placed, 4, now=700.0, after_s=10, until_s=500) == [], "a resend would no longer be deduplicated"
    assert silent_nodes(placed, 3, now=120.0, after_s=10, until_s=500) == [], "another attempt's token"
    finished_b = rec("RUNNING", done={"b": 0}, placed_ts=100.0, nodes_started=["a"])
    assert silent_nodes(finished_b, 4, now=120.0, after_s=10, until_s=500) == []
    assert silent_nodes(rec("PREEMPTING", placed_ts=100.0), 4, now=120.0, after_s=10, until_s=500) == []


def test_ranks_the_platform_ended_requeue_the_job_within_its_retry_budget() -> None:
    lost = rec(done={"a": 137, "b": 0}, infra_nodes=["a"], node_reasons={"a": "ranks lost after executor restart"})
    out = attempt_outcome(lost, infra_retries=2)
    assert out.action == "requeue" and "infrastructure fault" in out.reason and "executor restart" in out.reason
    spent = lost.model_copy(update={"infra_requeues": 2})
    out = attempt_outcome(spent, infra_retries=2)
    assert (out.action, out.state) == ("finish", "FAILED") and "2 retries are spent" in out.reason
    assert attempt_outcome(lost, infra_retries=0).state == "FAILED"


def test_the_gang_stopped_after_a_platform_fault_is_not_blamed_on_the_job() -> None:
    """Node a was fenced out; the solver stopped b (143, "cancelled: …"): the cause is a's, so the job requeues."""
    out = attempt_outcome(
        rec(
            done={"a": 137, "b": 143},
            infra_nodes=["a"],
            node_reasons={"a": "reservation lost (fenced out)", "b": "cancelled: rank on a exited with code 137"},
        )
    )
    assert out.action == "requeue"


def test_the_jobs_own_failure_is_the_reason_even_when_the_stopped_node_sorts_first() -> None:
    out = attempt_outcome(
        rec(done={"a": 143, "b": 3}, node_reasons={"a": "cancelled: rank on b exited with code 3", "b": "boom"})
    )
    assert (out.state, out.exit_code) == ("FAILED", 3) and "boom" in out.reason


def test_a_job_failure_beside_a_platform_fault_fails_the_job() -> None:
    out = attempt_outcome(rec(done={"a": 137, "b": 2}, infra_nodes=["a"]))
    assert (out.state, out.exit_code) == ("FAILED", 2)


# -- an MPIJob ends with its launcher (mpi-operator v2) ------------------------------------------------------------

MPI_SPEC = JobSpec.model_validate(
    {
        "name": "pi",
        "ranks": 2,
        "resources": {"gpus": 1},
        "framework": "mpijob",
        "launcher": {"entrypoint": ["mpirun"], "command": ["-n", "2", "/pi"]},
    }
)


def mpi_rec(done: dict[str, int], reasons: dict[str, str] | None = None, **kw: object) -> JobRecord:
    update: dict[str, object] = {"spec": MPI_SPEC, "node_reasons": reasons or {}, **kw}
    return rec(done=done).model_copy(update=update)


def test_a_launcher_that_ends_stops_the_workers_still_running_elsewhere() -> None:
    # "a" is the first node: its launcher exited 0 while the sshd workers on "b" still run.
    out = attempt_outcome(mpi_rec({"a": 0}))
    assert (out.action, out.stop_nodes, out.exit_code) == ("stop_others", ("b",), 0)
    assert "launcher" in out.reason


def test_the_launcher_exit_is_the_jobs_and_the_stopped_workers_exit_is_not() -> None:
    stopped = {"b": "cancelled: the launcher ended: stopping the workers"}
    out = attempt_outcome(mpi_rec({"a": 0, "b": 143}, {"a": "the launcher exited with code 0", **stopped}))
    assert (out.action, out.state, out.exit_code) == ("finish", "SUCCEEDED", 0)
    out = attempt_outcome(mpi_rec({"a": 2, "b": 143}, {"a": "the launcher exited with code 2", **stopped}))
    assert (out.action, out.state, out.exit_code) == ("finish", "FAILED", 2)
    assert "launcher" in out.reason and "code 2" in out.reason


def test_a_worker_that_fails_before_the_launcher_ends_fails_the_job_as_any_rank() -> None:
    out = attempt_outcome(mpi_rec({"b": 1}))
    assert (out.action, out.stop_nodes) == ("stop_others", ("a",))
    out = attempt_outcome(mpi_rec({"b": 1, "a": 143}, {"a": "cancelled: rank on b exited with code 1"}))
    assert (out.action, out.state, out.exit_code) == ("finish", "FAILED", 1)


def test_a_lost_launcher_node_requeues_an_mpijob_as_any_platform_fault() -> None:
    out = attempt_outcome(
        mpi_rec({"a": 137, "b": 143}, {"a": "node lost", "b": "cancelled: node lost"}, infra_nodes=["a"])
    )
    assert out.action == "requeue"


def test_a_cancelled_mpijob_ends_cancelled() -> None:
    out = attempt_outcome(mpi_rec({"a": 143, "b": 143}, cancel_requested=True, reason="cancelled by ann"))
    assert (out.action, out.state) == ("finish", "CANCELLED")


def test_launch_commands_say_how_many_ranks_each_node_runs_and_the_known_addresses() -> None:
    alloc = Allocation(
        ranks=[
            RankPlacement(rank=0, node="a", gpus=[0]),
            RankPlacement(rank=1, node="a", gpus=[1]),
            RankPlacement(rank=2, node="b", gpus=[0]),
        ]
    )
    cmds = launch_commands(rec(), alloc, 4, {"a": "10.0.0.1", "c": "10.0.0.3"})
    assert [c.ranks_per_node for c in cmds] == [[2, 1], [2, 1]]
    assert all(c.hosts == {"a": "10.0.0.1"} for c in cmds)  # only the job's nodes, only known addresses


def test_launch_commands_mark_a_gang_over_the_trays_of_one_nvlink_domain() -> None:
    nvl = ALLOC.model_copy(update={"domain": "nvlink"})
    assert all(c.multi_node_nvlink for c in launch_commands(rec("PLACED"), nvl, 4))
    assert not any(c.multi_node_nvlink for c in launch_commands(rec("PLACED"), ALLOC, 4))
