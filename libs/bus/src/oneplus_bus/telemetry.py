"""OpenTelemetry set-up: one trace per job, carried in NATS headers as W3C `traceparent`."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult


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


def make_tracer_provider(service: str, extra_exporters: Sequence[SpanExporter] = ()) -> TracerProvider:
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    extra_exporters = [*extra_exporters, *EXTRA_EXPORTERS]
    path = os.environ.get("ONEPLUS_TRACE_FILE")
    if path:
        provider.add_span_processor(SimpleSpanProcessor(JsonLinesSpanExporter(path)))
    folder = os.environ.get("ONEPLUS_TRACE_DIR")
    if folder:
        # One file per process: concurrent appends from several services never interleave.
        out = os.path.join(folder, f"spans-{service}-{os.getpid()}.jsonl")
        provider.add_span_processor(SimpleSpanProcessor(JsonLinesSpanExporter(out)))
    for exp in extra_exporters:
        provider.add_span_processor(SimpleSpanProcessor(exp))
    return provider


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
