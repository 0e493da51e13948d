"""Turning the engine's log stream into lines, and interleaving the lines of several ranks as they arrive."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator


async def split_lines(chunks: AsyncIterator[str], prefix: str = "") -> AsyncIterator[str]:
    """Frames from the engine are not lines: a line may span frames and a frame may hold many lines."""
    pending = ""
    async for chunk in chunks:
        pending += chunk
        *complete, pending = pending.split("\n")
        for line in complete:
            yield prefix + line.rstrip("\r")
    if pending:
        yield prefix + pending


async def merge_lines(sources: list[AsyncIterator[str]]) -> AsyncIterator[str]:
    """Yield from every source as lines come; ends when all sources end; an error in one source is re-raised."""
    queue: asyncio.Queue[tuple[int, str | None, BaseException | None]] = asyncio.Queue()

    async def pump(i: int, source: AsyncIterator[str]) -> None:
        try:
            async for line in source:
                await queue.put((i, line, None))
        except Exception as e:  # handed to the consumer, which re-raises it
            await queue.put((i, None, e))
            return
        await queue.put((i, None, None))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(sources)]
    open_sources = len(tasks)
    try:
        while open_sources:
            _, line, error = await queue.get()
            if error is not None:
                raise error
            if line is None:
                open_sources -= 1
                continue
            yield line
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
