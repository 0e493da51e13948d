"""Spans go over OTLP/HTTP to the collector the standard OTEL_* variables name: a receiver here decodes them."""

from __future__ import annotations

import asyncio
import gzip
import importlib.util
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from faststream.nats import NatsMessage
from faststream.nats.opentelemetry import NatsTelemetryMiddleware
from nats.aio.client import Client
from oneplus_bus.broker import whole_message_subscriber
from oneplus_bus.metrics import ConfigError
from oneplus_bus.service import OneplusService
from oneplus_bus.settings import BusSettings
from oneplus_bus.telemetry import inject, job_span, make_tracer_provider, otel_exporters, traceparent_of_current
from oneplus_contracts import subjects
from oneplus_testing import Servers
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

OTEL_VARS = (
    "OTEL_SDK_DISABLED",
    "OTEL_TRACES_EXPORTER",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_SERVICE_NAME",
    "OTEL_RESOURCE_ATTRIBUTES",
)


class Receiver:
    """A minimal OTLP/HTTP collector: POST /v1/traces with a protobuf ExportTraceServiceRequest."""

    def __init__(self) -> None:
        self.requests: list[ExportTraceServiceRequest] = []
        self.paths: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                outer.paths.append(self.path)
                req = ExportTraceServiceRequest()
                req.ParseFromString(body)
                outer.requests.append(req)
                out = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def spans(self) -> list[tuple[str, str]]:
        """(service.name, span name) of every span received."""
        out: list[tuple[str, str]] = []
        for req in self.requests:
            for rs in req.resource_spans:
                attrs = {a.key: a.value.string_value for a in rs.resource.attributes}
                for ss in rs.scope_spans:
                    out.extend((attrs.get("service.name", ""), s.name) for s in ss.spans)
        return out

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[Receiver]:
    for var in OTEL_VARS:
        monkeypatch.delenv(var, raising=False)
    r = Receiver()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", r.endpoint)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    try:
        yield r
    finally:
        r.close()


async def test_a_service_sends_its_spans_to_the_collector(nc: Client, servers: Servers, receiver: Receiver) -> None:
    svc = OneplusService("otlp-test", "test", BusSettings(servers.nats_url, servers.redis_url))
    handled = asyncio.Event()

    @svc.durable_subscriber(subjects.PREEMPTION_REQUEST, stream=subjects.COMMANDS_STREAM, consumer="otlp-t", title="t")
    async def on_request(msg: NatsMessage) -> None:
        with job_span(svc.tracer, "otlp-test handle", None, {"oneplus.job_id": "j1"}):
            handled.set()

    await svc.app.start()
    try:
        await nc.jetstream().publish(subjects.PREEMPTION_REQUEST, b"{}")
        await asyncio.wait_for(handled.wait(), 10)
        deadline = time.monotonic() + 10
        while ("otlp-test", "otlp-test handle") not in receiver.spans():
            assert time.monotonic() < deadline, receiver.spans()
            await asyncio.sleep(0.05)
    finally:
        await svc.app.stop()
    assert set(receiver.paths) == {"/v1/traces"}
    names = {name for service, name in receiver.spans() if service == "otlp-test"}
    # FastStream's consumer span, parent of ours, came the same way.
    assert any(subjects.PREEMPTION_REQUEST in n for n in names), names


def test_otel_service_name_wins(receiver: Receiver, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_SERVICE_NAME", "renamed")
    provider = make_tracer_provider("otlp-test")
    provider.get_tracer("t").start_span("one").end()
    provider.shutdown()  # flushes the batch
    assert receiver.spans() == [("renamed", "one")]


def test_no_endpoint_no_exporter_and_none_turns_it_off(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in OTEL_VARS:
        monkeypatch.delenv(var, raising=False)
    assert otel_exporters() == []
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    assert len(otel_exporters()) == 1
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    assert otel_exporters() == []
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert otel_exporters() == []


@pytest.mark.parametrize(
    ("var", "value", "message"),
    [
        ("OTEL_TRACES_EXPORTER", "zipkin", "'zipkin' is not one of otlp, console, none"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json", "expected http/protobuf or grpc"),
        pytest.param(
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "grpc",
            "needs the opentelemetry-exporter-otlp-proto-grpc package",
            marks=pytest.mark.skipif(
                importlib.util.find_spec("opentelemetry.exporter.otlp.proto.grpc") is not None,
                reason="the gRPC exporter is installed",
            ),
        ),
    ],
)
def test_a_setting_that_cannot_be_honoured_is_refused(
    monkeypatch: pytest.MonkeyPatch, var: str, value: str, message: str
) -> None:
    for v in OTEL_VARS:
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    monkeypatch.setenv(var, value)
    with pytest.raises(ConfigError, match=message):
        OneplusService("t", "test", BusSettings("nats://127.0.0.1:1", "redis://127.0.0.1:1"))


def test_with_nothing_to_export_spans_are_not_recorded_but_their_context_still_travels(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for var in (*OTEL_VARS, "OTEL_TRACES_SAMPLER", "ONEPLUS_TRACE_FILE", "ONEPLUS_TRACE_DIR"):
        monkeypatch.delenv(var, raising=False)
    tracer = make_tracer_provider("quiet").get_tracer("t")
    with job_span(tracer, "root", None) as span:
        assert not span.is_recording()
        ctx = span.get_span_context()
        assert ctx.is_valid and not ctx.trace_flags.sampled, "a trace id for logs and messages, nothing recorded"
        carrier = inject({})
    assert carrier["traceparent"].startswith(f"00-{ctx.trace_id:032x}-")
    # An explicit sampler, or anywhere to send spans, records them as before.
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_on")
    with make_tracer_provider("sampled").get_tracer("t").start_as_current_span("s") as span:
        assert span.is_recording()
    monkeypatch.delenv("OTEL_TRACES_SAMPLER")
    monkeypatch.setenv("ONEPLUS_TRACE_DIR", str(tmp_path))
    with make_tracer_provider("filed").get_tracer("t").start_as_current_span("s") as span:
        assert span.is_recording()


async def test_with_nothing_to_export_a_handler_runs_in_its_messages_trace(
    monkeypatch: pytest.MonkeyPatch, nc: Client, servers: Servers
) -> None:
    """FastStream's telemetry middleware builds spans for every message; with nowhere to send them the broker only
    carries the trace on: the handler runs in the trace its message names (a new one when it names none)."""
    for var in (*OTEL_VARS, "OTEL_TRACES_SAMPLER", "ONEPLUS_TRACE_FILE", "ONEPLUS_TRACE_DIR"):
        monkeypatch.delenv(var, raising=False)
    svc = OneplusService("quiet-trace", "test", BusSettings(servers.nats_url, servers.redis_url))
    assert not any(isinstance(m, NatsTelemetryMiddleware) for m in svc.broker.middlewares)
    seen: list[str | None] = []

    async def answer(msg: NatsMessage) -> dict[str, str]:
        seen.append(traceparent_of_current())
        return {}

    whole_message_subscriber(svc.broker, "oneplus.test.quiet-trace", queue="t")(answer)
    await svc.app.start()
    try:
        sender = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"
        await nc.request("oneplus.test.quiet-trace", b"{}", headers={"traceparent": sender}, timeout=10)
        await nc.request("oneplus.test.quiet-trace", b"{}", timeout=10)
        await nc.request("oneplus.test.quiet-trace", b"{}", timeout=10)
    finally:
        await svc.app.stop()
    assert seen[0] == sender, "the sender's trace and span carry on into what the handler sends"
    assert seen[1] is not None and seen[2] is not None, "a message naming no trace starts one"
    assert seen[1].split("-")[1] != seen[2].split("-")[1], "a trace of its own for each such message"
    assert seen[1].endswith("-00") or seen[1].endswith("-02"), "not sampled: nothing is recorded"


def test_a_service_that_exports_spans_keeps_faststreams_telemetry_middleware(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for var in (*OTEL_VARS, "OTEL_TRACES_SAMPLER", "ONEPLUS_TRACE_FILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("ONEPLUS_TRACE_DIR", str(tmp_path))
    svc = OneplusService("loud-trace", "test", BusSettings("nats://127.0.0.1:1", "redis://127.0.0.1:1"))
    assert any(isinstance(m, NatsTelemetryMiddleware) for m in svc.broker.middlewares)
