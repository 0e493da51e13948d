"""A solver killed between a release and its audit entry's delivery: the next owner writes it from the store's history.

Without it the JetStream audit would still hold the freed GPUs, and the next job placed on them would read as a
double use that never happened (the multi-host lab's solver kill showed exactly that)."""

from __future__ import annotations

from nats.aio.client import Client
from oneplus_bus.audit import audit_history, read_audit
from oneplus_contracts import JobAccepted
from oneplus_reservations import check_history
from oneplus_testing import Servers
from test_cycle_store_ops import add_nodes, solver_on_fresh_bus, spec


async def test_a_release_lost_on_its_way_to_the_audit_is_caught_up_by_the_next_owner(
    nc: Client, servers: Servers, cluster_name: str
) -> None:
    async with solver_on_fresh_bus(nc, servers, cluster_name) as solver:
        await add_nodes(nc, solver, 1)
        await solver.owner.commit(JobAccepted(event_id="a-first", job_id="first", spec=spec(0, 8)))
        assert await solver.schedule_once() == 1
        token = solver.owner.index.get("first").token
        assert token is not None

        # The store frees the node; the solver dies before the release's audit entry leaves it.
        assert await solver.store.release("first", token) == token
        solver.capacity.release("first")
        await solver.owner.commit(JobAccepted(event_id="a-second", job_id="second", spec=spec(1, 8)))
        assert await solver.schedule_once() == 1
        await solver.audit.flush()
        before = check_history(audit_history(await read_audit(nc), cluster_name))
        assert len(before) == 8 and all("taken by second|" in p for p in before), before

        # What a new owner does when it takes the lead (and a restarted lone solver on start).
        await solver.catch_up_audit()
        entries = await read_audit(nc)
        assert [(e.op, e.job_id) for e in entries] == [
            ("reserve", "first"),
            ("reserve", "second"),
            ("release", "first"),
        ]
        assert entries[-1].reason == "caught up from the store's history" and entries[-1].store_at
        assert check_history(audit_history(entries, cluster_name)) == []
        assert check_history(await solver.store.history()) == []

        # Again (a second takeover): JetStream drops the repeated entry by its message id.
        await solver.catch_up_audit()
        assert len(await read_audit(nc)) == 3
