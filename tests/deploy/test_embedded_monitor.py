"""The embedded NATS server's HTTP monitoring: off by default, on loopback when asked for (`bench:scale` reads a
burst's messages by client from it)."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request

import nats

from oneplus.devstack import EmbeddedServers


def get(url: str) -> dict[str, object]:
    with urllib.request.urlopen(url, timeout=5) as resp:
        doc: dict[str, object] = json.load(resp)
    return doc


def test_monitoring_is_off_unless_asked_for() -> None:
    with EmbeddedServers() as servers:
        assert servers.monitor_url is None
        assert servers.monitor_port == 0


def test_asked_for_it_serves_the_counts_by_client_on_loopback() -> None:
    with EmbeddedServers(monitor=True) as servers:
        assert servers.monitor_url == f"http://127.0.0.1:{servers.monitor_port}"
        varz = get(f"{servers.monitor_url}/varz")
        assert varz["http_host"] == "127.0.0.1", "bound where the client port is, not on every address"

        async def publish() -> None:
            nc = await nats.connect(servers.nats_url, name="counted")
            for _ in range(5):
                await nc.publish("x.y", b"hello")
            await nc.flush()
            # The server may answer the flush's PING before it adds that read's messages to the counts /connz shows
            # (clean-clone CI once read 0): the counts are eventually right, so read until they are or time is up.
            deadline = time.monotonic() + 5
            while True:
                conns = get(f"{servers.monitor_url}/connz")["connections"]
                assert isinstance(conns, list)
                mine = [c for c in conns if c.get("name") == "counted"]
                assert len(mine) == 1, conns
                if mine[0]["in_msgs"] == 5 or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.05)
            assert mine[0]["in_msgs"] == 5 and mine[0]["in_bytes"] == 25, mine[0]
            await nc.close()

        asyncio.run(publish())
