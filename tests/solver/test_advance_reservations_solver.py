"""Advance reservations through a real solver (NATS, Redis): it follows the `advance_reservations` bucket; a
--reservation job waits for its window with the reason in `queue` and `jobs explain`, and runs on its nodes once it
starts; another job stays off a future window's nodes unless its time limit ends it by the start."""

from __future__ import annotations

import asyncio
import time

from nats.aio.client import Client
from oneplus_contracts import JobAccepted, JobSpec, subjects
from oneplus_contracts.advance import AdvanceReservation
from oneplus_placement_solver.app import Solver
from oneplus_testing import Servers
from test_cycle_store_ops import add_nodes, solver_on_fresh_bus


def spec(name: str, *, reservation: str | None = None, limit_s: int | None = None) -> JobSpec:
    return JobSpec.model_validate(
        {"name": name, "team": "ops", "resources": {"gpus": 8}, "reservation": reservation, "time_limit_s": limit_s}
    )


async def store(nc: Client, solver: Solver, res: AdvanceReservation) -> None:
    kv = await nc.jetstream().key_value(subjects.ADVANCE_RESERVATIONS_KV)
    await kv.put(res.name, res.model_dump_json().encode())
    deadline = time.monotonic() + 10
    while solver.advance.by_name.get(res.name) != res:  # the solver's watch delivers it
        assert time.monotonic() < deadline, "the solver never saw the reservation"
        await asyncio.sleep(0.02)


async def test_a_reservation_job_waits_for_its_window_and_others_keep_off(
    nc: Client, servers: Servers, cluster_name: str
) -> None:
    async with solver_on_fresh_bus(nc, servers, f"{cluster_name}adv") as solver:
        await add_nodes(nc, solver, 2)  # n0, n1: 8 GPUs each
        now = time.time()
        await store(nc, solver, AdvanceReservation(name="r1", nodes=["n1"], start_ts=now + 7200,
                                                    end_ts=now + 10800, teams=["ops"], maint=True))  # fmt: skip
        for job_id, s in (("mine", spec("mine", reservation="r1")), ("long", spec("long", limit_s=3 * 3600))):
            await solver.svc.ledger.report(JobAccepted(event_id=f"acc-{job_id}", job_id=job_id, spec=s))
        await solver.owner.drain_facts()
        assert await solver.schedule_once() == 1
        assert solver.decision is not None
        assert solver.decision.placements["long"].nodes == ["n0"]  # off n1: it would still run at r1's start
        why = solver.decision.reasons["mine"]
        assert why.code == "Reservation" and why.message.startswith("waiting for reservation r1 to start at ")
        rows = (await solver.queue_list({}, {}))["rows"]
        assert next(r for r in rows if r["job_id"] == "mine")["reason"] == "Reservation"
        explained = await solver.explain({"job_id": "mine"}, {})
        assert explained["reason"] == "Reservation" and "waiting for reservation r1 to start" in explained["message"]
        # Another long job: n0 is taken and n1 is kept for the window, so it waits, saying which nodes it may not use.
        await solver.svc.ledger.report(JobAccepted(event_id="acc-l2", job_id="l2", spec=spec("l2", limit_s=3 * 3600)))
        await solver.owner.drain_facts()
        assert await solver.schedule_once() == 0
        assert "off nodes n1" in solver.decision.reasons["l2"].message
        # The window starts now (stored again): its job runs on its node.
        await store(nc, solver, AdvanceReservation(name="r1", nodes=["n1"], start_ts=time.time() - 1,
                                                    end_ts=now + 10800, teams=["ops"], maint=True))  # fmt: skip
        assert await solver.schedule_once() == 1
        assert solver.decision.placements["mine"].nodes == ["n1"]
