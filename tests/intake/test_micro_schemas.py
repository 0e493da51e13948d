"""All five services found the way `nats micro ls` finds them, and their PING/INFO/STATS answers valid against the
schemas natscli validates with (nats-io/jsm.go schemas/micro/v1, copied in tests/intake/schemas/)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import Any

import jsonschema
import nats
import pytest
import redis.asyncio as aioredis
from oneplus_contracts import subjects
from oneplus_reservations import ReservationStore
from oneplus_testing import Servers, wipe_bus

from oneplus.client import OnePlusClient
from oneplus.demo import wait_for_platform
from oneplus.devstack import DEMO_NODES, Platform, free_port

pytestmark = pytest.mark.e2e

SCHEMAS = Path(__file__).parent / "schemas"
SERVICES = {
    "oneplus-intake",
    "oneplus-topology-registry",
    "oneplus-placement-solver",
    "oneplus-preemption",
    "oneplus-node-executor",
}
OPS_SUBJECTS = {
    subjects.OPS_QUEUE_LIST,
    subjects.OPS_JOB_SHOW,
    subjects.OPS_JOB_EXPLAIN,
    subjects.OPS_JOB_CANCEL,
    subjects.OPS_NODE_LIST,
    subjects.OPS_NODE_DRAIN,
    subjects.OPS_NODE_CORDON,
}


def validator(kind: str) -> jsonschema.Draft7Validator:
    schema = json.loads((SCHEMAS / f"{kind}_response.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema, format_checker=jsonschema.Draft7Validator.FORMAT_CHECKER)


def assert_valid(kind: str, reply: dict[str, Any]) -> None:
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator(kind).iter_errors(reply)]
    assert not errors, f"{reply.get('name')} {kind}: {errors}"


@pytest.fixture(scope="module")
async def platform(servers, tmp_path_factory) -> AsyncIterator[Platform]:  # type: ignore[no-untyped-def]
    nc = await nats.connect(servers.nats_url)
    await wipe_bus(nc)
    await nc.close()
    await ReservationStore(aioredis.Redis.from_url(servers.redis_url)).wipe()
    logs = Path(tmp_path_factory.mktemp("micro")) / "logs"
    env = {"ONEPLUS_HTTP_PORT": str(free_port()), "ONEPLUS_HEARTBEAT_S": "0.5"}
    p = Platform(servers.nats_url, servers.redis_url, nodes=DEMO_NODES[:1], logdir=logs, extra_env=env).start()
    try:
        async with OnePlusClient.connect(servers.nats_url) as c:
            await wait_for_platform(c, 1, timeout=120)
        yield p
    finally:
        p.stop()


async def test_every_service_is_discovered_through_srv_info_and_answers_valid_ping_info_stats(
    platform: Platform, servers: Servers
) -> None:
    async with OnePlusClient.connect(servers.nats_url) as c:
        await c.queue()  # one request, so that STATS has something to count
        infos = await c.services(quiet_s=0.3, kind="INFO")
        pings = await c.services(quiet_s=0.3, kind="PING")
        stats = await c.services(quiet_s=0.3, kind="STATS")
    assert {i["name"] for i in infos} == SERVICES, "nats micro ls must list all five services"
    assert {p["name"] for p in pings} == SERVICES and {s["name"] for s in stats} == SERVICES
    for kind, replies in (("info", infos), ("ping", pings), ("stats", stats)):
        for reply in replies:
            assert_valid(kind, reply)
            assert reply["type"] == f"io.nats.micro.v1.{kind}_response"
    for s in stats:
        datetime.fromisoformat(s["started"].replace("Z", "+00:00"))  # RFC 3339, which the schema only annotates
    solver = next(s for s in stats if s["name"] == "oneplus-placement-solver")
    queue_list = next(e for e in solver["endpoints"] if e["subject"] == subjects.OPS_QUEUE_LIST)
    assert queue_list["num_requests"] >= 1
    endpoints = {e["subject"] for i in infos for e in i.get("endpoints") or []}
    assert endpoints >= OPS_SUBJECTS, f"missing ops endpoints: {OPS_SUBJECTS - endpoints}"
    assert platform.dead() == {}


async def test_a_service_answers_ping_by_name_and_by_id(platform: Platform, bus) -> None:  # type: ignore[no-untyped-def]
    msg = await bus.request("$SRV.PING.oneplus-intake", b"", timeout=5)
    ping = json.loads(msg.data)
    assert_valid("ping", ping)
    again = json.loads((await bus.request(f"$SRV.INFO.oneplus-intake.{ping['id']}", b"", timeout=5)).data)
    assert_valid("info", again)
    assert again["id"] == ping["id"] and {e["subject"] for e in again["endpoints"]} >= {subjects.OPS_JOB_CANCEL}


def test_a_reply_that_breaks_the_schema_is_caught() -> None:
    with pytest.raises(AssertionError, match="version"):
        assert_valid("ping", {"type": "io.nats.micro.v1.ping_response", "name": "x", "id": "1", "version": "one"})
    with pytest.raises(AssertionError, match="num_requests"):
        endpoint = {"name": "e", "subject": "s", "num_errors": 0, "last_error": "", "processing_time": 0}
        reply = {"type": "io.nats.micro.v1.stats_response", "name": "x", "id": "1", "version": "1.0.0"}
        assert_valid("stats", {**reply, "started": "2026-12-02T13:49:12Z", "endpoints": [endpoint]})
