"""A reservation store that lost its state is noticed and rebuilt before anything is placed again.

The solver runs in this process against real NATS and Redis with its loops off, so the test drives each step. A
"reset" is what a Redis restarted without persistence looks like to the platform: every key of the cluster gone,
its epoch marker and fencing counter included.
"""

from __future__ import annotations

import asyncio
import time

from nats.aio.client import Client
from nats.aio.msg import Msg
from oneplus_contracts import (
    JobAccepted,
    JobFinished,
    JobRequeued,
    NodeHeartbeat,
    NodeReportRequest,
    RankReport,
    subjects,
)
from oneplus_reservations import EPOCH_SPAN, check_history
from oneplus_stores.audit import audit_history, read_audit
from oneplus_testing import Servers
from test_cycle_store_ops import add_nodes, solver_on_fresh_bus, spec


async def placed_tokens(solver: object, ids: list[str]) -> dict[str, int]:
    index = solver.owner.index  # type: ignore[attr-defined]
    return {j: index.get(j).token for j in ids if index.get(j) is not None and index.get(j).token is not None}


async def test_a_reset_store_is_rebuilt_under_the_running_jobs_tokens_and_new_tokens_go_above_them(
    nc: Client, servers: Servers, cluster_name: str
) -> None:
    async with solver_on_fresh_bus(nc, servers, cluster_name) as solver:
        store = solver.store
        epoch = await store.epoch()
        assert epoch is not None and epoch >= 1, "the first start sets the store up"
        await add_nodes(nc, solver, 3)
        first = ["r-0", "r-1"]
        await solver.owner.commit(*[JobAccepted(event_id=f"a-{j}", job_id=j, spec=spec(0, 8)) for j in first])
        assert await solver.schedule_once() == 2
        before = await placed_tokens(solver, first)
        assert all(t > epoch * EPOCH_SPAN for t in before.values())

        await store.wipe()  # Redis restarted empty: no reservation, no marker, the fencing counter back at 0
        assert await store.epoch() is None
        # Two more whole-node jobs wait; one node is free, two run jobs whose reservations are gone.
        more = ["r-2", "r-3"]
        await solver.owner.commit(*[JobAccepted(event_id=f"a-{j}", job_id=j, spec=spec(1, 8)) for j in more])
        # The commit script refuses a store without its marker: nothing is placed into it.
        assert await solver.schedule_once() == 0
        assert not solver.store_ok and await store.all() == []
        # The next cycle rebuilds first, then places on the one free node only.
        assert await solver.schedule_once() == 1
        assert solver.store_resets == 1
        assert await store.epoch() == epoch + 1
        held = {r.job_id: r.token for r in await store.all()}
        placed = next(j for j in more if j in held)
        assert {j: t for j, t in held.items() if j in first} == before, "rebuilt under the tokens the ranks hold"
        assert held[placed] > (epoch + 1) * EPOCH_SPAN > max(before.values()), "new tokens go above every old one"
        assert await store.renew_status("r-0", before["r-0"]) == "ok"
        assert await solver.schedule_once() == 0, "no GPU is free: nothing may go on the running jobs' GPUs"

        # One running job ends (its end committed, then its reservation freed); the last one waiting takes its node.
        await solver.owner.commit(
            JobFinished(event_id="f-r-0", job_id="r-0", state="SUCCEEDED", reason="done", token=before["r-0"])
        )
        await solver.release("r-0", before["r-0"], "done")
        assert await solver.schedule_once() == 1
        # The audit (the job transitions, and the restores) still holds the first epoch's reservations: no double use.
        await solver.audit.flush()
        # This test's jobs only: CI once saw another platform's `j-` reserves here, on the shared test bus.
        entries = [e for e in await read_audit(nc) if e.job_id.startswith("r-")]
        assert [(e.op, e.job_id) for e in entries][:2] == [("reserve", "r-0"), ("reserve", "r-1")]
        assert {(e.op, e.job_id) for e in entries} >= {("restore", "r-0"), ("restore", "r-1"), ("release", "r-0")}
        assert check_history(audit_history(entries, cluster_name)) == []


async def test_reconcile_notices_a_reset_and_does_not_requeue_jobs_whose_reservation_vanished(
    nc: Client, servers: Servers, cluster_name: str
) -> None:
    async with solver_on_fresh_bus(nc, servers, cluster_name) as solver:
        await add_nodes(nc, solver, 1)
        await solver.owner.commit(JobAccepted(event_id="a-x", job_id="x", spec=spec(0, 4)))
        assert await solver.schedule_once() == 1
        token = solver.owner.index.get("x").token
        await solver.store.wipe()
        await solver.reconcile()
        rec = solver.owner.index.get("x")
        assert rec.state == "PLACED" and rec.token == token, "rebuilt, not requeued"
        assert {r.job_id: r.token for r in await solver.store.all()} == {"x": token}


async def test_reconcile_frees_the_reservation_of_a_requeued_attempt_whose_release_the_store_lost(
    nc: Client, servers: Servers, cluster_name: str
) -> None:
    """CI's chaos run: the release after a preemption's requeue failed (Redis restarting); reconcile must not take
    the leftover reservation for a placement that was never recorded and record the old attempt as placed again."""
    async with solver_on_fresh_bus(nc, servers, cluster_name) as solver:
        await add_nodes(nc, solver, 1)
        await solver.owner.commit(JobAccepted(event_id="a-w", job_id="w", spec=spec(0, 2)))
        assert await solver.schedule_once() == 1
        token = solver.owner.index.get("w").token
        # Requeued (the store unreachable, so its reservation stays).
        await solver.owner.commit(JobRequeued(event_id=f"rq-w-{token}", job_id="w", reason="preempted", token=token))
        assert {r.job_id: r.token for r in await solver.store.all()} == {"w": token}
        seq = solver.owner.index.get("w").seq
        await solver.reconcile()
        rec = solver.owner.index.get("w")
        assert rec.state == "ACCEPTED" and rec.seq == seq, "nothing recorded for the ended attempt"
        assert await solver.store.all() == [], "its reservation freed"
        assert await solver.schedule_once() == 1, "and the job placed again under a new token"
        assert solver.owner.index.get("w").token > token


async def test_a_gpu_a_node_still_reports_in_use_is_not_offered(
    nc: Client, servers: Servers, cluster_name: str
) -> None:
    """The store frees a GPU (a lease ran out, say) while the node still runs an old attempt's rank there."""
    async with solver_on_fresh_bus(nc, servers, cluster_name) as solver:
        await add_nodes(nc, solver, 1)
        ghost = NodeHeartbeat(node="n0", ts=time.time(), ranks=[RankReport(job_id="old", token=3, gpus=list(range(8)))])
        await nc.publish(subjects.node_heartbeat("n0"), ghost.model_dump_json().encode())
        deadline = time.monotonic() + 5
        while not solver.reports.ranks.get("n0"):
            assert time.monotonic() < deadline, "the solver never saw the heartbeat"
            await asyncio.sleep(0.05)
        await solver.owner.commit(JobAccepted(event_id="a-y", job_id="y", spec=spec(0, 1)))
        assert await solver.schedule_once() == 0, "every GPU of n0 still runs the old attempt's ranks"
        gone = NodeHeartbeat(node="n0", ts=time.time(), ranks=[])
        await nc.publish(subjects.node_heartbeat("n0"), gone.model_dump_json().encode())
        while solver.reports.ranks.get("n0"):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        assert await solver.schedule_once() == 1


async def test_a_solver_that_starts_asks_every_node_for_its_full_report(
    nc: Client, servers: Servers, cluster_name: str
) -> None:
    """Nodes repeat an unchanged report (their ranks) only every ONEPLUS_REPORT_EVERY_S, leases in between: a solver
    that starts knows no node's ranks, and asks all of them at once."""
    asked: list[NodeReportRequest] = []

    async def on_ask(m: Msg) -> None:
        asked.append(NodeReportRequest.model_validate_json(m.data))

    sub = await nc.subscribe(subjects.NODE_REPORT_REQUEST, cb=on_ask)
    async with solver_on_fresh_bus(nc, servers, cluster_name):
        await nc.flush()
        deadline = time.monotonic() + 5
        while not asked:
            assert time.monotonic() < deadline, "the solver asked no node for its report"
            await asyncio.sleep(0.05)
    assert [a.nodes for a in asked] == [None], "every node, once"
    await sub.unsubscribe()


async def test_a_store_rolled_back_to_an_older_epoch_is_wiped_and_rebuilt(
    nc: Client, servers: Servers, cluster_name: str
) -> None:
    """A stale snapshot or a replica promoted before it caught up: old reservations of jobs long gone."""
    async with solver_on_fresh_bus(nc, servers, cluster_name) as solver:
        await add_nodes(nc, solver, 1)
        await solver.owner.commit(JobAccepted(event_id="a-z", job_id="z", spec=spec(0, 2)))
        assert await solver.schedule_once() == 1
        token = solver.owner.index.get("z").token
        epoch = await solver.store.epoch()
        await solver.store.restore(
            "ghost-of-old",
            7,
            solver.owner.index.get("z").allocation.model_copy(
                update={
                    "ranks": [
                        r.model_copy(update={"gpus": [6, 7]}) for r in solver.owner.index.get("z").allocation.ranks
                    ]
                }
            ),
        )
        await solver.store.set_epoch(epoch - 1)
        await solver.reconcile()
        assert solver.store_resets == 1 and await solver.store.epoch() == epoch + 1
        assert {r.job_id: r.token for r in await solver.store.all()} == {"z": token}
