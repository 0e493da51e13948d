"""Service logs: a level and a format from the environment, JSON lines with trace and job ids, no colour codes."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from nats.aio.client import Client
from oneplus_bus.logs import FASTSTREAM_LOGGER, configure_logging, parse_format, parse_level
from oneplus_bus.metrics import ConfigError
from oneplus_bus.service import OneplusService
from oneplus_bus.settings import BusSettings
from oneplus_testing import Servers
from opentelemetry.sdk.trace import TracerProvider


@pytest.fixture
def root_restored() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
        for h in handlers:
            root.addHandler(h)
        root.setLevel(level)


def test_levels_and_formats() -> None:
    assert parse_level(None) == logging.INFO
    assert parse_level("debug") == logging.DEBUG
    assert parse_level(" Warn ") == logging.WARNING
    assert parse_level("15") == 15
    assert parse_format(None) == "text" and parse_format("JSON") == "json"


@pytest.mark.parametrize(
    ("var", "value", "message"),
    [
        ("ONEPLUS_LOG_LEVEL", "LOUD", "LOUD.: expected one of DEBUG, INFO, WARNING, ERROR, CRITICAL"),
        ("ONEPLUS_LOG_FORMAT", "xml", "ONEPLUS_LOG_FORMAT='xml': expected 'text' or 'json'"),
    ],
)
def test_a_bad_setting_stops_the_service_before_it_starts(
    monkeypatch: pytest.MonkeyPatch, var: str, value: str, message: str
) -> None:
    monkeypatch.setenv(var, value)
    with pytest.raises(ConfigError, match=message):
        OneplusService("t", "test", BusSettings("nats://127.0.0.1:1", "redis://127.0.0.1:1"))


def test_json_lines_carry_trace_and_job_ids(root_restored: None) -> None:
    out = io.StringIO()
    configure_logging("svc", logging.DEBUG, "json", stream=out)
    tracer = TracerProvider().get_tracer("t")
    log = logging.getLogger("oneplus.test")
    log.debug("plain %d", 1)
    with tracer.start_as_current_span("s", attributes={"oneplus.job_id": "job-7"}) as span:
        log.warning("inside")
        ctx = span.get_span_context()
    log.info("explicit", extra={"job_id": "job-9"})
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        log.exception("failed")
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(r["level"], r["message"]) for r in lines] == [
        ("DEBUG", "plain 1"),
        ("WARNING", "inside"),
        ("INFO", "explicit"),
        ("ERROR", "failed"),
    ]
    assert {k for k in lines[0]} == {"time", "level", "service", "logger", "message"}
    assert lines[0]["service"] == "svc" and lines[0]["logger"] == "oneplus.test"
    assert lines[1]["trace_id"] == format(ctx.trace_id, "032x") and lines[1]["job_id"] == "job-7"
    assert lines[2]["job_id"] == "job-9"
    assert "RuntimeError: boom" in lines[3]["exception"]


def test_the_level_filters_and_faststream_is_uncoloured(root_restored: None) -> None:
    from faststream._internal.logger.logging import logger as faststream_logger

    out = io.StringIO()
    configure_logging("svc", logging.WARNING, "text", stream=out)
    logging.getLogger("oneplus.test").info("hidden")
    logging.getLogger(FASTSTREAM_LOGGER).debug("Received")  # FastStream's per-message lines: DEBUG
    faststream_logger.warning("from faststream")
    text = out.getvalue()
    assert "hidden" not in text and "Received" not in text
    assert "svc WARNING from faststream" in text
    assert "\x1b[" not in text


async def test_a_service_process_logs_json_without_colour(nc: Client, servers: Servers) -> None:
    """The preemption service as a process: every stderr line is a JSON object, the metrics line among them."""
    await asyncio.to_thread(run_preemption_process, servers)  # on a wiped bus (the `nc` fixture)


def run_preemption_process(servers: Servers) -> None:
    env = {
        **os.environ,
        "NATS_URL": servers.nats_url,
        "REDIS_URL": servers.redis_url,
        "ONEPLUS_LOG_FORMAT": "json",
        "ONEPLUS_METRICS_PORT": "0",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "oneplus_preemption"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        assert proc.stderr is not None
        lines: list[bytes] = []
        deadline = time.monotonic() + 60
        while not any(b"preemption started" in line for line in lines):
            assert time.monotonic() < deadline and proc.poll() is None, b"".join(lines).decode()
            lines.append(proc.stderr.readline())
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    lines += err.splitlines(keepends=True)
    records = [json.loads(line) for line in lines if line.strip()]
    assert all(r["service"] == "preemption" for r in records)
    metrics = [r["message"] for r in records if r["message"].startswith("metrics on ")]
    assert len(metrics) == 1 and metrics[0].startswith("metrics on http://127.0.0.1:"), metrics
    assert b"\x1b[" not in b"".join(lines) and out == b""  # nothing on stdout
