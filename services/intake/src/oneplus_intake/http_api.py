"""The read/write HTTP API beside `POST /v1/jobs`: the ops subjects the CLI uses, over HTTP.

    GET    /v1/jobs          one page of jobs: state (repeatable or a comma list), since, user, team, limit, cursor
    GET    /v1/jobs/{id}     one job, live or archived
    DELETE /v1/jobs/{id}     cancel it: 202 with the state it had
    POST   /v1/jobs/{id}/signal  send its running processes a signal (scancel --signal): 202, the job goes on
    GET    /v1/reservations      every advance reservation with its state (anyone)
    POST   /v1/reservations      create one (nodes or a GPU count; a platform caller): 201 with what was stored
    DELETE /v1/reservations/{name}  delete one (a platform caller)
    GET    /v1/nodes         one page of nodes (the topology-registry's `node-list`)
    GET    /v1/queue         one page of squeue-like rows (the placement-solver's `queue-list`)
    GET    /v1/queues        every queue with its guarantee, use and fair share (the solver's `queues-list`)

The job endpoints are the intake's own ops handlers, called in process; nodes and queues are requests on the
owning service's ops subject. Either way an ops error keeps its code as the HTTP status (400, 403, 404, 409,
413...); nobody answering is 503, no answer in time 504. The team is the `Oneplus-Team` header's (or the `team`
parameter, which must agree with it), as for the NATS subjects. Every error is `{"ok": false, "code", "error"}`.
The OpenAPI document (openapi.py) describes all of it; `GET /openapi.json` serves it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from aiohttp import web
from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from oneplus_bus.service import OpsError, RawJson
from oneplus_bus.tenancy import REQUEST_INFO_HEADER, TEAM_HEADER, TenancyError
from oneplus_contracts import JobRecord, subjects
from opentelemetry import trace

OPS_QUEUES_LIST = f"{subjects.PREFIX}.ops.queues.list"
JOB_PAGE_MAX = 1000  # joblist.MAX_LIMIT
NODE_PAGE_MAX = 1000  # the topology-registry's MAX_PAGE
QUEUE_PAGE_MAX = 2000  # the placement-solver's QUEUE_PAGE_MAX
# Job ids are `j-` and hex; anything else names no job (and must never reach a subject filter as a wildcard).
JOB_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")
OPS_TIMEOUT_S = 5.0

# HTTP status → the `code` of an error answer.
ERROR_CODES: dict[int, str] = {
    400: "bad_request",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "too_large",
    422: "cannot_run",
    500: "internal",
    502: "bad_gateway",
    503: "unavailable",
    504: "timeout",
}


def error_code(status: int) -> str:
    return ERROR_CODES.get(status, f"http_{status}")


def json_response(status: int, body: Any) -> web.Response:
    if isinstance(body, RawJson):
        return web.Response(status=status, body=body.body, content_type="application/json")
    return web.Response(status=status, text=json.dumps(body), content_type="application/json")


def error_response(status: int, error: str, code: str | None = None) -> web.Response:
    """The one shape of every error answer: no job id, whatever went wrong."""
    return json_response(status, {"ok": False, "code": code or error_code(status), "error": error})


class ApiError(Exception):
    def __init__(self, status: int, error: str) -> None:
        super().__init__(error)
        self.status = status
        self.error = error


class JobOps(Protocol):
    """The intake's job ops handlers (IntakeService): a payload as on the NATS subject, and the caller's headers."""

    async def job_show(self, payload: dict[str, Any], headers: dict[str, str]) -> JobRecord: ...

    async def job_list(self, payload: dict[str, Any], headers: dict[str, str]) -> RawJson | dict[str, Any]: ...

    async def job_cancel(self, payload: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]: ...

    async def job_signal(self, payload: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]: ...

    async def reservation_create(self, payload: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]: ...

    async def reservation_list(self, payload: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]: ...

    async def reservation_delete(self, payload: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]: ...


def caller_headers(request: web.Request) -> dict[str, str]:
    # Nats-Request-Info is what the NATS server says about a caller; over HTTP it would be the caller's own claim.
    return {k: v for k, v in request.headers.items() if k.lower() != REQUEST_INFO_HEADER.lower()}


def _limit(request: web.Request, most: int) -> int | None:
    raw = request.query.get("limit")
    if raw is None or raw == "":
        return None
    try:
        limit = int(raw)
    except ValueError:
        raise ApiError(400, f"limit must be a whole number from 1 to {most}, got {raw[:64]!r}") from None
    if not 1 <= limit <= most:
        raise ApiError(400, f"limit must be a whole number from 1 to {most}, got {limit}")
    return limit


def _paging(request: web.Request, most: int) -> dict[str, Any]:
    payload: dict[str, Any] = {}
    limit = _limit(request, most)
    if limit is not None:
        payload["limit"] = limit
    cursor = request.query.get("cursor")
    if cursor:
        payload["cursor"] = cursor
    return payload


def _team(request: web.Request, payload: dict[str, Any]) -> dict[str, Any]:
    team = request.query.get("team")
    if team:
        payload["team"] = team
    return payload


def _job_id(request: web.Request) -> str:
    job_id = request.match_info["job_id"]
    if not JOB_ID.fullmatch(job_id):
        raise ApiError(404, f"no job {job_id[:128]!r}")
    return job_id


async def _json_body(request: web.Request) -> dict[str, Any]:
    """The request's JSON object; a 400 naming what is wrong otherwise."""
    raw = await request.read()
    try:
        body = json.loads(raw) if raw.strip() else {}
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"the body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ApiError(400, f"the body must be a JSON object, got {type(body).__name__}")
    return body


class JobsApi:
    """The routes of the HTTP API; `add_routes` puts them on an application."""

    def __init__(self, jobs: JobOps, nc: Client | None, tracer: trace.Tracer, timeout_s: float = OPS_TIMEOUT_S):
        self.jobs = jobs
        self.nc = nc
        self.tracer = tracer
        self.timeout_s = timeout_s

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/v1/jobs", self._route("GET /v1/jobs", self.list_jobs))
        app.router.add_get("/v1/jobs/{job_id}", self._route("GET /v1/jobs/{id}", self.show_job))
        app.router.add_delete("/v1/jobs/{job_id}", self._route("DELETE /v1/jobs/{id}", self.cancel_job))
        app.router.add_post("/v1/jobs/{job_id}/signal", self._route("POST /v1/jobs/{id}/signal", self.signal_job))
        app.router.add_get("/v1/reservations", self._route("GET /v1/reservations", self.list_reservations))
        app.router.add_post("/v1/reservations", self._route("POST /v1/reservations", self.create_reservation))
        app.router.add_delete(
            "/v1/reservations/{name}", self._route("DELETE /v1/reservations/{name}", self.delete_reservation)
        )
        app.router.add_get("/v1/nodes", self._route("GET /v1/nodes", self.list_nodes))
        app.router.add_get("/v1/queue", self._route("GET /v1/queue", self.queue_rows))
        app.router.add_get("/v1/queues", self._route("GET /v1/queues", self.list_queues))

    def _route(
        self, name: str, fn: Callable[[web.Request], Awaitable[tuple[int, Any]]]
    ) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handle(request: web.Request) -> web.Response:
            with self.tracer.start_as_current_span(name, kind=trace.SpanKind.SERVER) as span:
                try:
                    status, body = await fn(request)
                except ApiError as exc:
                    span.set_attribute("http.status_code", exc.status)
                    return error_response(exc.status, exc.error)
                except (OpsError, TenancyError) as exc:
                    span.set_attribute("http.status_code", exc.code)
                    return error_response(exc.code, str(exc))
                span.set_attribute("http.status_code", status)
                return json_response(status, body)

        return handle

    # --- jobs: the intake's own handlers ------------------------------------------------------------
    async def list_jobs(self, request: web.Request) -> tuple[int, Any]:
        payload = _team(request, _paging(request, JOB_PAGE_MAX))
        states = [s for raw in request.query.getall("state", []) for s in raw.split(",") if s.strip()]
        if states:
            payload["state"] = states
        for name in ("since", "user"):
            value = request.query.get(name)
            if value:
                payload[name] = value
        return 200, await self.jobs.job_list(payload, caller_headers(request))

    async def show_job(self, request: web.Request) -> tuple[int, Any]:
        payload = _team(request, {"job_id": _job_id(request)})
        rec = await self.jobs.job_show(payload, caller_headers(request))
        return 200, rec.model_dump(mode="json")

    async def cancel_job(self, request: web.Request) -> tuple[int, Any]:
        payload = _team(request, {"job_id": _job_id(request), "by": "http"})
        return 202, await self.jobs.job_cancel(payload, caller_headers(request))

    async def signal_job(self, request: web.Request) -> tuple[int, Any]:
        body = await _json_body(request)
        payload = _team(request, {"job_id": _job_id(request), "signal": body.get("signal"), "by": "http"})
        return 202, await self.jobs.job_signal(payload, caller_headers(request))

    # --- advance reservations: the intake's own handlers (reservations.py) ------------------------------------
    async def list_reservations(self, request: web.Request) -> tuple[int, Any]:
        return 200, await self.jobs.reservation_list({}, caller_headers(request))

    async def create_reservation(self, request: web.Request) -> tuple[int, Any]:
        return 201, await self.jobs.reservation_create(await _json_body(request), caller_headers(request))

    async def delete_reservation(self, request: web.Request) -> tuple[int, Any]:
        payload = {"name": request.match_info["name"][:128]}
        return 200, await self.jobs.reservation_delete(payload, caller_headers(request))

    # --- nodes and queues: the owning service's ops subject -----------------------------------------
    async def list_nodes(self, request: web.Request) -> tuple[int, Any]:
        payload = _paging(request, NODE_PAGE_MAX)
        payload.setdefault("limit", 100)  # always a page: every node at once may not fit in one NATS reply
        return 200, await self.ops(subjects.OPS_NODE_LIST, payload, request)

    async def queue_rows(self, request: web.Request) -> tuple[int, Any]:
        payload = _team(request, _paging(request, QUEUE_PAGE_MAX))
        cursor = payload.get("cursor")
        if cursor is not None and not (cursor.isascii() and cursor.isdigit()):
            raise ApiError(400, f"cursor must be the 'next' of the previous page, got {cursor[:64]!r}")
        return 200, await self.ops(subjects.OPS_QUEUE_LIST, payload, request)

    async def list_queues(self, request: web.Request) -> tuple[int, Any]:
        return 200, await self.ops(OPS_QUEUES_LIST, _team(request, {}), request)

    async def ops(self, subject: str, payload: dict[str, Any], request: web.Request) -> Any:
        """One ops request on NATS for the HTTP caller: its team goes along; an error answer keeps its code."""
        if self.nc is None:
            raise ApiError(503, f"this intake does not reach {subject}")
        team = next((v for k, v in request.headers.items() if k.lower() == TEAM_HEADER.lower()), None)
        headers = {TEAM_HEADER: team} if team else {}
        try:
            msg = await self.nc.request(subject, json.dumps(payload).encode(), timeout=self.timeout_s, headers=headers)
        except NoRespondersError:
            raise ApiError(503, f"no service answers on {subject}; is it running?") from None
        except NatsTimeout:
            raise ApiError(504, f"no answer on {subject} within {self.timeout_s:g}s") from None
        return unwrap(subject, msg.data, msg.headers)


def unwrap(subject: str, data: bytes, headers: Mapping[str, str] | None) -> Any:
    """The result of an ops answer, or an ApiError with its code (a 4xx stays itself; a 5xx is the service's)."""
    try:
        reply = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError):
        reply = None
    code = (headers or {}).get("Nats-Service-Error-Code")
    if isinstance(reply, dict) and reply.get("ok") is True and "result" in reply and not code:
        return reply["result"]
    error = reply.get("error") if isinstance(reply, dict) else None
    if not isinstance(error, str) or not error:
        error = (headers or {}).get("Nats-Service-Error") or f"unreadable answer on {subject}: {data[:200]!r}"
    status = int(code) if code and code.isdigit() and 400 <= int(code) <= 599 else 502
    if status >= 500:
        status, error = 502, f"{subject} failed: {error}"
    raise ApiError(status, error)
