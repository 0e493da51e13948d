"""Two intakes creating overlapping reservations at once (real NATS): both may pass their checks before either
writes, so each looks again after its write and the one the bucket stored first stands; the other is refused in the
overlap's one line and removed."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import pytest
from nats.aio.client import Client
from oneplus_bus.service import OpsError
from oneplus_bus.streams import ensure_kv
from oneplus_bus.tenancy import Caller
from oneplus_contracts import NodeRecord
from oneplus_intake.reservations import ReservationOps
from oneplus_testing import wipe_bus


async def no_nodes() -> list[NodeRecord]:
    return []  # the cluster's nodes are not what this test is about: any node name is taken


async def test_of_two_overlapping_creates_at_once_exactly_one_stands(nc: Client) -> None:
    await wipe_bus(nc)
    js = nc.jetstream()
    await ensure_kv(js)
    intakes = [ReservationOps(SimpleNamespace(js=js), no_nodes) for _ in range(2)]  # type: ignore[arg-type]
    operator = Caller(team=None)
    start = time.time() + 3600
    for round_ in range(6):
        bodies: list[dict[str, Any]] = [
            {"name": f"r{round_}-{i}", "nodes": [f"n{round_}"], "start_ts": start, "end_ts": start + 600,
             "teams": ["ops"]}
            for i in range(2)
        ]  # fmt: skip
        got = await asyncio.gather(*(ops.create(b, operator) for ops, b in zip(intakes, bodies, strict=True)),
                                   return_exceptions=True)  # fmt: skip
        made = [g for g in got if isinstance(g, dict)]
        refused = [g for g in got if isinstance(g, OpsError)]
        assert len(made) == 1 and len(refused) == 1, got
        assert refused[0].code == 409 and str(refused[0]).startswith(f"reservation r{round_}-")
        assert f"overlaps reservation {made[0]['name']} on n{round_} (" in str(refused[0])
        assert [r.name for r in await intakes[0].stored() if r.nodes == [f"n{round_}"]] == [made[0]["name"]]
    with pytest.raises(OpsError, match=r"^creating a reservation is an operator's: team 'nlp' may not$"):
        await intakes[0].create(bodies[0], Caller(team="nlp"))
    await wipe_bus(nc)
