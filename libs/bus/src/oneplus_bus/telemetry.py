"""OpenTelemetry set-up: one trace per job, carried in NATS headers as W3C `traceparent`.

Spans leave a process two ways: as JSON lines (`ONEPLUS_TRACE_FILE`, or one file per process under
`ONEPLUS_TRACE_DIR`: what the tests read), and over OTLP to a collector, configured by the standard `OTEL_*`
variables (docs/observability.md): `OTEL_TRACES_EXPORTER` (`otlp`, `console`, `none`; unset: `otlp` when an
`OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT` is set, else none), `OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL` (`http/protobuf`,
the default, or `grpc` with opentelemetry-exporter-otlp-proto-grpc installed), `OTEL_SERVICE_NAME` (default the
service's name), `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_SDK_DISABLED`, `OTEL_TRACES_SAMPLER`, `OTEL_BSP_*`, and the
exporter's own (headers, timeout, certificates).
"""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased

from .metrics import ConfigError


class JsonLinesSpanExporter(SpanExporter):
    """Appends finished spans as JSON lines: lets tests and operators read spans of separate processes."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(s.to_json(indent=None) + "\n" for s in spans)
        with self._lock, open(self._path, "a", encoding="utf-8") as f:
            f.write(lines)
        return SpanExportResult.SUCCESS


# Exporters every provider made from now on also feeds (an in-memory exporter in tests, say).
EXTRA_EXPORTERS: list[SpanExporter] = []
# The sampler of a provider made with nothing to export to and no sampler asked for: no span of its leaves the process.
UNRECORDED = ParentBased(ALWAYS_OFF)


def otel_exporters() -> list[SpanExporter]:
    """The exporters the standard OTEL_* variables ask for (ConfigError for a value that cannot be honoured)."""
    env = os.environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    raw = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if raw:
        names = [n.strip() for n in raw.split(",") if n.strip()]
    elif any(env.get(k, "").strip() for k in ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")):
        names = ["otlp"]
    else:
        names = []
    if "none" in names:
        return []
    out: list[SpanExporter] = []
    for name in names:
        if name == "otlp":
            out.append(_otlp_exporter())
        elif name == "console":
            out.append(ConsoleSpanExporter())
        else:
            raise ConfigError(f"OTEL_TRACES_EXPORTER={raw!r}: {name!r} is not one of otlp, console, none")
    return out


def _otlp_exporter() -> SpanExporter:
    env = os.environ
    protocol = (
        env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "").strip()
        or env.get("OTEL_EXPORTER_OTLP_PROTOCOL", "").strip()
        or "http/protobuf"
    ).lower()
    if protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter()  # endpoint, headers, timeout, compression: from OTEL_EXPORTER_OTLP_*
    if protocol == "grpc":
        try:
            grpc = importlib.import_module("opentelemetry.exporter.otlp.proto.grpc.trace_exporter")
        except ImportError:
            raise ConfigError(
                "OTEL_EXPORTER_OTLP_PROTOCOL=grpc needs the opentelemetry-exporter-otlp-proto-grpc package; "
                "install it, or use http/protobuf (the default)"
            ) from None
        exporter: SpanExporter = grpc.OTLPSpanExporter()
        return exporter
    raise ConfigError(f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r}: expected http/protobuf or grpc")


def make_resource(service: str) -> Resource:
    """`service.name` is OTEL_SERVICE_NAME when set, else the service's; OTEL_RESOURCE_ATTRIBUTES are added."""
    attrs: dict[str, str] = {"service.namespace": "oneplus", "oneplus.service": service}
    env = os.environ
    named = env.get("OTEL_SERVICE_NAME", "").strip() or "service.name=" in env.get("OTEL_RESOURCE_ATTRIBUTES", "")
    if not named:
        attrs["service.name"] = service
    return Resource.create(attrs)


def make_tracer_provider(service: str, extra_exporters: Sequence[SpanExporter] = ()) -> TracerProvider:
    exporters = otel_exporters()
    extra_exporters = [*extra_exporters, *EXTRA_EXPORTERS]
    path = os.environ.get("ONEPLUS_TRACE_FILE")
    folder = os.environ.get("ONEPLUS_TRACE_DIR")
    # The sampler: OTEL_TRACES_SAMPLER. Unset and nothing to export to: spans are not recorded (their context still
    # travels in every message), since building spans no one reads cost a burst about a tenth of the fleet's CPU.
    sampler = None
    if not (exporters or extra_exporters or path or folder or os.environ.get("OTEL_TRACES_SAMPLER", "").strip()):
        sampler = UNRECORDED
    provider = TracerProvider(resource=make_resource(service), sampler=sampler)
    for exp in exporters:
        # Batched, off the event loop's thread: a slow or absent collector never holds a handler up.
        provider.add_span_processor(BatchSpanProcessor(exp))
    if path:
        provider.add_span_processor(SimpleSpanProcessor(JsonLinesSpanExporter(path)))
    if folder:
        # One file per process: concurrent appends from several services never interleave.
        out = os.path.join(folder, f"spans-{service}-{os.getpid()}.jsonl")
        provider.add_span_processor(SimpleSpanProcessor(JsonLinesSpanExporter(out)))
    for exp in extra_exporters:
        provider.add_span_processor(SimpleSpanProcessor(exp))
    return provider


def records_spans(provider: TracerProvider) -> bool:
    """False for a provider `make_tracer_provider` made with nothing to export to: no span of its leaves the process."""
    return provider.sampler is not UNRECORDED


def traceparent_of_current() -> str | None:
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier.get("traceparent")


def context_from_traceparent(traceparent: str | None) -> Context | None:
    if not traceparent:
        return None
    return propagate.extract({"traceparent": traceparent})


def inject(headers: dict[str, str], context: Context | None = None) -> dict[str, str]:
    propagate.inject(headers, context=context)
    return headers


@contextmanager
def job_span(
    tracer: trace.Tracer, name: str, traceparent: str | None, attributes: Mapping[str, Any] | None = None
) -> Iterator[trace.Span]:
    """A span that continues the job's trace even when the work is not inside a message handler."""
    ctx = context_from_traceparent(traceparent)
    with tracer.start_as_current_span(name, context=ctx, attributes=dict(attributes or {})) as span:
        yield span
