"""The gang commit: all GPUs of every rank or none, fenced by a token, audited by the history stream."""

from __future__ import annotations

import asyncio

from oneplus_contracts import Allocation, RankPlacement
from oneplus_reservations import Conflict, ReservationStore, check_history


def alloc(*ranks: tuple[str, list[int]], milli: int = 0) -> Allocation:
    return Allocation(ranks=[RankPlacement(rank=i, node=n, gpus=g, gpu_milli=milli) for i, (n, g) in enumerate(ranks)])


async def test_reserve_takes_every_gpu_and_returns_increasing_tokens(store: ReservationStore) -> None:
    t1 = await store.reserve("j1", alloc(("n0", [0, 1]), ("n1", [0, 1])))
    t2 = await store.reserve("j2", alloc(("n0", [2, 3])))
    assert isinstance(t1, int) and isinstance(t2, int) and t2 > t1
    held = await store.held_slots()
    assert held == {
        store.ks.gpu("n0", 0): f"j1|{t1}",
        store.ks.gpu("n0", 1): f"j1|{t1}",
        store.ks.gpu("n1", 0): f"j1|{t1}",
        store.ks.gpu("n1", 1): f"j1|{t1}",
        store.ks.gpu("n0", 2): f"j2|{t2}",
        store.ks.gpu("n0", 3): f"j2|{t2}",
    }


async def test_a_gang_overlapping_one_held_gpu_takes_nothing(store: ReservationStore) -> None:
    await store.reserve("j1", alloc(("n0", [3])))
    res = await store.reserve("j2", alloc(("n0", [0, 1, 2]), ("n0", [3, 4])))
    assert isinstance(res, Conflict)
    assert res.key == store.ks.gpu("n0", 3) and res.holder is not None and res.holder.startswith("j1|")
    held = await store.held_slots()
    assert set(held) == {store.ks.gpu("n0", 3)}, "no partial gang may be visible"
    assert await store.get("j2") is None


async def test_a_job_cannot_hold_two_reservations(store: ReservationStore) -> None:
    assert isinstance(await store.reserve("j1", alloc(("n0", [0]))), int)
    res = await store.reserve("j1", alloc(("n0", [1])))
    assert isinstance(res, Conflict) and "already holds" in res.reason


async def test_release_with_a_stale_token_frees_nothing(store: ReservationStore) -> None:
    tok = await store.reserve("j1", alloc(("n0", [0, 1])))
    assert isinstance(tok, int)
    assert not await store.release("j1", tok + 100)
    assert len(await store.held_slots()) == 2
    assert await store.release("j1", tok)
    assert await store.held_slots() == {}
    assert await store.all() == []


async def test_shares_pack_up_to_one_gpu_and_never_mix_with_whole_use(store: ReservationStore) -> None:
    for i in range(4):
        assert isinstance(await store.reserve(f"s{i}", alloc(("n0", [0]), milli=250)), int)
    full = await store.reserve("s4", alloc(("n0", [0]), milli=250))
    assert isinstance(full, Conflict) and "share full" in full.reason
    whole = await store.reserve("w", alloc(("n0", [0])))
    assert isinstance(whole, Conflict) and whole.reason == "gpu shared"
    await store.reserve("w2", alloc(("n0", [1])))
    share_on_whole = await store.reserve("s5", alloc(("n0", [1]), milli=100))
    assert isinstance(share_on_whole, Conflict) and share_on_whole.reason == "gpu held"
    assert await store.release("s0")
    assert isinstance(await store.reserve("s4", alloc(("n0", [0]), milli=250)), int)


async def test_an_expired_lease_frees_the_gpus_and_renew_keeps_them(store: ReservationStore) -> None:
    t1 = await store.reserve("j1", alloc(("n0", [0])), lease_s=0.3)
    t2 = await store.reserve("j2", alloc(("n0", [1])), lease_s=0.3)
    assert isinstance(t1, int) and isinstance(t2, int)
    for _ in range(3):
        await asyncio.sleep(0.15)
        assert await store.renew("j2", t2, lease_s=0.3)
    assert await store.get("j1") is None, "j1's lease ran out"
    assert await store.get("j2") is not None
    assert not await store.renew("j2", t2 + 1), "a stale token cannot renew"
    assert isinstance(await store.reserve("j3", alloc(("n0", [0]))), int)


async def test_history_replay_finds_no_double_hold(store: ReservationStore) -> None:
    for i in range(5):
        tok = await store.reserve(f"j{i}", alloc(("n0", [0, 1])))
        assert isinstance(tok, int)
        assert await store.release(f"j{i}", tok)
    hist = await store.history()
    assert [e.op for e in hist] == ["reserve", "release"] * 5
    assert check_history(hist) == []


def test_history_check_detects_a_double_hold() -> None:
    from oneplus_reservations import HistoryEntry

    entries = [
        HistoryEntry("reserve", "a", 1, (("k0", 0),), "1-0"),
        HistoryEntry("reserve", "b", 2, (("k0", 0),), "2-0"),
    ]
    problems = check_history(entries)
    assert len(problems) == 1 and "k0" in problems[0]
