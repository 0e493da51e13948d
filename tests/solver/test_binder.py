"""The binder works outside the cycle lock: a cycle assumes its placements, the binder reserves, records and launches
them while the next cycle decides; a gang the store refuses is forgotten; reconcile leaves a gang being bound alone;
an attempt whose end is recorded and not yet released is seen by the cycle as still holding its GPUs.

The solver runs in this process against real NATS and Redis with its loops off; a gate held on one round trip
(the store's reserve, the record of `placed`, the store's release) stops a binding or a settle half-way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from nats.aio.client import Client
from oneplus_contracts import JobAccepted, JobNodeFinished
from oneplus_placement_solver.binder import ASSUMED
from oneplus_reservations import Conflict
from oneplus_testing import Servers
from pytest import MonkeyPatch
from test_cycle_store_ops import add_nodes, solver_on_fresh_bus, spec


def gated(real: Callable[..., Awaitable[Any]], gate: asyncio.Event, reached: asyncio.Event) -> Callable[..., Any]:
    """`real`, held at `gate` (`reached` is set once a call waits there)."""

    async def call(*args: Any, **kwargs: Any) -> Any:
        reached.set()
        await gate.wait()
        return await real(*args, **kwargs)

    return call


async def test_the_next_cycle_decides_while_the_last_ones_reservations_are_out(
    nc: Client, servers: Servers, cluster_name: str, monkeypatch: MonkeyPatch
) -> None:
    async with solver_on_fresh_bus(nc, servers, cluster_name) as solver:
        await add_nodes(nc, solver, 1)  # 8 GPUs
        await solver.owner.commit(JobAccepted(event_id="acc-a", job_id="a", spec=spec(0, 4)))
        gate, reached = asyncio.Event(), asyncio.Event()
        monkeypatch.setattr(solver.store, "reserve_many", gated(solver.store.reserve_many, gate, reached))

        first = await solver.scheduler.cycle()
        assert first is not None and [r.job_id for r, _ in first.gangs] == ["a"]
        binding = asyncio.create_task(solver.binder.bind(first))
        await asyncio.wait_for(reached.wait(), 5)
        assert not solver.transition.locked(), "the cycle lock is free while the store's round trip is out"
        assert solver.capacity.token_of("a") == ASSUMED, "a's GPUs are held as assumed"

        await solver.owner.commit(
            JobAccepted(event_id="acc-big", job_id="big", spec=spec(1, 8)),
            JobAccepted(event_id="acc-c", job_id="c", spec=spec(2, 4)),
        )
        second = await asyncio.wait_for(solver.scheduler.cycle(), 5)
        assert second is not None
        assert [r.job_id for r, _ in second.gangs] == ["c"], "a is not decided twice; big does not fit beside it"
        assert solver.decision is not None and "big" in solver.decision.reasons

        gate.set()
        assert await binding == 1
        assert await solver.binder.bind(second) == 1
        a, c = solver.owner.index.get("a"), solver.owner.index.get("c")
        assert a is not None and a.state == "PLACED" and c is not None and c.state == "PLACED"
        held = {r.job_id: {(p.node, g) for p in r.allocation.ranks for g in p.gpus} for r in await solver.store.all()}
        assert held.keys() == {"a", "c"} and not held["a"] & held["c"]
        assert solver.capacity.token_of("a") == a.token and solver.binder.binding == {}


async def test_a_gang_the_store_refuses_is_forgotten_and_pending_again(
    nc: Client, servers: Servers, cluster_name: str, monkeypatch: MonkeyPatch
) -> None:
    async with solver_on_fresh_bus(nc, servers, cluster_name) as solver:
        await add_nodes(nc, solver, 1)
        await solver.owner.commit(JobAccepted(event_id="acc-a", job_id="a", spec=spec(0, 8)))

        async def taken(gangs: list[Any], **_: Any) -> list[Conflict]:
            return [Conflict("gpu taken by another replica", holder="x") for _ in gangs]

        monkeypatch.setattr(solver.store, "reserve_many", taken)
        assert await solver.schedule_once() == 0
        assert "a" not in solver.capacity.held and solver.binder.binding == {}, "its assumed GPUs are offered again"
        rec = solver.owner.index.get("a")
        assert rec is not None and rec.state == "ACCEPTED" and "a" in solver.owner.index.pending
        assert solver.capacity.state().total_free_gpus() == 8
        monkeypatch.undo()
        assert await solver.schedule_once() == 1, "the next cycle places it"


async def test_reconcile_leaves_a_gang_being_bound_alone(
    nc: Client, servers: Servers, cluster_name: str, monkeypatch: MonkeyPatch
) -> None:
    async with solver_on_fresh_bus(nc, servers, cluster_name) as solver:
        await add_nodes(nc, solver, 1)
        await solver.owner.commit(JobAccepted(event_id="acc-a", job_id="a", spec=spec(0, 4)))
        gate, reached = asyncio.Event(), asyncio.Event()
        monkeypatch.setattr(solver.binder, "commit_placed", gated(solver.binder.commit_placed, gate, reached))
        assumed = await solver.scheduler.cycle()
        assert assumed is not None
        binding = asyncio.create_task(solver.binder.bind(assumed))
        await asyncio.wait_for(reached.wait(), 5)  # reserved in Redis, not recorded yet
        (res,) = await solver.store.all()

        await solver.reconcile()
        rec = solver.owner.index.get("a")
        assert rec is not None and rec.state == "ACCEPTED", "reconcile did not record the binder's placement"
        assert solver.capacity.token_of("a") == res.token, "nor drop its hold from the capacity model"

        gate.set()
        assert await binding == 1
        rec = solver.owner.index.get("a")
        assert rec is not None and rec.state == "PLACED" and rec.token == res.token
        assert [(r.job_id, r.token) for r in await solver.store.all()] == [("a", res.token)]


async def test_an_ended_attempt_holds_its_gpus_for_the_cycle_until_they_are_released(
    nc: Client, servers: Servers, cluster_name: str, monkeypatch: MonkeyPatch
) -> None:
    async with solver_on_fresh_bus(nc, servers, cluster_name) as solver:
        await add_nodes(nc, solver, 1)
        await solver.owner.commit(JobAccepted(event_id="acc-run", job_id="run", spec=spec(0, 8)))
        assert await solver.schedule_once() == 1
        run = solver.owner.index.get("run")
        assert run is not None and run.token is not None
        await solver.owner.commit(JobAccepted(event_id="acc-next", job_id="next", spec=spec(1, 8)))
        gate, reached = asyncio.Event(), asyncio.Event()
        monkeypatch.setattr(solver.store, "release_many", gated(solver.store.release_many, gate, reached))
        ended = asyncio.create_task(
            solver.owner.commit(
                JobNodeFinished(event_id="f-run", job_id="run", node="n0", token=run.token, exit_code=0, reason="0")
            )
        )
        await asyncio.wait_for(reached.wait(), 5)  # recorded SUCCEEDED, the release still out
        assert solver.owner.index.get("run").state == "SUCCEEDED"  # type: ignore[union-attr]
        leaving = [r for r in solver.ctx.work.running(solver.owner.index.holders.values()) if r.job_id == "run"]
        assert len(leaving) == 1 and leaving[0].preempting, "the cycle sees the attempt vacating its GPUs"
        assert await asyncio.wait_for(solver.schedule_once(), 5) == 0, "its GPUs are offered only once Redis frees them"

        gate.set()
        await ended
        assert solver.ctx.work.leaving == {}
        assert await solver.schedule_once() == 1
