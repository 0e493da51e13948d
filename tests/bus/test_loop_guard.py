"""A service's background loops are restarted after an error, but never once they were cancelled.

Seen in the fenced chaos run: a deposed job owner's fact loop was cancelled while a fetch timed out (Python 3.11's
`wait_for` can swallow the cancel); its next commit was refused and the guard restarted it every second, so it went
on taking the facts its successor waited for."""

from __future__ import annotations

import asyncio

from oneplus_bus.service import OneplusService


def guard_only() -> OneplusService:
    svc = object.__new__(OneplusService)  # `_guard` reads only the name: no broker or tracer needed
    svc.name = "test"
    return svc


async def test_a_loop_that_fails_is_restarted() -> None:
    runs: list[int] = []

    async def flaky() -> None:
        runs.append(1)
        if len(runs) < 2:
            raise RuntimeError("transient")

    await asyncio.wait_for(guard_only()._guard(flaky), timeout=5)
    assert len(runs) == 2


async def test_a_loop_that_fails_after_a_swallowed_cancel_stops() -> None:
    runs: list[int] = []
    inside = asyncio.Event()

    async def swallows_the_cancel() -> None:
        runs.append(1)
        try:
            inside.set()
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            pass  # what a timeout racing the cancel does
        raise RuntimeError("not the owner any more")

    task = asyncio.create_task(guard_only()._guard(swallows_the_cancel))
    await inside.wait()
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=5)
    assert done == {task} and task.cancelled()
    assert runs == [1], "not restarted"
