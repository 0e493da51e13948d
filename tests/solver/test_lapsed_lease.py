"""A reservation whose lease ran out while its job record still holds the GPUs (the node's reports not folded yet,
the owner restarting): the GPUs are not given to another job until the record ends.

Seen in the multi-host chaos run: a gang's ranks exited and its node stopped renewing the lease; the owner folded
the node's report only after the lease had lapsed. Reconcile had already dropped the gang from the capacity model
(it held exactly what Redis held), the next cycle placed two gangs on its GPUs, and the job stream and the
reservation audit both showed one GPU held by two jobs.
"""

from __future__ import annotations

import asyncio
import functools
import time

import pytest
from nats.aio.client import Client
from nats.errors import TimeoutError as NatsTimeout
from oneplus_bus.ledger import read_stream
from oneplus_contracts import JobAccepted, JobNodeFinished, JobPlaced, parse_job_event, subjects
from oneplus_placement_solver.app import Solver
from oneplus_placement_solver.owner import FACTS_ACK_WAIT_S, FACTS_CONSUMER
from oneplus_reservations import check_history
from oneplus_stores.audit import audit_history, read_audit
from oneplus_testing import Servers
from test_cycle_store_ops import add_nodes, solver_on_fresh_bus, spec


async def place_with_a_short_lease(nc: Client, solver: Solver, monkeypatch: pytest.MonkeyPatch) -> None:
    """One node, a grace of half a second, and gang j0 placed there on a lease of a few tenths of a second that no
    node renews."""
    monkeypatch.setattr(solver, "settings", solver.settings.model_copy(update={"lost_reservation_grace_s": 0.5}))
    await add_nodes(nc, solver, 1)
    monkeypatch.setattr(solver.store, "reserve_many", functools.partial(solver.store.reserve_many, lease_s=0.3))
    await solver.owner.commit(JobAccepted(event_id="acc-0", job_id="j0", spec=spec(0, gpus=8)))
    assert await solver.schedule_once() == 1


async def test_gpus_of_a_lapsed_lease_wait_for_the_record_to_end(
    nc: Client, servers: Servers, cluster_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with solver_on_fresh_bus(nc, servers, cluster_name) as solver:
        await place_with_a_short_lease(nc, solver, monkeypatch)
        await asyncio.sleep(0.4)
        assert await solver.store.all() == [], "the lease ran out"

        await solver.owner.commit(JobAccepted(event_id="acc-1", job_id="j1", spec=spec(1, gpus=8)))
        await solver.reconcile()  # within the grace: j0's record still holds the node
        assert solver.owner.index.get("j0").state == "PLACED"  # type: ignore[union-attr]
        assert await solver.schedule_once() == 0, "j1 placed on GPUs the job stream says j0 holds"

        await asyncio.sleep(0.6)
        await solver.reconcile()  # past the grace: j0 is requeued, its GPUs free
        assert solver.owner.index.get("j0").state == "ACCEPTED"  # type: ignore[union-attr]
        assert await solver.schedule_once() == 1
        await solver.audit.flush()
        entries = await read_audit(nc)
        assert [e.op for e in entries] == ["reserve", "release", "reserve"], "the lapsed hold ends in the audit"
        assert check_history(audit_history(entries, cluster_name)) == []


async def test_a_lapsed_lease_waits_for_the_facts_a_dead_owner_fetched(
    nc: Client, servers: Servers, cluster_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seen in a clean-clone CI run of the solver-crash test: the owner was killed holding a node's `node_finished`
    fetched and not acknowledged. JetStream gives such a fact back 30 s later; the gang's lease, no longer renewed
    by its node, lapsed first, and the restarted owner's reconcile requeued a gang that had ended, as an
    infrastructure fault. A restarted owner now judges no lease lost until those facts can have come back."""
    async with solver_on_fresh_bus(nc, servers, cluster_name) as solver:
        await place_with_a_short_lease(nc, solver, monkeypatch)
        token = solver.owner.index.get("j0").token  # type: ignore[union-attr]
        assert token is not None
        # The owner that dies: it fetched the node's report and never acknowledged it.
        assert await solver.owner.drain_facts() == 0  # the facts consumer exists, nothing waiting
        done = JobNodeFinished(event_id="nf-j0", job_id="j0", node="n0", token=token, exit_code=0, reason="exit 0")
        await solver.svc.ledger.report(done)
        js = nc.jetstream()
        dead = await js.pull_subscribe_bind(FACTS_CONSUMER, subjects.FACTS_STREAM)
        fetched = await dead.fetch(1, timeout=5)
        assert [m.subject for m in fetched] == [subjects.job_fact("j0", "node_finished")]

        await solver.owner.bootstrap()  # the restarted owner
        assert solver.owner.facts_back_at > time.time() + FACTS_ACK_WAIT_S - 5
        await asyncio.sleep(0.6)
        assert await solver.store.all() == [], "the lease ran out"
        await solver.reconcile()  # past the grace, but the dead owner's fact is still on its way back
        assert solver.owner.index.get("j0").state == "PLACED"  # type: ignore[union-attr]

        await fetched[0].nak()  # as JetStream does FACTS_ACK_WAIT_S after the fetch: the fact is delivered again
        solver.owner.facts_back_at = time.time()
        assert await solver.owner.drain_facts() == 1
        assert solver.owner.index.get("j0").state == "SUCCEEDED"  # type: ignore[union-attr]
        await dead.unsubscribe()


async def test_an_owner_waits_only_when_facts_may_be_out(
    nc: Client, servers: Servers, cluster_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fresh facts consumer (or none yet) holds nothing back; one that does not answer is taken to hold some."""
    async with solver_on_fresh_bus(nc, servers, cluster_name) as solver:
        await solver.owner.bootstrap()
        assert solver.owner.facts_caught_up(time.time())

        async def unanswered(*args: object, **kwargs: object) -> None:
            raise NatsTimeout

        monkeypatch.setattr(solver.owner.js, "consumer_info", unanswered)
        await solver.owner.bootstrap()
        assert not solver.owner.facts_caught_up(time.time())
        assert solver.owner.facts_caught_up(time.time() + FACTS_ACK_WAIT_S)


async def test_the_owner_refuses_a_placement_on_gpus_a_live_record_holds_and_reconcile_frees_it(
    nc: Client, servers: Servers, cluster_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seen in the fenced chaos run across a leader hand-over: the store forgot a lapsed hold, and a replica whose
    capacity model did not keep it (a follower, a deposed leader resumed) reserved its GPUs for another gang and
    reported it placed; the job stream then showed a GPU held by two jobs. The owner checks its own records now."""
    async with solver_on_fresh_bus(nc, servers, cluster_name) as solver:
        await place_with_a_short_lease(nc, solver, monkeypatch)
        j0 = solver.owner.index.get("j0")
        assert j0 is not None and j0.allocation is not None
        await asyncio.sleep(0.4)
        assert await solver.store.all() == [], "the lease ran out"
        await solver.owner.commit(JobAccepted(event_id="acc-1", job_id="j1", spec=spec(1, gpus=8)))
        # Another replica with a stale view takes the same GPUs in the store (which no longer holds j0's).
        [token] = await solver.store.reserve_many([("j1", j0.allocation)])
        assert isinstance(token, int)
        placed = JobPlaced(event_id=f"placed-j1-{token}", job_id="j1", allocation=j0.allocation, token=token, attempt=1)
        assert await solver.owner.commit(placed) == [None], "refused: j0's record holds those GPUs"
        assert solver.owner.index.get("j1").state == "ACCEPTED"  # type: ignore[union-attr]
        events = [parse_job_event(data) for _, data, _ in await read_stream(nc.jetstream(), subjects.JOBS_STREAM, 1)]
        assert [(e.job_id, e.type) for e in events if e.type == "placed"] == [("j0", "placed")]

        await solver.reconcile()  # within the grace: j0 still holds; j1's reservation is freed, not recorded
        assert [r.job_id for r in await solver.store.all()] == []
        assert solver.owner.index.get("j1").state == "ACCEPTED"  # type: ignore[union-attr]
        assert solver.owner.index.get("j0").state == "PLACED"  # type: ignore[union-attr]
