"""Prometheus metrics: each service serves its own registry (`svc.metrics`) on a port of its own.

`ONEPLUS_METRICS_PORT`: unset or empty, no listener; `0`, a free port; `N`, that port (a command line's
`--metrics-port` wins over it). `ONEPLUS_METRICS_HOST` is the address it listens on (default 127.0.0.1). A service
with a listener logs one line, `metrics on http://<host>:<port>/metrics`. docs/observability.md lists the metrics.
"""

from __future__ import annotations

import argparse
import logging
import os
import threading
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server

METRICS_PORT_ENV = "ONEPLUS_METRICS_PORT"
METRICS_HOST_ENV = "ONEPLUS_METRICS_HOST"
DEFAULT_METRICS_HOST = "127.0.0.1"

log = logging.getLogger("oneplus.metrics")


class ConfigError(ValueError):
    """A setting from the environment or a command line that cannot be used; the message says what is accepted."""


def parse_metrics_port(value: str | None, source: str = METRICS_PORT_ENV) -> int | None:
    """None (no listener) for unset or empty; 0 for a free port; N for port N (1-65535)."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    if not text.isdigit() or int(text) > 65535:
        raise ConfigError(
            f"{source}={value!r}: expected a TCP port (1-65535), 0 for any free port, or empty for no metrics listener"
        )
    return int(text)


def metrics_port_from_env() -> int | None:
    return parse_metrics_port(os.environ.get(METRICS_PORT_ENV))


def metrics_host_from_env() -> str:
    return os.environ.get(METRICS_HOST_ENV, "").strip() or DEFAULT_METRICS_HOST


def port_argument(value: str) -> int | None:
    """An argparse `type=` for `--metrics-port` (same rules as the variable)."""
    try:
        return parse_metrics_port(value, "--metrics-port")
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_metrics_port_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--metrics-port",
        type=port_argument,
        default=None,
        help=f"serve Prometheus metrics on this port (0: any free port; default ${METRICS_PORT_ENV}, unset: none)",
    )


class MetricsServer:
    """One HTTP listener serving `registry` at /metrics (prometheus_client's, in a daemon thread)."""

    def __init__(self, registry: CollectorRegistry, port: int, host: str = DEFAULT_METRICS_HOST) -> None:
        self.registry = registry
        self.requested_port = port
        self.host = host
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        assert self._server is not None, "metrics server not started"
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def start(self) -> str:
        if self._server is None:
            try:
                self._server, self._thread = start_http_server(self.requested_port, self.host, self.registry)
            except OSError as exc:
                raise ConfigError(
                    f"cannot serve metrics on {self.host}:{self.requested_port}: {exc.strerror or exc} "
                    f"(set {METRICS_PORT_ENV} to a free port, or 0 for any)"
                ) from exc
            log.info("metrics on %s", self.url)
        return self.url

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
