"""`oneplus reservation list` where no intake answers (a stopped platform, an operator's box on the bus): it reads
the `advance_reservations` bucket itself, with the same rows the intake lists."""

from __future__ import annotations

import asyncio
import json
import time

from nats.aio.client import Client
from oneplus_bus.streams import ensure_kv
from oneplus_contracts import subjects
from oneplus_contracts.advance import AdvanceReservation
from oneplus_queueing.advance import window_rows
from oneplus_testing import Servers, wipe_bus
from typer.testing import CliRunner

from oneplus.cli.app import app as cli


async def test_list_reads_the_bucket_when_no_intake_answers(nc: Client, servers: Servers) -> None:
    await wipe_bus(nc)
    js = nc.jetstream()
    await ensure_kv(js)
    now = time.time()
    res = AdvanceReservation(name="maint", nodes=["gpu01", "gpu02"], start_ts=now + 3600, end_ts=now + 7200,
                             teams=["ops"], maint=True, gpus=16)  # fmt: skip
    kv = await js.key_value(subjects.ADVANCE_RESERVATIONS_KV)
    await kv.put(res.name, res.model_dump_json().encode())
    got = await asyncio.to_thread(
        CliRunner().invoke, cli, ["reservation", "list", "--json", "--nats", servers.nats_url]
    )
    assert got.exit_code == 0, got.output
    assert json.loads(got.stdout) == window_rows(time.time(), [res])
    table = await asyncio.to_thread(CliRunner().invoke, cli, ["reservation", "list", "--nats", servers.nats_url])
    assert table.exit_code == 0 and table.stdout.splitlines()[1].split()[:4] == ["maint", "WAITING", "gpu[01-02]", "16"]
    await wipe_bus(nc)
