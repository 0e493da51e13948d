"""A cancel ends its pending job even when the reaction to it is lost.

CI's chaos run caught a cancelled job left ACCEPTED ("cancelled by root") for ever around a Redis reset: one failed
reaction in a batch skipped the reactions after it, and nothing came back for a cancel whose reaction was lost.
"""

from __future__ import annotations

from nats.aio.client import Client
from oneplus_contracts import JobAccepted, JobCancelRequested, JobNodeFinished
from oneplus_testing import Servers
from pytest import MonkeyPatch
from redis.exceptions import ConnectionError as RedisConnectionError
from test_cycle_store_ops import add_nodes, solver_on_fresh_bus, spec


async def test_a_failed_reaction_does_not_skip_the_cancel_after_it_in_the_batch(
    nc: Client, servers: Servers, cluster_name: str, monkeypatch: MonkeyPatch
) -> None:
    async with solver_on_fresh_bus(nc, servers, cluster_name) as solver:
        await add_nodes(nc, solver, 1)
        await solver.owner.commit(JobAccepted(event_id="a-run", job_id="run", spec=spec(0, 8)))
        assert await solver.schedule_once() == 1
        await solver.owner.commit(JobAccepted(event_id="a-wait", job_id="wait", spec=spec(1, 8)))
        placed = solver.owner.index.get("run")

        async def store_down(_rec: object) -> None:
            raise RedisConnectionError("Error 111 connecting to 127.0.0.1:6379. Connect call failed")

        monkeypatch.setattr(solver.controller, "settle_many", store_down)
        # One batch, as the owner drains facts: the rank's end first (its settle fails), then the cancel.
        await solver.owner.commit(
            JobNodeFinished(
                event_id="f-run", job_id="run", node="n0", token=placed.token, exit_code=0, reason="exited 0"
            ),
            JobCancelRequested(job_id="wait", reason="cancelled by root", by="root"),
        )
        assert solver.owner.index.get("wait").state == "CANCELLED"
        assert solver.owner.index.get("run").state == "PLACED", "its settle failed"
        monkeypatch.undo()
        await solver.reconcile()
        assert solver.owner.index.get("run").state == "SUCCEEDED", "reconcile settled it"
        assert await solver.store.all() == []


async def test_reconcile_ends_a_cancelled_pending_job_whose_reaction_never_ran(
    nc: Client, servers: Servers, cluster_name: str, monkeypatch: MonkeyPatch
) -> None:
    async with solver_on_fresh_bus(nc, servers, cluster_name) as solver:
        await add_nodes(nc, solver, 1)
        await solver.owner.commit(JobAccepted(event_id="a-x", job_id="x", spec=spec(0, 16)))  # never fits one node

        async def crashed(_rec: object) -> None:
            raise RuntimeError("the solver died before its reaction ran")

        monkeypatch.setattr(solver.controller, "cancel_all", crashed)  # the reaction to cancels
        await solver.owner.commit(JobCancelRequested(job_id="x", reason="cancelled by alice", by="alice"))
        rec = solver.owner.index.get("x")
        assert rec.state == "ACCEPTED" and rec.cancel_requested
        monkeypatch.undo()
        await solver.reconcile()
        assert solver.owner.index.get("x").state == "CANCELLED"
        assert "x" not in solver.owner.index.pending
