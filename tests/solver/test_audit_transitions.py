"""The reservation audit rides on the job transitions: a hold begins with the `placed` event and ends with the event
that ends the attempt, in the one stream the owner writes; the solver appends nothing of its own for either.

An owner killed between committing an attempt's end and freeing its reservation loses no audit entry (the release
is that committed event), so the next job on those GPUs never reads as a double use; a hold a store reset lost,
whose GPUs went to another job, still does."""

from __future__ import annotations

from nats.aio.client import Client
from oneplus_contracts import (
    Allocation,
    JobAccepted,
    JobFinished,
    JobPlaced,
    RankPlacement,
    ReservationAudit,
    subjects,
)
from oneplus_reservations import check_history
from oneplus_stores.audit import audit_history, read_audit, transition_audit
from oneplus_testing import Servers
from test_cycle_store_ops import add_nodes, solver_on_fresh_bus, spec


def node0(*gpus: int) -> Allocation:
    return Allocation(ranks=[RankPlacement(rank=0, node="n0", gpus=list(gpus))])


def stream(*events: object) -> list[tuple[bytes, float, dict[str, str]]]:
    return [(e.model_dump_json().encode(), float(i), {"Oneplus-Owner-Epoch": "3"}) for i, e in enumerate(events)]  # type: ignore[attr-defined]


def test_placed_reserves_and_the_attempts_end_releases() -> None:
    entries = transition_audit(
        stream(
            JobAccepted(event_id="a", job_id="a", spec=spec(0, 2)),
            JobPlaced(event_id="pa", job_id="a", allocation=node0(0, 1), token=7, attempt=1),
            JobAccepted(event_id="b", job_id="b", spec=spec(1, 2)),
            JobFinished(event_id="fa", job_id="a", state="SUCCEEDED", reason="done", token=7),
            JobPlaced(event_id="pb", job_id="b", allocation=node0(0, 1), token=8, attempt=1),
        )
    )
    assert [(e.op, e.job_id, e.token, e.reason, e.epoch) for e in entries] == [
        ("reserve", "a", 7, "placed", 3),
        ("release", "a", 7, "finished", 3),
        ("reserve", "b", 8, "placed", 3),
    ]
    assert check_history(audit_history(entries)) == []


def test_a_hold_never_ended_in_the_job_stream_reads_as_a_double_use() -> None:
    # A store reset lost a's reservation and the GPUs went to b while a's record still held them.
    entries = transition_audit(
        stream(
            JobAccepted(event_id="a", job_id="a", spec=spec(0, 2)),
            JobPlaced(event_id="pa", job_id="a", allocation=node0(0, 1), token=7, attempt=1),
            JobAccepted(event_id="b", job_id="b", spec=spec(1, 2)),
            JobPlaced(event_id="pb", job_id="b", allocation=node0(1), token=8, attempt=1),
        )
    )
    found = check_history(audit_history(entries))
    assert found == ["audit-2: {oneplus:default}:gpu:n0:1 taken by b|8 while held by a|7"]


def test_a_restore_after_the_release_does_not_bring_the_hold_back() -> None:
    held = transition_audit(
        stream(
            JobAccepted(event_id="a", job_id="a", spec=spec(0, 2)),
            JobPlaced(event_id="pa", job_id="a", allocation=node0(0), token=7, attempt=1),
            JobFinished(event_id="fa", job_id="a", state="SUCCEEDED", reason="done", token=7),
        )
    )
    late = ReservationAudit(op="restore", job_id="a", token=7, ranks=node0(0).ranks, ts=10.0)
    again = ReservationAudit(op="reserve", job_id="b", token=9, ranks=node0(0).ranks, ts=11.0)
    assert check_history(audit_history([*held, late, again])) == []


async def test_the_solver_appends_no_audit_entry_and_a_release_never_sent_reads_as_none(
    nc: Client, servers: Servers, cluster_name: str
) -> None:
    async with solver_on_fresh_bus(nc, servers, cluster_name) as solver:
        await add_nodes(nc, solver, 1)
        await solver.owner.commit(JobAccepted(event_id="a-first", job_id="first", spec=spec(0, 8)))
        assert await solver.schedule_once() == 1
        token = solver.owner.index.get("first").token  # type: ignore[union-attr]
        # The attempt's end committed; the owner dies before it frees the reservation (reconcile frees it).
        await solver.owner.commit(
            JobFinished(event_id="f-first", job_id="first", state="SUCCEEDED", reason="done", token=token)
        )
        await solver.reconcile()
        await solver.owner.commit(JobAccepted(event_id="a-second", job_id="second", spec=spec(1, 8)))
        assert await solver.schedule_once() == 1
        js = nc.jetstream()
        assert int((await js.stream_info(subjects.AUDIT_STREAM)).state.messages or 0) == 0, "no append of its own"
        entries = await read_audit(nc)
        assert [(e.op, e.job_id) for e in entries] == [
            ("reserve", "first"),
            ("release", "first"),
            ("reserve", "second"),
        ]
        assert check_history(audit_history(entries, cluster_name)) == []
        assert check_history(await solver.store.history()) == []
