"""The intake's HTTP front: `POST /v1/jobs` (same bodies as the NATS submit subject) and `POST /webhooks/mlflow`.

Answers: 201 `{"ok": true, "job_id": ...}` for a new job, 200 for a duplicate, 400 for a body that is not a job,
403 for another team's job, 422 for a job that cannot run here; always JSON with `error` naming the problem.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from oneplus_bus.tenancy import REQUEST_INFO_HEADER, TenancyError, caller_of
from oneplus_jobformats.cloudevents import MAX_BODY_BYTES
from opentelemetry import trace

from .submissions import Intake
from .webhooks import MlflowWebhook

log = logging.getLogger("oneplus.intake.http")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _json(status: int, body: dict[str, Any]) -> web.Response:
    return web.Response(status=status, text=json.dumps(body), content_type="application/json")


def _headers(request: web.Request) -> dict[str, str]:
    # Nats-Request-Info is what the NATS server says about a caller; over HTTP it would be the caller's own claim.
    return {k: v for k, v in request.headers.items() if k.lower() != REQUEST_INFO_HEADER.lower()}


@web.middleware
async def _errors_as_json(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException as exc:
        return _json(exc.status, {"ok": False, "code": f"http_{exc.status}", "error": exc.reason})
    except Exception as exc:
        log.exception("HTTP %s %s failed", request.method, request.path)
        return _json(500, {"ok": False, "error": f"internal error: {type(exc).__name__}: {exc}"[:500]})


class IntakeHttp:
    def __init__(self, intake: Intake, webhook: MlflowWebhook | None, tracer: trace.Tracer) -> None:
        self.intake = intake
        self.webhook = webhook
        self.tracer = tracer

    def app(self) -> web.Application:
        app = web.Application(middlewares=[_errors_as_json], client_max_size=MAX_BODY_BYTES + 1)
        app.router.add_post("/v1/jobs", self.post_job)
        app.router.add_post("/webhooks/mlflow", self.post_mlflow)
        app.router.add_get("/healthz", self.health)
        return app

    async def health(self, request: web.Request) -> web.Response:
        return _json(200, {"ok": True, "mlflow": self.webhook is not None})

    async def post_job(self, request: web.Request) -> web.Response:
        headers = _headers(request)
        body = await request.read()
        with self.tracer.start_as_current_span("POST /v1/jobs", kind=trace.SpanKind.SERVER) as span:
            try:
                caller = caller_of(headers)
            except TenancyError as exc:
                return _json(exc.code, {"ok": False, "job_id": None, "error": str(exc)})
            outcome = await self.intake.submit(headers, body, caller, source="http")
            if outcome.reply.job_id:
                span.set_attribute("oneplus.job_id", outcome.reply.job_id)
        return _json(outcome.status, outcome.reply.model_dump(mode="json"))

    async def post_mlflow(self, request: web.Request) -> web.Response:
        if self.webhook is None:
            error = "MLflow webhooks are not configured on this intake: set ONEPLUS_MLFLOW_SECRET"
            return _json(503, {"ok": False, "code": "not_configured", "error": error})
        body = await request.read()
        with self.tracer.start_as_current_span("POST /webhooks/mlflow", kind=trace.SpanKind.SERVER):
            status, answer = await self.webhook.deliver(_headers(request), body)
        return _json(status, answer)


class HttpServer:
    """The aiohttp runner inside the intake's event loop."""

    def __init__(self, app: web.Application, host: str, port: int) -> None:
        self.runner = web.AppRunner(app, access_log=None)
        self.host = host
        self.port = port

    async def start(self) -> int:
        await self.runner.setup()
        site = web.TCPSite(self.runner, self.host, self.port)
        await site.start()
        bound = self.runner.addresses[0][1] if self.runner.addresses else self.port
        log.info("HTTP intake on http://%s:%d (POST /v1/jobs, POST /webhooks/mlflow)", self.host, bound)
        return int(bound)

    async def stop(self) -> None:
        await self.runner.cleanup()
