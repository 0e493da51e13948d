"""The intake's HTTP front: `POST /v1/jobs` (same bodies as the NATS submit subject), the read/write API beside it
(http_api.py: list, show and cancel jobs, nodes, queues), `GET /openapi.json` and `POST /webhooks/mlflow`.

Submissions answer 201 `{"ok": true, "job_id": ...}` for a new job, 200 for a duplicate, 400 for a body that is not
a job, 403 for another team's job, 422 for a job that cannot run here. Every error, on every path, is JSON
`{"ok": false, "code": ..., "error": ...}` and carries no job id. With tokens configured (auth.py) `/v1/*` and
`/ui/api/*` need a bearer token and the team is the token's. More routes (a dashboard) come in through
`IntakeHttp(..., routes=[hook])`: each hook is called with the application to add its own.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from aiohttp import web
from oneplus_bus.tenancy import TenancyError, caller_of
from oneplus_jobformats.cloudevents import MAX_BODY_BYTES
from opentelemetry import trace

from . import openapi
from .auth import TokenBook, auth_middleware
from .http_api import JobsApi, caller_headers, error_response, json_response
from .metrics import IntakeMetrics
from .submissions import CANNOT_RUN, UNREADABLE, WRONG_TEAM, Intake
from .webhooks import MlflowWebhook

log = logging.getLogger("oneplus.intake.http")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
RouteHook = Callable[[web.Application], None]
SUBMIT_ERROR_CODES = {UNREADABLE: "unreadable", WRONG_TEAM: "wrong_team", CANNOT_RUN: "cannot_run"}


def _json(status: int, body: dict[str, Any]) -> web.Response:
    return json_response(status, body)


@web.middleware
async def _errors_as_json(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        answer = error_response(exc.status, exc.reason, f"http_{exc.status}")
        if "Allow" in exc.headers:
            answer.headers["Allow"] = exc.headers["Allow"]
        return answer
    except Exception as exc:
        log.exception("HTTP %s %s failed", request.method, request.path)
        return error_response(500, f"internal error: {type(exc).__name__}: {exc}"[:500])


class IntakeHttp:
    def __init__(
        self,
        intake: Intake,
        webhook: MlflowWebhook | None,
        tracer: trace.Tracer,
        *,
        api: JobsApi | None = None,
        routes: Sequence[RouteHook] = (),
        tokens: TokenBook | None = None,
        metrics: IntakeMetrics | None = None,
    ) -> None:
        self.metrics = metrics
        self.intake = intake
        self.webhook = webhook
        self.tracer = tracer
        self.api = api
        self.routes = list(routes)
        self.tokens = tokens or TokenBook()  # empty: no authentication (the intake then listens on loopback only)
        self._openapi: str | None = None

    def app(self) -> web.Application:
        middlewares: list[Any] = [_errors_as_json]
        if self.metrics is not None:
            middlewares.insert(0, self.metrics.middleware())  # outermost: counts the status the client gets
        if self.tokens:
            middlewares.append(auth_middleware(self.tokens))  # auth.py: bearer tokens on /v1/* and /ui/api/*
        app = web.Application(middlewares=middlewares, client_max_size=MAX_BODY_BYTES + 1)
        app.router.add_post("/v1/jobs", self.post_job)
        app.router.add_post("/webhooks/mlflow", self.post_mlflow)
        app.router.add_get("/healthz", self.health)
        app.router.add_get(openapi.PATH, self.openapi)
        if self.api is not None:
            self.api.add_routes(app)
        for add_routes in self.routes:
            add_routes(app)
        from .dashboard import mount_dashboard  # the web dashboard at /ui/ (docs/dashboard.md)

        mount_dashboard(app, self.intake.svc, self.tokens)
        return app

    async def health(self, request: web.Request) -> web.Response:
        return _json(200, {"ok": True, "mlflow": self.webhook is not None})

    async def openapi(self, request: web.Request) -> web.Response:
        if self._openapi is None:
            self._openapi = openapi.render()
        return web.Response(status=200, text=self._openapi, content_type="application/json")

    async def post_job(self, request: web.Request) -> web.Response:
        headers = caller_headers(request)
        body = await request.read()
        with self.tracer.start_as_current_span("POST /v1/jobs", kind=trace.SpanKind.SERVER) as span:
            try:
                caller = caller_of(headers)
            except TenancyError as exc:
                return error_response(exc.code, str(exc))
            outcome = await self.intake.submit(headers, body, caller, source="http")
            reply = outcome.reply
            if not reply.ok or outcome.status >= 400:
                # The refusal is on the job's record (a `rejected` event) under its id; the answer is only the error.
                code = SUBMIT_ERROR_CODES.get(outcome.status)
                return error_response(outcome.status, reply.error or "refused", code)
            span.set_attribute("oneplus.job_id", reply.job_id or "")
        answer = {"ok": True, "job_id": reply.job_id, "duplicate": reply.duplicate, "warnings": reply.warnings}
        return _json(outcome.status, answer)

    async def post_mlflow(self, request: web.Request) -> web.Response:
        if self.webhook is None:
            error = "MLflow webhooks are not configured on this intake: set ONEPLUS_MLFLOW_SECRET"
            return error_response(503, error, "not_configured")
        body = await request.read()
        with self.tracer.start_as_current_span("POST /webhooks/mlflow", kind=trace.SpanKind.SERVER):
            status, answer = await self.webhook.deliver(caller_headers(request), body)
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
        log.info("HTTP intake on http://%s:%d (/v1/jobs, /v1/nodes, /v1/queues, /openapi.json)", self.host, bound)
        return int(bound)

    async def stop(self) -> None:
        await self.runner.cleanup()
