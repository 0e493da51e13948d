"""The node's side of "nothing lost, nothing used twice, nothing wedged", against a real Redis reservation store.

The job ledger is the fake of executor_fakes (it folds facts with the real lifecycle); leases, tokens, epochs and
their statuses are the real store's. A reset store keeps the ranks, a stale or gone reservation fences them out (and
their end is reported only once they have stopped, blamed on the platform), the heartbeat reports the ranks alive
here, a launch never lands on a GPU another attempt still runs on, and a reconcile against a reset store adopts what
runs and removes nothing.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from executor_fakes import NODE, Service, executor, spec
from oneplus_contracts import (
    Allocation,
    JobAccepted,
    JobNodeFinished,
    JobPlaced,
    JobRunning,
    LaunchRanks,
    RankPlacement,
)
from oneplus_node_executor.node import FENCED_OUT, LAUNCH_FAILED_EXIT, LOST_EXIT, NodeExecutor
from oneplus_node_executor.runtime.simulated import SimulatedRuntime
from oneplus_reservations import ReservationStore
from oneplus_testing import until

LONG = {"simulate": {"duration_s": 60}}


def on_redis(store: ReservationStore, runtime: SimulatedRuntime) -> tuple[NodeExecutor, Service]:
    ex, svc, _ = executor(runtime)
    ex.store = store
    return ex, svc


def allocation(gpus: list[int]) -> Allocation:
    return Allocation(ranks=[RankPlacement(rank=0, node=NODE, gpus=gpus, cpus=1, memory_mb=64)])


async def reserve(
    svc: Service, store: ReservationStore, job_id: str, gpus: list[int], launch_gpus: list[int] | None = None
) -> LaunchRanks:
    """Reserve `gpus` in Redis and place the job in the ledger, as the solver does; the launch command (whose GPUs
    are `launch_gpus` when given: a command that disagrees with the store)."""
    alloc = allocation(gpus)
    token = await store.reserve(job_id, alloc, lease_s=30)
    assert isinstance(token, int), token
    job = spec(**LONG)
    await svc.ledger.record(JobAccepted(job_id=job_id, spec=job))
    await svc.ledger.record(JobPlaced(job_id=job_id, allocation=alloc, token=token))
    ranks = allocation(launch_gpus).ranks if launch_gpus is not None else alloc.ranks
    return LaunchRanks(
        job_id=job_id,
        node=NODE,
        token=token,
        spec=job,
        ranks=ranks,
        world_size=1,
        node_rank=0,
        nodes=[NODE],
        master_addr="127.0.0.1",
    )


async def running(rt: SimulatedRuntime) -> list[str]:
    return sorted(r.job_id for r in await rt.list_running())


def ends_seen_with(ex: NodeExecutor, rt: SimulatedRuntime) -> list[tuple[str, list[str], bool]]:
    """Wrap node_finished: for each end, the jobs still running in the runtime and whether a lease was still held."""
    seen: list[tuple[str, list[str], bool]] = []
    original = ex.node_finished

    async def node_finished(job_id: str, token: int, *args: Any, **kw: Any) -> None:
        seen.append((job_id, [r.job_id for r in await rt.list_running()], (job_id, token) in ex.held()))
        await original(job_id, token, *args, **kw)

    ex.node_finished = node_finished  # type: ignore[method-assign]
    return seen


async def test_a_reset_store_keeps_the_ranks_and_a_lost_reservation_fences_them_out_after_they_stop(
    store: ReservationStore, caplog: pytest.LogCaptureFixture
) -> None:
    rt = SimulatedRuntime()
    ex, svc = on_redis(store, rt)
    ends = ends_seen_with(ex, rt)
    cmd = await reserve(svc, store, "f-1", [2, 3])
    await ex.launch(cmd)
    assert await running(rt) == ["f-1"]
    await ex.heartbeat_once()
    (hb,) = svc.nc.heartbeats()
    assert hb.running == ["f-1"]
    assert [(r.job_id, r.token, r.gpus) for r in hb.ranks] == [("f-1", cmd.token, [2, 3])]

    # Redis restarted empty: no epoch marker, no reservation. The ranks keep running; it is said once.
    await store.wipe()
    assert await store.epoch() is None
    with caplog.at_level(logging.WARNING, logger="oneplus.executor"):
        for _ in range(3):
            await ex.heartbeat_once()
    assert sum("lost its state" in r.getMessage() for r in caplog.records) == 1
    assert await running(rt) == ["f-1"] and "f-1" not in ex.stopping
    assert [r.job_id for r in svc.nc.heartbeats()[-1].ranks] == ["f-1"]

    # The solver rebuilds it under the same token: the renewals succeed again.
    assert await store.restore("f-1", cmd.token, allocation([2, 3]), lease_s=30) is True
    await store.set_epoch(2)
    await ex.heartbeat_once()
    assert not ex.store_reset and await running(rt) == ["f-1"]

    # Another attempt holds it now (stale), or it is gone: fenced out, reported once the ranks have stopped.
    assert await store.release("f-1", cmd.token)
    await ex.heartbeat_once()
    await until(lambda: "node_finished" in svc.ledger.types("f-1"))
    assert await running(rt) == []
    assert ends == [("f-1", [], False)], "reported after the ranks stopped, with no lease held for them"
    rec = svc.ledger.records["f-1"]
    assert rec.node_reasons == {NODE: FENCED_OUT} and rec.infra_nodes == [NODE]
    (fin,) = [e for e in svc.ledger.events if isinstance(e, JobNodeFinished)]
    assert fin.fault == "infrastructure" and fin.exit_code == 143
    await ex.heartbeat_once()
    assert svc.nc.heartbeats()[-1].ranks == [] and ex.held() == []


class Stubborn(SimulatedRuntime):
    """Ranks of the jobs in `deaf` ignore a stop (a hung process, an engine that never kills)."""

    def __init__(self, deaf: set[str]) -> None:
        super().__init__()
        self.deaf = deaf

    async def stop(self, job_id: str, grace_s: float) -> None:
        if job_id not in self.deaf:
            await super().stop(job_id, grace_s)


async def test_a_launch_on_a_gpu_held_by_a_fenced_out_attempt_waits_for_it_to_stop_then_starts(
    store: ReservationStore,
) -> None:
    rt = SimulatedRuntime()
    ex, svc = on_redis(store, rt)
    old = await reserve(svc, store, "f-old", [0])
    await ex.launch(old)
    # The store forgot f-old (its lease ran out while the node was cut off) and gave GPU 0 to f-new.
    assert await store.release("f-old", old.token)
    new = await reserve(svc, store, "f-new", [0])
    await ex.launch(new)
    assert await running(rt) == ["f-new"]
    assert await ex.outbox.flush(5)
    order = [(e.job_id, e.type) for e in svc.ledger.events if e.type in ("node_finished", "starting")]
    assert order == [("f-old", "starting"), ("f-old", "node_finished"), ("f-new", "starting")]
    assert svc.ledger.records["f-old"].node_reasons == {NODE: FENCED_OUT}
    assert svc.ledger.records["f-new"].state == "RUNNING"
    await ex.heartbeat_once()
    assert [(r.job_id, r.gpus) for r in svc.nc.heartbeats()[-1].ranks] == [("f-new", [0])]


async def test_a_launch_on_a_gpu_still_in_use_is_refused_naming_the_gpu_and_the_holder(
    store: ReservationStore,
) -> None:
    rt = Stubborn({"f-deaf"})
    ex, svc = on_redis(store, rt)
    ex.gpu_free_wait_s = 0.3
    holder = await reserve(svc, store, "f-holder", [0])
    await ex.launch(holder)
    # A command that disagrees with the store (its GPU 1 reserved, GPU 0 named): the holder is current, left alone.
    wrong = await reserve(svc, store, "f-wrong", [1], launch_gpus=[0])
    await ex.launch(wrong)
    assert await ex.outbox.flush(5)
    rec = svc.ledger.records["f-wrong"]
    assert rec.nodes_done == {NODE: LAUNCH_FAILED_EXIT} and rec.infra_nodes == [NODE]
    assert rec.node_reasons[NODE] == f"not started: GPU 0 of {NODE} still runs f-holder (token {holder.token})"
    assert await running(rt) == ["f-holder"] and "f-holder" not in ex.stopping
    assert "starting" not in svc.ledger.types("f-wrong")
    await ex.launch(wrong)  # a redelivery of the refused launch starts nothing either
    assert await running(rt) == ["f-holder"]

    # A fenced-out holder that does not stop within the wait: still refused, never two ranks on one GPU.
    deaf = await reserve(svc, store, "f-deaf", [5])
    await ex.launch(deaf)
    assert await store.release("f-deaf", deaf.token)
    late = await reserve(svc, store, "f-late", [5])
    started = asyncio.get_running_loop().time()
    await ex.launch(late)
    assert asyncio.get_running_loop().time() - started < 5
    assert await ex.outbox.flush(5)
    assert svc.ledger.records["f-late"].node_reasons[NODE].startswith(f"not started: GPU 5 of {NODE} still runs f-deaf")
    assert sorted(await running(rt)) == ["f-deaf", "f-holder"]


async def test_a_reconcile_against_a_reset_store_adopts_everything_removes_nothing_and_runs_again(
    store: ReservationStore,
) -> None:
    rt = SimulatedRuntime()
    ex, svc = on_redis(store, rt)
    kept = await reserve(svc, store, "f-kept", [4, 5])
    await rt.launch(kept, {})  # started by the executor before its restart
    await svc.ledger.record(JobRunning(job_id="f-kept", node=NODE, token=kept.token))
    gone = await reserve(svc, store, "f-gone", [6])  # running here before the restart; its ranks did not survive
    await svc.ledger.record(JobRunning(job_id="f-gone", node=NODE, token=gone.token))
    await store.wipe()  # ... and Redis restarted empty meanwhile

    await ex.reconcile()
    assert not ex.reconciled, "to be done again once the store is rebuilt"
    assert ex.tokens == {"f-kept": kept.token} and await running(rt) == ["f-kept"]
    assert ex.alive == {"f-kept": (kept.token, {4: 0, 5: 0})}, "its GPUs from the job's record"
    assert "node_finished" not in svc.ledger.types("f-gone"), "nothing is known lost while the store is reset"
    await ex.check_engine()  # the health loop: still reset, still nothing removed
    assert not ex.reconciled and await running(rt) == ["f-kept"]

    # The solver rebuilds both reservations under their tokens; the next reconcile keeps f-kept, reports f-gone lost.
    assert await store.restore("f-kept", kept.token, allocation([4, 5])) is True
    assert await store.restore("f-gone", gone.token, allocation([6])) is True
    await store.set_epoch(2)
    await ex.check_engine()
    assert ex.reconciled and await running(rt) == ["f-kept"] and ex.tokens == {"f-kept": kept.token}
    assert await ex.outbox.flush(5)
    rec = svc.ledger.records["f-gone"]
    assert rec.nodes_done == {NODE: LOST_EXIT} and rec.infra_nodes == [NODE]
    assert rec.node_reasons[NODE] == f"ranks lost: none found on {NODE} after its executor restarted"


async def test_a_watcher_that_dies_is_logged_and_started_again_and_the_end_is_reported(
    store: ReservationStore, caplog: pytest.LogCaptureFixture
) -> None:
    rt = SimulatedRuntime()
    ex, svc = on_redis(store, rt)
    put = ex.outbox.put
    failures = [OSError("No space left on device")]

    def full_disk_once(event: Any) -> None:
        if event.type == "node_finished" and failures:
            raise failures.pop()
        put(event)

    ex.outbox.put = full_disk_once  # type: ignore[method-assign]
    cmd = await reserve(svc, store, "f-w", [7])
    cmd = cmd.model_copy(update={"spec": spec(simulate={"duration_s": 0.2})})
    with caplog.at_level(logging.ERROR, logger="oneplus.executor"):
        await ex.launch(cmd)
        await until(lambda: "node_finished" in svc.ledger.types("f-w"))
    assert any("died" in r.getMessage() and "No space left" in r.getMessage() for r in caplog.records)
    assert svc.ledger.records["f-w"].nodes_done == {NODE: 0} and "f-w" not in ex.tokens


async def test_a_launch_during_a_store_reset_waits_for_the_rebuild(store: ReservationStore) -> None:
    rt = SimulatedRuntime()
    ex, svc = on_redis(store, rt)
    cmd = await reserve(svc, store, "f-r", [1])
    await store.wipe()

    async def rebuild() -> None:
        await asyncio.sleep(0.5)
        assert await store.restore("f-r", cmd.token, allocation([1])) is True
        await store.set_epoch(2)

    await asyncio.gather(ex.launch(cmd), rebuild())
    assert await running(rt) == ["f-r"], "started once the solver rebuilt its reservation, not refused as stale"
