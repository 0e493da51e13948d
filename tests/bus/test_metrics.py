"""Every service serves its own Prometheus registry on ONEPLUS_METRICS_PORT (or --metrics-port): FastStream's
middleware metrics, the process collectors and the platform's own, such as dead letters."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import socket
import time
import urllib.request

import pytest
from faststream.nats import NatsMessage
from nats.aio.client import Client
from oneplus_bus.metrics import ConfigError, MetricsServer, add_metrics_port_argument, parse_metrics_port
from oneplus_bus.service import OneplusService
from oneplus_bus.settings import BusSettings
from oneplus_contracts import PreemptionRequest, subjects
from oneplus_testing import Servers
from prometheus_client import CollectorRegistry


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        assert resp.status == 200
        return str(resp.read().decode())


@pytest.mark.parametrize(("value", "port"), [(None, None), ("", None), ("  ", None), ("0", 0), ("9464", 9464)])
def test_port_values(value: str | None, port: int | None) -> None:
    assert parse_metrics_port(value) == port


@pytest.mark.parametrize("value", ["abc", "-1", "65536", "9464x", "1.5"])
def test_a_bad_port_is_refused_with_what_is_accepted(value: str) -> None:
    with pytest.raises(ConfigError, match=r"ONEPLUS_METRICS_PORT=.*expected a TCP port \(1-65535\), 0 for any free"):
        parse_metrics_port(value)


def test_a_service_refuses_a_bad_port_before_it_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONEPLUS_METRICS_PORT", "metrics")
    with pytest.raises(ConfigError, match="ONEPLUS_METRICS_PORT='metrics'"):
        OneplusService("t", "test", BusSettings("nats://127.0.0.1:1", "redis://127.0.0.1:1"))


def test_the_command_line_flag(capsys: pytest.CaptureFixture[str]) -> None:
    p = argparse.ArgumentParser(prog="x")
    add_metrics_port_argument(p)
    assert p.parse_args([]).metrics_port is None
    assert p.parse_args(["--metrics-port", "0"]).metrics_port == 0
    assert p.parse_args(["--metrics-port", "9100"]).metrics_port == 9100
    with pytest.raises(SystemExit):
        p.parse_args(["--metrics-port", "http"])
    assert "--metrics-port='http': expected a TCP port" in capsys.readouterr().err


def test_the_executor_and_fleet_command_lines_take_the_flag() -> None:
    from oneplus_node_executor.fleet import parser

    assert parser().parse_args(["--metrics-port", "0"]).metrics_port == 0


def test_a_port_in_use_is_a_clear_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(ConfigError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
            MetricsServer(CollectorRegistry(), port).start()


def test_no_port_no_listener(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ONEPLUS_METRICS_PORT", raising=False)
    svc = OneplusService("t", "test", BusSettings("nats://127.0.0.1:1", "redis://127.0.0.1:1"))
    assert svc.start_metrics() is None and svc.metrics_url is None


async def test_a_service_serves_its_registry(
    nc: Client, servers: Servers, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("ONEPLUS_METRICS_PORT", "0")
    svc = OneplusService("metrics-test", "test", BusSettings(servers.nats_url, servers.redis_url, max_deliver=2))
    handled = asyncio.Event()

    @svc.durable_subscriber(
        subjects.PREEMPTION_REQUEST, stream=subjects.COMMANDS_STREAM, consumer="metrics-test", title="t"
    )
    async def on_request(msg: NatsMessage) -> None:
        handled.set()
        PreemptionRequest.model_validate_json(msg.body)  # a body that is no request: a dead letter at once

    caplog.set_level(logging.INFO, logger="oneplus.metrics")
    await svc.app.start()
    try:
        url = svc.metrics_url
        assert url is not None and url.startswith("http://127.0.0.1:") and url.endswith("/metrics")
        assert [r.getMessage() for r in caplog.records if r.name == "oneplus.metrics"] == [f"metrics on {url}"]
        await nc.jetstream().publish(subjects.PREEMPTION_REQUEST, b'{"not": "a request"}')
        await asyncio.wait_for(handled.wait(), 10)
        deadline = time.monotonic() + 10
        while True:
            text = await asyncio.to_thread(scrape, url)
            if "oneplus_dead_letters_total{" in text and "faststream_received_processed_messages_total{" in text:
                break
            assert time.monotonic() < deadline, text[-3000:]
            await asyncio.sleep(0.1)
        assert f'oneplus_dead_letters_total{{error="ValidationError",stream="{subjects.COMMANDS_STREAM}"}} 1.0' in text
        assert 'app_name="metrics-test"' in text
        assert "process_cpu_seconds_total" in text
        assert 'oneplus_gc_pause_seconds_bucket{generation="2",le="0.05"}' in text
    finally:
        await svc.app.stop()
    assert svc.gc_pauses._on_gc not in gc.callbacks, "a stopped service leaves the collector's callbacks as it was"
    assert svc.metrics_server is None
    with pytest.raises(OSError):
        await asyncio.to_thread(scrape, url)
