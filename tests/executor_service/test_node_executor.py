"""The executor's handlers over the runtime protocol, with the bus and Redis stood in (the ledger is the real fold)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from executor_fakes import NODE, executor, placed, spec
from oneplus_bus.service import OpsError
from oneplus_contracts import (
    NODE_COMMAND_ADAPTER,
    CancelRanks,
    JobPreempting,
    LaunchRanks,
    NodeLease,
    PreemptRanks,
    SignalRanks,
    subjects,
)
from oneplus_node_executor.node import LAUNCH_FAILED_EXIT, LOST_EXIT, STOP_GRACE_S, WATCH_TRIES
from oneplus_node_executor.runtime.base import EngineUnavailable, LaunchFailed, RanksExit
from oneplus_node_executor.runtime.simulated import SimulatedRuntime
from oneplus_testing import until

FAST = {"simulate": {"duration_s": 0.1}}


async def test_a_launched_job_runs_and_its_node_end_is_recorded_with_the_runtime_reason() -> None:
    ex, svc, store = executor(SimulatedRuntime())
    cmd = await placed(svc, store, "j-ok", spec(**FAST))
    await ex.launch(cmd)
    await until(lambda: "node_finished" in svc.ledger.types("j-ok"))
    assert svc.ledger.types("j-ok") == ["accepted", "placed", "starting", "running", "node_finished"]
    rec = svc.ledger.records["j-ok"]
    assert rec.nodes_done == {NODE: 0}
    assert rec.node_reasons == {NODE: "simulated: exited 0 after 0.1 s (no process ran)"}  # says nothing ran
    assert store.renewals == [("j-ok", 1)]
    assert "j-ok" not in ex.tokens


async def test_a_redelivered_launch_starts_nothing_and_a_stale_token_is_refused() -> None:
    rt = SimulatedRuntime()
    ex, svc, store = executor(rt)
    cmd = await placed(svc, store, "j-twice", spec(simulate={"duration_s": 5}))
    await ex.launch(cmd)
    await ex.launch(cmd)
    assert await ex.outbox.flush(5)
    assert svc.ledger.types("j-twice").count("starting") == 1
    assert [r.job_id for r in await rt.list_running()] == ["j-twice"]

    old = await placed(svc, store, "j-stale", spec(**FAST), token=1)
    store.tokens["j-stale"] = 2  # the job was placed again meanwhile: token 1 is fenced off
    await ex.launch(old)
    assert await ex.outbox.flush(5)
    assert svc.ledger.types("j-stale") == ["accepted", "placed"]
    await rt.close()


class MissingImage(SimulatedRuntime):
    async def launch(self, cmd: LaunchRanks, env_per_rank: dict[int, dict[str, str]]) -> None:
        raise LaunchFailed(f"image {cmd.spec.image} not found on node {cmd.node} (pull_policy=Never)")


class EngineGone(SimulatedRuntime):
    async def launch(self, cmd: LaunchRanks, env_per_rank: dict[int, dict[str, str]]) -> None:
        raise EngineUnavailable("container engine at unix:///gone.sock is unreachable (listing containers): refused")


async def test_a_missing_image_ends_the_node_with_a_reason_naming_it() -> None:
    ex, svc, store = executor(MissingImage())
    await ex.launch(await placed(svc, store, "j-img", spec(image="localhost/nope:1", pull_policy="Never")))
    assert await ex.outbox.flush(5)
    rec = svc.ledger.records["j-img"]
    assert rec.nodes_done == {NODE: LAUNCH_FAILED_EXIT}
    assert rec.infra_nodes == [], "the job's own image: its fault, not the platform's"
    assert (
        rec.node_reasons[NODE] == "launch failed: image localhost/nope:1 not found on node unit-0 (pull_policy=Never)"
    )
    assert ex.engine_ok, "a missing image says nothing about the engine"


async def test_an_unreachable_engine_fails_the_launch_and_reports_the_node_unhealthy_at_once() -> None:
    ex, svc, store = executor(EngineGone())
    await ex.launch(await placed(svc, store, "j-eng", spec(**FAST)))
    assert await ex.outbox.flush(5)
    rec = svc.ledger.records["j-eng"]
    assert rec.nodes_done == {NODE: LAUNCH_FAILED_EXIT}
    assert rec.infra_nodes == [NODE], "an engine that cannot be reached is the platform's fault: the job is requeued"
    assert "container engine at unix:///gone.sock is unreachable" in rec.node_reasons[NODE]
    (hb,) = svc.nc.heartbeats()  # published by the launch itself, not by the next heartbeat
    assert not hb.engine_ok and hb.engine_reason is not None and "unreachable" in hb.engine_reason
    assert [g.index for g in hb.gpus] == list(range(8)) and all(g.healthy for g in hb.gpus)


class ExitsAfterCheckpoint(SimulatedRuntime):
    """A job that exits on its own right after writing its checkpoint: its end races the executor's poll."""

    def _mark_checkpoint(self, job: Any) -> None:
        super()._mark_checkpoint(job)
        job.stopped.set()


async def test_a_signal_command_reaches_the_running_ranks_and_the_job_goes_on() -> None:
    rt = SimulatedRuntime()
    ex, svc, store = executor(rt)
    await ex.launch(await placed(svc, store, "j-sig", spec(simulate={"duration_s": 30, "checkpoint_after_s": None})))
    assert await ex.outbox.flush(5)
    wire = SignalRanks(job_id="j-sig", node=NODE, token=1, signal="SIGUSR1", by="ana").model_dump_json()
    cmd = NODE_COMMAND_ADAPTER.validate_json(wire)  # as the executor reads it off the commands stream
    assert isinstance(cmd, SignalRanks)
    await ex.signal(cmd)
    assert "received SIGUSR1" in await rt.logs("j-sig", None, follow=False)
    assert svc.ledger.records["j-sig"].state == "RUNNING" and "j-sig" in ex.tokens  # not ended by it
    # A stale token's signal (the job was placed again) is not delivered.
    await ex.signal(SignalRanks(job_id="j-sig", node=NODE, token=7, signal="SIGUSR2"))
    assert "received SIGUSR2" not in await rt.logs("j-sig", None, follow=False)
    await rt.close()


class RecordsStops(SimulatedRuntime):
    def __init__(self) -> None:
        super().__init__()
        self.stops: list[tuple[str, float]] = []

    async def stop(self, job_id: str, grace_s: float) -> None:
        self.stops.append((job_id, grace_s))
        await super().stop(job_id, grace_s)


async def test_a_job_past_its_time_limit_is_stopped_as_a_cancel_stops_it_with_the_reason() -> None:
    rt = RecordsStops()
    ex, svc, store = executor(rt)
    await ex.launch(await placed(svc, store, "j-late", spec(time_limit_s=1, simulate={"duration_s": 30})))
    await ex.launch(await placed(svc, store, "j-quick", spec(time_limit_s=30, simulate={"duration_s": 0.1})))
    await until(lambda: "node_finished" in svc.ledger.types("j-late"))
    rec = svc.ledger.records["j-late"]
    assert rec.node_reasons[NODE] == "time limit reached: stopped after 1 s (--time)"
    assert rec.nodes_done == {NODE: 143}  # failed, as Slurm's TIMEOUT, whatever the ranks exit on SIGTERM
    assert rt.stops == [("j-late", STOP_GRACE_S)]  # SIGTERM, SIGKILL after the stop grace: a step's tasks too
    await until(lambda: "node_finished" in svc.ledger.types("j-quick"))
    assert "j-quick" not in ex.deadlines and "j-late" not in ex.deadlines  # a job ended in time leaves no timer
    await rt.close()


@pytest.mark.parametrize("runtime_class", [SimulatedRuntime, ExitsAfterCheckpoint])
async def test_preemption_records_the_acknowledged_checkpoint_before_the_node_end(
    runtime_class: type[SimulatedRuntime],
) -> None:
    ex, svc, store = executor(runtime_class())
    job = spec(simulate={"duration_s": 30, "checkpoint_after_s": 0.3})
    cmd = await placed(svc, store, "j-pre", job)
    await ex.launch(cmd)
    assert await ex.outbox.flush(5)
    await svc.ledger.record(JobPreempting(job_id="j-pre", token=1, preemptor="j-hi", reason="for j-hi"))
    preempt = PreemptRanks(job_id="j-pre", node=NODE, token=1, signal="SIGUSR1", grace_s=5, reason="for j-hi")
    ex.start_preempt(preempt)
    ex.start_preempt(preempt)  # a redelivery while the handshake runs starts no second one
    await until(lambda: "node_finished" in svc.ledger.types("j-pre"))
    assert svc.ledger.types("j-pre")[-2:] == ["checkpointed", "node_finished"]
    (ck,) = [e for e in svc.ledger.events if e.type == "checkpointed"]
    assert ck.acknowledged  # type: ignore[union-attr]
    rec = svc.ledger.records["j-pre"]
    assert rec.state == "CHECKPOINTED" and rec.checkpoint_ts == ck.checkpoint_ts  # type: ignore[union-attr]
    assert rec.node_reasons[NODE] == "preempted: for j-hi"


async def test_a_checkpoint_never_acknowledged_waits_the_grace_then_stops_anyway() -> None:
    ex, svc, store = executor(SimulatedRuntime())
    await ex.launch(await placed(svc, store, "j-deaf", spec(simulate={"duration_s": 30, "checkpoint_after_s": None})))
    ex.start_preempt(PreemptRanks(job_id="j-deaf", node=NODE, token=1, grace_s=0.3, reason="for j-hi"))
    await until(lambda: "node_finished" in svc.ledger.types("j-deaf"))
    (ck,) = [e for e in svc.ledger.events if e.type == "checkpointed"]
    assert not ck.acknowledged  # type: ignore[union-attr]
    assert svc.ledger.records["j-deaf"].checkpoint_ts is None


async def test_preempting_ranks_that_end_meanwhile_does_not_wait_out_the_grace() -> None:
    ex, svc, store = executor(SimulatedRuntime())
    await ex.launch(await placed(svc, store, "j-done", spec(simulate={"duration_s": 0.3, "checkpoint_after_s": None})))
    started = asyncio.get_running_loop().time()
    ex.start_preempt(PreemptRanks(job_id="j-done", node=NODE, token=1, grace_s=60, reason="for j-hi"))
    await until(lambda: "node_finished" in svc.ledger.types("j-done"), timeout=10)
    assert asyncio.get_running_loop().time() - started < 5, "the handshake ended with the ranks, not the grace"
    assert svc.ledger.types("j-done")[-2:] == ["checkpointed", "node_finished"]


async def test_cancel_of_another_attempt_is_ignored_and_of_this_one_stops_the_ranks() -> None:
    ex, svc, store = executor(SimulatedRuntime())
    await ex.launch(await placed(svc, store, "j-c", spec(simulate={"duration_s": 30})))
    await ex.cancel(CancelRanks(job_id="j-c", node=NODE, token=7, reason="old"))
    assert "j-c" in ex.tokens
    await ex.cancel(CancelRanks(job_id="j-c", node=NODE, token=1, reason="by alice"))
    await until(lambda: "node_finished" in svc.ledger.types("j-c"))
    assert svc.ledger.records["j-c"].node_reasons[NODE] == "cancelled: by alice"


async def test_ended_jobs_keep_their_logs_until_newer_ones_push_them_out_and_a_clean_stop_removes_them() -> None:
    rt = SimulatedRuntime()
    ex, svc, store = executor(rt, keep_finished=2)
    for i in range(3):
        await ex.launch(await placed(svc, store, f"j-{i}", spec(**FAST)))
        await until(lambda i=i: "node_finished" in svc.ledger.types(f"j-{i}"))  # type: ignore[misc]
    assert await rt.logs("j-0", None, follow=False) == [], "the oldest ended job was removed"
    lines = (await ex.logs({"job_id": "j-2"}))["lines"]
    assert lines[1:] == ["[rank 0] started on unit-0 gpus=[0]", "[rank 0] exited 0"]
    assert lines[0].startswith("[simulated] runtime simulated:") and "is not run" in lines[0]
    await ex.stop()
    assert await rt.logs("j-1", None, follow=False) == [] and await rt.logs("j-2", None, follow=False) == []


class Unfollowable(SimulatedRuntime):
    def __init__(self) -> None:
        super().__init__()
        self.stopped: list[str] = []

    async def wait(self, job_id: str) -> RanksExit:
        raise RuntimeError("the engine answered nonsense")

    async def stop(self, job_id: str, grace_s: float) -> None:
        self.stopped.append(job_id)
        await super().stop(job_id, grace_s)


async def test_ranks_that_cannot_be_followed_are_stopped_then_reported_lost() -> None:
    rt = Unfollowable()
    ex, svc, store = executor(rt)
    await ex.launch(await placed(svc, store, "j-lost", spec(simulate={"duration_s": 30})))
    await until(lambda: "node_finished" in svc.ledger.types("j-lost"), timeout=WATCH_TRIES * 0.05 + 5)
    rec = svc.ledger.records["j-lost"]
    assert rec.nodes_done == {NODE: LOST_EXIT} and rec.infra_nodes == [NODE]
    assert rec.node_reasons[NODE] == "the executor on unit-0 could not follow the ranks: the engine answered nonsense"
    assert rt.stopped == ["j-lost"], "stopped before the reservation could be released"


class Flaky(SimulatedRuntime):
    def __init__(self, answers: list[bool]) -> None:
        super().__init__()
        self.answers = answers

    async def healthy(self) -> tuple[bool, str | None]:
        ok = self.answers.pop(0)
        return ok, None if ok else "container engine at unix:///x.sock is unreachable (ping): no answer in time"


async def test_one_slow_ping_is_not_an_outage_two_in_a_row_are_and_the_next_answer_ends_it() -> None:
    ex, svc, _ = executor(Flaky([False, True, False, False, True]))
    seen = []
    for _ in range(5):
        await ex.check_engine()
        await ex.heartbeat_once()
        seen.append(svc.nc.heartbeats()[-1].engine_ok)
    assert seen == [True, True, True, False, True]
    down = [hb for hb in svc.nc.heartbeats() if not hb.engine_ok]
    assert (
        down and down[0].engine_reason == "container engine at unix:///x.sock is unreachable (ping): no answer in time"
    )


async def test_a_deferred_reconcile_adopts_running_ranks_once_the_engine_answers() -> None:
    rt = SimulatedRuntime()
    ex, svc, store = executor(rt)
    cmd = await placed(svc, store, "j-adopt", spec(simulate={"duration_s": 0.3}))
    await rt.launch(cmd, {})  # started by the executor before its restart
    ex.reconciled = False  # the engine did not answer when this executor started
    await ex.check_engine()
    assert ex.reconciled and ex.tokens == {"j-adopt": 1}
    await until(lambda: "node_finished" in svc.ledger.types("j-adopt"))


async def test_ranks_adopted_after_a_restart_keep_their_time_limit_from_the_jobs_record() -> None:
    rt = RecordsStops()
    ex, svc, store = executor(rt)
    cmd = await placed(svc, store, "j-adopt-late", spec(time_limit_s=1, simulate={"duration_s": 30}))
    await rt.launch(cmd, {})  # started by the executor before its restart
    ex.reconciled = False
    await ex.check_engine()
    assert ex.tokens == {"j-adopt-late": 1} and ex.deadlines["j-adopt-late"][0] == 1
    await until(lambda: "node_finished" in svc.ledger.types("j-adopt-late"))
    rec = svc.ledger.records["j-adopt-late"]
    assert rec.node_reasons[NODE] == "time limit reached: stopped after 1 s (--time)" and rt.stops


async def test_the_logs_endpoint_refuses_bad_requests_by_name() -> None:
    ex, _, _ = executor(SimulatedRuntime())
    with pytest.raises(OpsError, match="job_id is required"):
        await ex.logs({})
    with pytest.raises(OpsError, match="whole numbers"):
        await ex.logs({"job_id": "j", "rank": "first"})
    with pytest.raises(OpsError, match="cannot be negative"):
        await ex.logs({"job_id": "j", "since": -1})


async def test_a_node_reports_in_full_on_change_when_asked_and_every_report_every_s_and_leases_in_between() -> None:
    ex, svc, store = executor(SimulatedRuntime())
    ex.report_every_s = 3600.0

    def sent() -> list[str]:
        kinds = [subject.rsplit(".", 1)[1] for subject, _ in svc.nc.published]
        svc.nc.published.clear()
        return kinds

    await ex.publish_heartbeat()
    await ex.publish_heartbeat()
    assert sent() == ["heartbeat", "lease"], "the first is a full report; an unchanged one is a lease"
    await ex.publish_heartbeat()
    ((subject, body),) = svc.nc.published
    lease = NodeLease.model_validate_json(body)
    assert subject == subjects.node_lease(NODE) and lease.report_ts == ex.report_ts < lease.ts
    svc.nc.published.clear()

    await ex.launch(await placed(svc, store, "j-rep", spec(simulate={"duration_s": 30})))
    await ex.publish_heartbeat()
    (hb,) = svc.nc.heartbeats()
    assert [(r.job_id, r.gpus) for r in hb.ranks] == [("j-rep", [0])], "a rank that starts is news"
    sent()
    await ex.engine_down(EngineUnavailable("the engine's socket is gone"))
    assert sent() == ["heartbeat"], "an engine that goes is news, at once"
    await ex.publish_heartbeat()
    assert sent() == ["lease"]
    ex.ask_for_report()
    await ex.publish_heartbeat()
    assert sent() == ["heartbeat"], "a report asked for is sent unchanged"
    ex.report_every_s = 0.01
    await asyncio.sleep(0.02)
    await ex.publish_heartbeat()
    assert sent() == ["heartbeat"], "an unchanged report is repeated every report_every_s"
    await ex.stop_ranks("j-rep", 0.1)
