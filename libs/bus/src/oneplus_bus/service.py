"""The scaffold every OnePlus service shares: broker, streams, KV, ledger, NATS micro ops, background loops.

A service module declares its handlers on `svc.broker`, its ops endpoints with `@svc.ops(...)` and its
loops with `@svc.background`; `svc.run()` starts it with graceful shutdown on SIGINT/SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import os
import warnings
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import nats
import nats.errors
import nats.js.errors
import nats.micro
from faststream import AckPolicy, FastStream
from faststream.nats import JStream
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy
from nats.js.kv import KeyValue
from nats.micro.request import Request
from nats.micro.service import Service
from oneplus_contracts import subjects
from opentelemetry.sdk.trace.export import SpanExporter
from prometheus_client import GC_COLLECTOR, PLATFORM_COLLECTOR, PROCESS_COLLECTOR, CollectorRegistry
from pydantic import BaseModel, ValidationError

from .broker import MessageHandler, make_broker, whole_message_subscriber
from .gcpause import GcPauses
from .health import remove_health_file, write_health_file
from .ledger import JobLedger
from .logs import FASTSTREAM_LOGGER, configure_logging, log_settings_from_env
from .metrics import MetricsServer, metrics_host_from_env, metrics_port_from_env
from .retry import raise_if_cancelling, until_answered
from .settings import BusSettings
from .streams import ensure_kv, ensure_streams
from .telemetry import make_tracer_provider
from .tenancy import PLATFORM_ACCOUNTS, TenancyError, caller_of

VERSION = "0.1.0"
STARTUP_WAIT_S = 60.0  # how long a starting service waits for JetStream to answer before it exits
GC_GEN0 = 5000  # young-generation threshold of every service (ONEPLUS_GC_GEN0); why: `young_collection_after`
FREEZE_AFTER_S = (0.0, 20.0)  # started, then its informers have listed (seconds after the one before)
# Our push consumers are durable AND a deliver group (queue=durable name), so replicas share them.
warnings.filterwarnings(
    "ignore", message="The JetStream Push consumer with the `durable` option", category=RuntimeWarning
)
OpsHandler = Callable[[dict[str, Any], dict[str, str]], Awaitable[Any]]
log = logging.getLogger("oneplus")


class OpsError(Exception):
    """An ops request that cannot be served; the message goes back to the caller as the error."""

    def __init__(self, message: str, code: int = 400) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class RawJson:
    """An ops result already in JSON (a page of records as the store keeps them): sent as it is, not decoded into
    models and encoded again, which was most of the time of a long job listing."""

    body: bytes


def jstream(name: str) -> JStream:
    """A reference to a stream that `ensure_streams` declared (subscribers must not redeclare it)."""
    return JStream(name=name, declare=False)


class OneplusService:
    def __init__(
        self,
        name: str,
        description: str,
        settings: BusSettings | None = None,
        span_exporters: tuple[SpanExporter, ...] = (),
    ) -> None:
        self.name = name
        self.description = description
        self.settings = settings or BusSettings.from_env()
        # Observability settings are read (and refused with a clear message) before anything starts.
        self.log_level, self.log_format = log_settings_from_env()
        # The metrics listener's port (None: none); a command line's --metrics-port may set it before the start.
        self.metrics_port: int | None = metrics_port_from_env()
        self.metrics_host = metrics_host_from_env()
        self.metrics_server: MetricsServer | None = None
        self.tracer_provider = make_tracer_provider(name, span_exporters)
        self.tracer = self.tracer_provider.get_tracer(f"oneplus.{name}")
        self.metrics = CollectorRegistry()
        for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            self.metrics.register(collector)
        self.gc_pauses = GcPauses(self.metrics)
        self.broker = make_broker(name, self.settings, self.tracer_provider, self.metrics)
        self.app = FastStream(
            self.broker,
            logger=logging.getLogger(FASTSTREAM_LOGGER),
            on_startup=[self._declare],
            after_startup=[self._after_startup],
            on_shutdown=[self._on_shutdown],
        )
        self._ops: list[tuple[str, str, OpsHandler]] = []
        self._loops: list[Callable[[], Awaitable[None]]] = []
        self._starters: list[Callable[[], Awaitable[None]]] = []
        self._stoppers: list[Callable[[], Awaitable[None]]] = []
        self._tasks: list[asyncio.Task[None]] = []
        self.micro: Service | None = None
        accounts = os.environ.get("ONEPLUS_PLATFORM_ACCOUNTS", "").strip()
        self.platform_accounts = frozenset(a.strip() for a in accounts.split(",") if a.strip()) or PLATFORM_ACCOUNTS
        self.kv: dict[str, KeyValue] = {}
        self._js: JetStreamContext | None = None
        self._ledger: JobLedger | None = None

    # --- wiring -------------------------------------------------------------------------------
    @property
    def nc(self) -> Client:
        return self.broker.connection

    @property
    def js(self) -> JetStreamContext:
        assert self._js is not None, "service not started"
        return self._js

    @property
    def ledger(self) -> JobLedger:
        assert self._ledger is not None, "service not started"
        return self._ledger

    def durable_subscriber(
        self,
        subject: str,
        *,
        stream: str,
        consumer: str,
        title: str,
        max_deliver: int | None = None,
        ack_wait: float = 30,
        deliver_policy: DeliverPolicy | None = None,
    ) -> Callable[[MessageHandler], MessageHandler]:
        """The platform's one way to consume a stream: a named durable push consumer shared by the replicas (deliver
        group), acknowledged only after the handler returns (NACK_ON_ERROR), redelivered at most `max_deliver` times,
        then dead-lettered. Named, its create API subject carries consumer and filter, which NATS permissions can
        grant one by one (deploy/nats). The handler is given the whole message (see `takes_whole_message`)."""
        return whole_message_subscriber(
            self.broker,
            subject,
            stream=jstream(stream),
            durable=consumer,
            queue=consumer,
            config=ConsumerConfig(
                name=consumer, max_deliver=max_deliver or self.settings.max_deliver, ack_wait=ack_wait
            ),
            ack_policy=AckPolicy.NACK_ON_ERROR,
            title=title,
            deliver_policy=deliver_policy,
        )

    def ops(self, endpoint: str, subject: str) -> Callable[[OpsHandler], OpsHandler]:
        def register(fn: OpsHandler) -> OpsHandler:
            self._ops.append((endpoint, subject, fn))
            return fn

        return register

    def background(self, fn: Callable[[], Awaitable[None]]) -> Callable[[], Awaitable[None]]:
        self._loops.append(fn)
        return fn

    def on_start(self, fn: Callable[[], Awaitable[None]]) -> Callable[[], Awaitable[None]]:
        """Runs after streams, KV and the connection exist, before background loops."""
        self._starters.append(fn)
        return fn

    def on_stop(self, fn: Callable[[], Awaitable[None]]) -> Callable[[], Awaitable[None]]:
        self._stoppers.append(fn)
        return fn

    # --- lifecycle ----------------------------------------------------------------------------
    @property
    def metrics_url(self) -> str | None:
        return self.metrics_server.url if self.metrics_server is not None else None

    def start_metrics(self) -> str | None:
        """Serve `self.metrics` on `metrics_port` (once); its URL, or None without a port."""
        if self.metrics_port is None:
            return None
        if self.metrics_server is None:
            self.metrics_server = MetricsServer(self.metrics, self.metrics_port, self.metrics_host)
        return self.metrics_server.start()

    async def _declare(self) -> None:
        self.start_metrics()  # first: a scrape sees a service that is still connecting
        # Streams must exist before the subscribers' durable consumers are created.
        nc = await nats.connect(
            servers=self.settings.nats_servers,
            max_reconnect_attempts=5,
            connect_timeout=5,
            inbox_prefix=self.settings.inbox_prefix,
        )
        try:
            await self._ensure_stores(nc.jetstream())
        finally:
            await nc.close()

    async def _ensure_stores(self, js: JetStreamContext) -> None:
        """Declare streams and buckets, waiting out a JetStream cluster that is still electing its leaders (its
        requests time out or answer 503 for a few seconds after the servers start) instead of exiting."""

        async def declare() -> None:
            await ensure_streams(js)
            await ensure_kv(js)

        await until_answered(declare, f"{self.name}: declaring streams and buckets", STARTUP_WAIT_S)

    async def _after_startup(self) -> None:
        self.gc_pauses.install()
        self._js = self.nc.jetstream()
        self.kv = await ensure_kv(self._js)
        self._ledger = JobLedger(self._js, self.kv[subjects.JOBS_KV], self.nc)
        self.micro = await nats.micro.add_service(
            self.nc,
            name=f"oneplus-{self.name}",
            version=VERSION,
            description=self.description,
            metadata={"service": self.name},
        )
        for endpoint, subject, fn in self._ops:
            await self.micro.add_endpoint(name=endpoint, subject=subject, handler=self._ops_adapter(fn))
        for start in self._starters:
            await start()
        for loop in self._loops:
            self._tasks.append(asyncio.create_task(self._guard(loop), name=f"{self.name}:{loop.__name__}"))
        # Last: a health check (oneplus_bus.health) finds and pings this instance only once all of it is up.
        write_health_file(self.name, self.micro.id, self.settings.inbox_prefix)
        log.info("%s started (%d ops endpoints, %d loops)", self.name, len(self._ops), len(self._loops))
        self._tasks.append(asyncio.create_task(freeze_heap(), name=f"{self.name}:freeze_heap"))

    def spawn(self, loop: Callable[[], Awaitable[None]]) -> asyncio.Task[None]:
        """Start `loop` now, restarted like a background loop and cancelled at shutdown (or by the caller)."""
        task = asyncio.create_task(self._guard(loop), name=f"{self.name}:{loop.__name__}")
        self._tasks = [t for t in self._tasks if not t.done()]
        self._tasks.append(task)
        return task

    async def _guard(self, loop: Callable[[], Awaitable[None]]) -> None:
        # A loop that raises is restarted: a transient broker or Redis error must not stop the service.
        while True:
            try:
                await loop()
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                # On Python 3.11 a timeout can swallow the cancel that stops this loop (see raise_if_cancelling): a
                # loop cancelled then failing must stop, not be restarted (a deposed owner's loops went on folding).
                raise_if_cancelling()
                log.exception("%s: loop %s failed; restarting in 1s", self.name, loop.__name__)
                await asyncio.sleep(1.0)

    async def _on_shutdown(self) -> None:
        self.gc_pauses.uninstall()
        remove_health_file(self.name)
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        for stop in self._stoppers:
            with contextlib.suppress(Exception):
                await stop()
        if self.micro is not None:
            with contextlib.suppress(Exception):
                await self.micro.stop()
        self.tracer_provider.shutdown()
        if self.metrics_server is not None:
            self.metrics_server.stop()
            self.metrics_server = None

    def _ops_adapter(self, fn: OpsHandler) -> Callable[[Request], Awaitable[None]]:
        async def handle(req: Request) -> None:
            try:
                payload = json.loads(req.data or b"{}") if req.data else {}
                if not isinstance(payload, dict):
                    raise OpsError("the request body must be a JSON object")
                headers = dict(req.headers or {})
                # The team comes from the caller's NATS account when the server stamped one, never from the body.
                caller = caller_of(headers, payload.get("team"), platform_accounts=self.platform_accounts)
                if caller.team is not None:
                    payload["team"] = caller.team
                result = await fn(payload, headers)
                if isinstance(result, RawJson):
                    await req.respond(b'{"ok":true,"result":' + result.body + b"}")
                    return
                body = result.model_dump(mode="json") if isinstance(result, BaseModel) else result
                await req.respond(json.dumps({"ok": True, "result": body}, default=_json_default).encode())
            except (OpsError, TenancyError) as exc:
                await req.respond_error(str(exc.code), str(exc), json.dumps({"ok": False, "error": str(exc)}).encode())
            except (json.JSONDecodeError, ValidationError) as exc:
                msg = f"bad request: {exc}"
                await req.respond_error("400", msg[:500], json.dumps({"ok": False, "error": msg}).encode())
            except Exception as exc:
                log.exception("%s: ops handler failed", self.name)
                msg = f"{type(exc).__name__}: {exc}"
                await req.respond_error("500", msg[:500], json.dumps({"ok": False, "error": msg}).encode())

        return handle

    def run(self) -> None:
        configure_logging(self.name, self.log_level, self.log_format)
        try:
            young_collection_after(gc_gen0_from_env())  # the process's setting, read before anything connects
        except ValueError as exc:
            raise SystemExit(f"{self.name}: {exc}") from None
        asyncio.run(self.app.run())


def gc_gen0_from_env() -> int:
    """ONEPLUS_GC_GEN0: allocations between two collections of the youngest generation (Python's default: 700)."""
    raw = os.environ.get("ONEPLUS_GC_GEN0", str(GC_GEN0))
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"ONEPLUS_GC_GEN0={raw!r} is not a whole number of allocations") from None
    if value < 100:
        raise ValueError(f"ONEPLUS_GC_GEN0={value} is below 100: the collector would run all the time")
    return value


def young_collection_after(allocations: int) -> None:
    """Collect the youngest generation after `allocations` net allocations instead of Python's 700.

    A service allocates a few hundred objects per message (pydantic models, headers, futures), nearly none in
    cycles: at 700 the collector ran several times per gang of a burst and took ~5% of the platform's CPU
    (`task bench:scale`, docs/performance.md). The older generations keep Python's ratios."""
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(allocations, older, oldest)


async def freeze_heap(settle_s: Sequence[float] = FREEZE_AFTER_S) -> None:
    """Move what the service holds once started (modules, its working set as first listed, a fleet's nodes) out
    of the cyclic garbage collector's reach, now and again once the informers have listed.

    A full collection walks every tracked object: 70-250 ms in each service with 512 nodes, a stall that every
    message in flight waits out (the scale benchmark's slowest paced jobs). Frozen objects are still freed when
    their last reference goes; only reference cycles among them would wait for `gc.unfreeze`.
    """
    for delay in settle_s:
        await asyncio.sleep(delay)
        gc.collect()
        gc.freeze()
        log.debug("heap frozen: %d objects out of the collector's reach", gc.get_freeze_count())


def _json_default(o: Any) -> Any:
    if isinstance(o, BaseModel):
        return o.model_dump(mode="json")
    if isinstance(o, set | frozenset | tuple):
        return list(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")
