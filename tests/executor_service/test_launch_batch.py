"""`launch_batch`: one message carrying several jobs' launches on this node (issue 42, item 1). Each is handled as a
`launch` alone: its own token check and facts; one that fails leaves the others launched and fails the message."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from executor_fakes import NODE, Service, Store, executor, placed, send_launch_batch, spec
from nats.aio.client import Client
from nats.aio.msg import Msg
from oneplus_bus.settings import BusSettings
from oneplus_contracts import Allocation, FactOutcome, LaunchBatch, LaunchRanks, RankPlacement, subjects
from oneplus_node_executor.app import create_executor, executor_consumer
from oneplus_node_executor.runtime.simulated import SimulatedRuntime
from oneplus_reservations import ReservationStore
from oneplus_testing import Servers, until
from oneplus_topology.presets import load_preset

LONG = {"simulate": {"duration_s": 30, "checkpoint_after_s": None}}


async def on_gpu(svc: Service, store: Store, job_id: str, gpu: int, token: int = 1) -> LaunchRanks:
    """`placed`, its rank moved to its own GPU: a batch's jobs share the node, not a GPU."""
    cmd = await placed(svc, store, job_id, spec(**LONG), token=token)
    ranks = [RankPlacement(rank=0, node=NODE, gpus=[gpu], cpus=1, memory_mb=64)]
    store.allocations[job_id] = store.allocations[job_id].model_copy(update={"ranks": ranks})
    return cmd.model_copy(update={"ranks": ranks})


class FailsFor(SimulatedRuntime):
    """A runtime whose launch of one job raises what the executor does not expect (the message is retried)."""

    def __init__(self, job_id: str) -> None:
        super().__init__()
        self.job_id = job_id

    async def launch(self, cmd: LaunchRanks, env_per_rank: dict[int, dict[str, str]]) -> None:
        if cmd.job_id == self.job_id:
            raise RuntimeError(f"engine hiccup launching {cmd.job_id}")
        await super().launch(cmd, env_per_rank)


async def test_every_launch_of_a_batch_runs_with_its_own_facts_and_a_redelivery_starts_nothing() -> None:
    rt = SimulatedRuntime()
    ex, svc, store = executor(rt)
    cmds = [await on_gpu(svc, store, f"j-b{i}", gpu=i) for i in range(3)]
    batch = LaunchBatch.of(cmds)
    await ex.launch_batch(batch)
    assert await ex.outbox.flush(5)
    for i in range(3):
        assert svc.ledger.types(f"j-b{i}") == ["accepted", "placed", "starting", "running"]
    assert sorted(r.job_id for r in await rt.list_running()) == ["j-b0", "j-b1", "j-b2"]
    assert sorted(store.renewals) == [("j-b0", 1), ("j-b1", 1), ("j-b2", 1)]  # each launch's own token check
    await ex.launch_batch(batch)  # redelivered
    assert await ex.outbox.flush(5)
    assert [svc.ledger.types(f"j-b{i}").count("starting") for i in range(3)] == [1, 1, 1]
    assert len(await rt.list_running()) == 3
    await rt.close()


async def test_a_stale_launch_in_a_batch_is_refused_alone() -> None:
    rt = SimulatedRuntime()
    ex, svc, store = executor(rt)
    fresh = await on_gpu(svc, store, "j-fresh", gpu=0)
    stale = await on_gpu(svc, store, "j-stale", gpu=1, token=1)
    store.tokens["j-stale"] = 2  # placed again meanwhile: token 1 is fenced off
    await ex.launch_batch(LaunchBatch.of([stale, fresh]))
    assert await ex.outbox.flush(5)
    assert svc.ledger.types("j-stale") == ["accepted", "placed"]
    assert svc.ledger.types("j-fresh") == ["accepted", "placed", "starting", "running"]
    await rt.close()


async def test_a_launch_that_fails_leaves_the_others_launched_and_fails_the_message_for_a_retry() -> None:
    rt = FailsFor("j-bad")
    ex, svc, store = executor(rt)
    cmds = [await on_gpu(svc, store, job, gpu=i) for i, job in enumerate(["j-1", "j-bad", "j-3"])]
    with pytest.raises(RuntimeError, match="engine hiccup launching j-bad"):
        await ex.launch_batch(LaunchBatch.of(cmds))
    await until(lambda: sorted(ex.tokens) == ["j-1", "j-3"])
    assert sorted(r.job_id for r in await rt.list_running()) == ["j-1", "j-3"]
    # The retry (the message redelivered) launches the one that failed, and nothing twice.
    rt.job_id = ""
    await ex.launch_batch(LaunchBatch.of(cmds))
    assert await ex.outbox.flush(5)
    assert sorted(r.job_id for r in await rt.list_running()) == ["j-1", "j-3", "j-bad"]
    assert [svc.ledger.types(j).count("running") for j in ("j-1", "j-bad", "j-3")] == [1, 1, 1]
    await rt.close()


async def test_the_executor_service_runs_a_batch_off_the_commands_stream_and_acknowledges_it(
    servers: Servers, nc: Client, store: ReservationStore, tmp_path: Path
) -> None:
    node = f"batch-{store.ks.cluster}"
    await store.set_epoch(1)
    settings = BusSettings(servers.nats_url, servers.redis_url, cluster=store.ks.cluster)
    svc, _ = create_executor(
        load_preset("l40s_8gpu_pcie_node_sys", node), SimulatedRuntime(), settings, heartbeat_s=0.5, state_dir=tmp_path
    )
    got: dict[str, list[str]] = {}

    async def owner(m: Msg) -> None:
        # A stand-in job owner: answers each reported fact, as the outbox waits for.
        fact = json.loads(m.data)
        got.setdefault(fact["job_id"], []).append(fact["type"])
        answer = FactOutcome(job_id=fact["job_id"], event_id=fact["event_id"], type=fact["type"], applied=True)
        await m.respond(answer.model_dump_json().encode())

    sub = await nc.subscribe(subjects.job_report("*", "*"), cb=owner)
    await svc.app.start()
    try:
        cmds = []
        for i in range(3):
            job_id = f"{node}-j{i}"
            ranks = [RankPlacement(rank=0, node=node, gpus=[i], cpus=1, memory_mb=64)]
            token = await store.reserve(job_id, Allocation(ranks=ranks), lease_s=30)
            assert isinstance(token, int)
            cmds.append(
                LaunchRanks(
                    job_id=job_id,
                    node=node,
                    token=token,
                    spec=spec(simulate={"duration_s": 0.3}),
                    ranks=ranks,
                    world_size=1,
                    node_rank=0,
                    nodes=[node],
                    master_addr=node,
                    traceparent=f"00-{i + 1:032x}-{i + 1:016x}-01",
                )
            )
        await send_launch_batch(nc, node, cmds)
        js = nc.jetstream()
        await until(lambda: all("node_finished" in got.get(c.job_id, []) for c in cmds), timeout=20)
        assert {c.job_id: got[c.job_id] for c in cmds} == {
            c.job_id: ["starting", "running", "node_finished"] for c in cmds
        }
        deadline = time.monotonic() + 10
        while (info := await js.consumer_info(subjects.COMMANDS_STREAM, executor_consumer(node))).num_ack_pending:
            assert time.monotonic() < deadline, "the batch was not acknowledged"
            await asyncio.sleep(0.05)
        assert info.num_pending == 0 and info.num_redelivered == 0
    finally:
        await sub.unsubscribe()
        await svc.app.stop()
