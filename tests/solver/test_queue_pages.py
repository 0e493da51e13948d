"""`oneplus.ops.queue.list` pages (limit + cursor), from the solver's working set; bad paging input is refused."""

from __future__ import annotations

import pytest
from nats.aio.client import Client
from oneplus_bus.service import OpsError
from oneplus_contracts import JobAccepted
from oneplus_testing import Servers
from test_cycle_store_ops import solver_on_fresh_bus, spec


async def test_queue_rows_come_in_pages_and_bad_paging_is_refused(
    nc: Client, servers: Servers, cluster_name: str
) -> None:
    async with solver_on_fresh_bus(nc, servers, cluster_name) as solver:
        await solver.owner.commit(
            *[JobAccepted(event_id=f"acc-{i}", job_id=f"q-{i:02d}", spec=spec(i)) for i in range(25)]
        )
        seen: list[str] = []
        cursor: str | None = None
        pages = 0
        while True:
            page = await solver.queue_list({"limit": 10} | ({"cursor": cursor} if cursor else {}), {})
            assert len(page["rows"]) <= 10
            seen += [r["job_id"] for r in page["rows"]]
            pages += 1
            cursor = page["next"]
            if cursor is None:
                break
        assert pages == 3 and sorted(seen) == [f"q-{i:02d}" for i in range(25)]
        for bad, says in (
            ({"limit": 0}, "'limit' must be between"),
            ({"limit": "ten"}, "whole numbers"),
            ({"cursor": "-3"}, "'cursor' must not be negative"),
            ({"limit": 100_000}, "between 1 and"),
        ):
            with pytest.raises(OpsError, match=says):
                await solver.queue_list(bad, {})
