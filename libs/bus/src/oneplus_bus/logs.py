"""Service logging: one handler on stderr, level and format from the environment, no colour codes.

`ONEPLUS_LOG_LEVEL`: DEBUG, INFO (default), WARNING, ERROR or CRITICAL (or a number). `ONEPLUS_LOG_FORMAT`: `text`
(default: `<time> <service> <LEVEL> <message>`) or `json` (one object a line: time, level, service, logger,
message, and trace_id, span_id, job_id, subject when known). FastStream's own loggers (which colour their output
and write to stdout) are routed through the same handler.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

from opentelemetry import trace

from .metrics import ConfigError

LOG_LEVEL_ENV = "ONEPLUS_LOG_LEVEL"
LOG_FORMAT_ENV = "ONEPLUS_LOG_FORMAT"
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
FORMATS = ("text", "json")
# The logger FastStream's broker and app are given (instead of their own, which colour and bypass the root).
FASTSTREAM_LOGGER = "oneplus.faststream"


def parse_level(value: str | None, source: str = LOG_LEVEL_ENV) -> int:
    if value is None or not value.strip():
        return logging.INFO
    text = value.strip().upper()
    if text == "WARN":
        text = "WARNING"
    if text in LEVELS:
        return int(logging.getLevelName(text))
    if text.isdigit():
        return int(text)
    raise ConfigError(f"{source}={value!r}: expected one of {', '.join(LEVELS)} (or a number)")


def parse_format(value: str | None, source: str = LOG_FORMAT_ENV) -> str:
    if value is None or not value.strip():
        return "text"
    text = value.strip().lower()
    if text not in FORMATS:
        raise ConfigError(f"{source}={value!r}: expected 'text' or 'json'")
    return text


def log_settings_from_env() -> tuple[int, str]:
    """(level, format) from the environment; ConfigError for a value that is not one."""
    return parse_level(os.environ.get(LOG_LEVEL_ENV)), parse_format(os.environ.get(LOG_FORMAT_ENV))


class JsonFormatter(logging.Formatter):
    """One JSON object per record; the current span's trace and span ids, and a job id when one is known."""

    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "service": self.service,
            "logger": record.name,
            "message": record.getMessage(),
        }
        span = trace.get_current_span()
        ctx = span.get_span_context()
        if ctx.is_valid:
            out["trace_id"] = format(ctx.trace_id, "032x")
            out["span_id"] = format(ctx.span_id, "016x")
        job_id = getattr(record, "job_id", None)
        if job_id is None:
            attrs = getattr(span, "attributes", None)
            if attrs:
                job_id = attrs.get("oneplus.job_id")
        if job_id:
            out["job_id"] = str(job_id)
        for key in ("subject", "message_id"):  # what FastStream puts on its records
            v = getattr(record, key, None)
            if v:
                out[key] = str(v)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def text_formatter(service: str) -> logging.Formatter:
    return logging.Formatter(f"%(asctime)s {service} %(levelname)s %(message)s")


def configure_logging(
    service: str, level: int | None = None, fmt: str | None = None, stream: TextIO | None = None
) -> logging.Handler:
    """Replace the root logger's handlers with one that writes `fmt` at `level` (from the environment when not
    given); returns it. FastStream's loggers lose their own (coloured) handlers and propagate to it."""
    env_level, env_fmt = log_settings_from_env()
    level = env_level if level is None else level
    fmt = env_fmt if fmt is None else fmt
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter(service) if fmt == "json" else text_formatter(service))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level)
    tame_faststream()
    return handler


def tame_faststream() -> None:
    """FastStream's module loggers carry a colouring handler and do not propagate: send them to the root."""
    for name in ("faststream", "faststream.access", "faststream.access.nats"):
        lg = logging.getLogger(name)
        for h in list(lg.handlers):
            lg.removeHandler(h)
        lg.propagate = True
        lg.setLevel(logging.NOTSET)
