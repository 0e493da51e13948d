"""`oneplus audit`: the reservation audit in JetStream, replayed for double use, whatever happened to Redis."""

from __future__ import annotations

import asyncio
import json

from nats.aio.client import Client
from oneplus_bus.streams import ensure_streams
from oneplus_contracts import Allocation, RankPlacement
from oneplus_stores.audit import ReservationAuditLog, read_audit
from oneplus_testing import Servers
from typer.testing import CliRunner

from oneplus.cli.app import app


def alloc(*gpus: int) -> Allocation:
    return Allocation(ranks=[RankPlacement(rank=0, node="n0", gpus=list(gpus))])


async def write(nc: Client, *entries: tuple[str, str, int, Allocation | None]) -> None:
    js = nc.jetstream()
    await ensure_streams(js)
    log = ReservationAuditLog(js)
    for op, job, token, a in entries:
        await log.record(op, job, token, a)  # type: ignore[arg-type]
    await log.flush()


def audit(servers: Servers) -> tuple[int, dict[str, object]]:
    res = CliRunner().invoke(app, ["audit", "--nats", servers.nats_url, "--json"])
    return res.exit_code, json.loads(res.stdout)


async def test_a_clean_audit_across_a_store_reset_passes(nc: Client, servers: Servers) -> None:
    await write(
        nc,
        ("reserve", "a", 5, alloc(0, 1)),
        ("restore", "a", 5, alloc(0, 1)),  # put back after a reset: the same holder, no double use
        ("release", "a", 5, None),
        ("reserve", "b", 2**32 + 1, alloc(0)),
    )
    assert len(await read_audit(nc)) == 4
    code, out = await asyncio.to_thread(audit, servers)
    assert code == 0 and out["entries"] == 4 and out["double_use"] == []
    assert out["ops"] == {"reserve": 2, "restore": 1, "release": 1}


async def test_a_gpu_reserved_twice_is_reported_and_fails_the_command(nc: Client, servers: Servers) -> None:
    await write(nc, ("reserve", "a", 5, alloc(0, 1)), ("reserve", "b", 1, alloc(1)))
    code, out = await asyncio.to_thread(audit, servers)
    assert code == 1
    assert len(out["double_use"]) == 1 and "gpu:n0:1" in out["double_use"][0]  # type: ignore[index]
