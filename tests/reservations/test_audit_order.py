"""The reservation audit of several solver replicas, replayed in the store's order rather than JetStream's."""

from __future__ import annotations

from nats.aio.client import Client
from oneplus_bus.streams import ensure_streams
from oneplus_contracts import Allocation, RankPlacement, ReservationAudit
from oneplus_reservations import ReservationStore, Token, check_history, store_order
from oneplus_stores.audit import ReservationAuditLog, audit_history, read_audit, store_ordered


def alloc(*gpus: int) -> Allocation:
    return Allocation(ranks=[RankPlacement(rank=0, node="n0", gpus=list(gpus))])


async def test_store_operations_say_where_they_sit_in_the_store_order(store: ReservationStore) -> None:
    await store.set_epoch(3)
    first = await store.reserve("a", alloc(0))
    freed = await store.release("a")
    second = await store.reserve("b", alloc(0))
    assert isinstance(first, Token) and isinstance(freed, Token) and isinstance(second, Token)
    assert freed == first
    keys = [store_order(t.at) for t in (first, freed, second)]
    assert all(k is not None and k[0] == 3 for k in keys)
    assert keys == sorted(keys) and len(set(keys)) == 3  # type: ignore[type-var]
    assert await store.release("nobody") is None


async def test_a_release_that_reaches_jetstream_after_the_reserve_it_made_possible_is_no_double_use(
    nc: Client, store: ReservationStore
) -> None:
    """Replica A (the owner) frees job a's GPU; replica B, seeing a's end, reserves it for b. B's audit entry lands
    first: in JetStream's order GPU 0 is taken while held, in the store's it was free."""
    await store.set_epoch(1)
    js = nc.jetstream()
    await ensure_streams(js)
    replica_a, replica_b = ReservationAuditLog(js), ReservationAuditLog(js)
    held = await store.reserve("a", alloc(0, 1))
    assert isinstance(held, Token)
    await replica_a.record("reserve", "a", held, alloc(0, 1), at=held.at)
    await replica_a.flush()
    freed = await store.release("a", held)
    taken = await store.reserve("b", alloc(0))
    assert isinstance(freed, Token) and isinstance(taken, Token)
    await replica_b.record("reserve", "b", taken, alloc(0), at=taken.at)
    await replica_b.flush()
    await replica_a.record("release", "a", freed, at=freed.at)
    await replica_a.flush()

    entries = await read_audit(nc)
    assert [(e.op, e.job_id) for e in entries] == [("reserve", "a"), ("reserve", "b"), ("release", "a")]
    assert [(e.op, e.job_id) for e in store_ordered(entries)] == [("reserve", "a"), ("release", "a"), ("reserve", "b")]
    assert check_history(audit_history(entries)) == []
    # Without the store's order (an audit written before it was recorded) the same entries read as a double use.
    unordered = [e.model_copy(update={"store_at": ""}) for e in entries]
    assert len(check_history(audit_history(unordered))) == 1
    # And the store agrees with the replay.
    assert check_history(await store.history()) == []


def entry(op: str, job: str, token: int, gpus: list[int], at: str, ts: float) -> ReservationAudit:
    ranks = alloc(*gpus).ranks if gpus else []
    return ReservationAudit(op=op, job_id=job, token=token, ranks=ranks, store_at=at, ts=ts)  # type: ignore[arg-type]


def test_a_real_double_use_is_still_reported_in_store_order() -> None:
    entries = [
        entry("reserve", "a", 1, [0], "1:100-0", 1),
        entry("reserve", "b", 2, [0], "1:101-0", 2),  # the store never freed a's GPU
        entry("release", "a", 1, [], "1:102-0", 3),
    ]
    problems = check_history(audit_history(entries))
    assert len(problems) == 1 and "gpu:n0:0" in problems[0] and "b|2" in problems[0]


def test_entries_without_a_store_position_keep_their_place_and_epochs_come_in_order() -> None:
    entries = [
        entry("reserve", "a", 1, [0], "1:500-0", 1),
        entry("release", "a", 1, [], "", 2),  # the store did not confirm it: right after what it followed
        entry("reserve", "c", 2**32 + 1, [0], "2:100-0", 4),  # a reset store's clock may be behind: its epoch is not
        entry("restore", "b", 3, [1], "", 5),
        entry("reserve", "b", 3, [1], "1:600-0", 3),
    ]
    assert [(e.op, e.job_id) for e in store_ordered(entries)] == [
        ("reserve", "a"),
        ("release", "a"),
        ("reserve", "b"),
        ("reserve", "c"),
        ("restore", "b"),
    ]
    assert store_order("") is None and store_order("garbage") is None and store_order("1:2") is None
