"""The OpenAPI 3.1 document of the intake's HTTP API, generated from the contracts' pydantic models.

Served at `GET /openapi.json`; a copy is checked in as `proto/openapi.json` (`task proto`, or
`python -m oneplus_intake.openapi --out proto/openapi.json`) and a test fails when that copy is stale.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Literal

from oneplus_contracts import SCHEMA_VERSION, JobRecord, JobSpec, JobState, NodeRecord
from oneplus_contracts.advance import AdvanceReservation, AdvanceReservationRequest
from pydantic import BaseModel, ConfigDict, Field, RootModel
from pydantic.json_schema import JsonSchemaMode, models_json_schema

from .http_api import JOB_PAGE_MAX, NODE_PAGE_MAX, QUEUE_PAGE_MAX

PATH = "/openapi.json"


class Answer(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ErrorAnswer(Answer):
    """Every error answer: never a job id."""

    ok: Literal[False]
    code: str = Field(description="A short name of the problem: bad_request, not_found, conflict, cannot_run...")
    error: str = Field(description="What is wrong, for a person to read")


class SubmitAnswer(Answer):
    """A job accepted (201), or a retry of a submission already accepted (200, `duplicate`)."""

    ok: Literal[True]
    job_id: str
    duplicate: bool = False
    warnings: list[str] = Field(default_factory=list)


class JobPage(Answer):
    jobs: list[JobRecord] = Field(description="Live jobs by submission time, then archived ones")
    next: str | None = Field(description="The `cursor` of the next page; null on the last")


class CancelAnswer(Answer):
    job_id: str
    state: JobState = Field(description="The job's state when its cancellation was requested")
    cancel_requested: bool


class SignalBody(Answer):
    signal: str = Field(description="The signal: USR1, SIGUSR1 or its number")


class SignalAnswer(Answer):
    job_id: str
    signal: str = Field(description="The signal sent, as SIGUSR1")
    nodes: list[str] = Field(description="The nodes it was sent to: the job's executors deliver it there")


class ReservationRow(Answer):
    """One advance reservation as `oneplus reservation list --json` shows it."""

    name: str
    state: Literal["WAITING", "ACTIVE", "ENDED"]
    nodes: str = Field(description="Its nodes, a Slurm hostlist")
    gpus: int | None = Field(description="The GPU count it was created for (its nodes were picked for it)")
    start: str = Field(description="When it starts (UTC, ISO-8601)")
    end: str = Field(description="When it ends (UTC, ISO-8601)")
    users: str
    teams: str
    accounts: str
    maint: bool


class Reservations(Answer):
    reservations: list[ReservationRow] = Field(description="By start time, then name")


class ReservationDeleted(Answer):
    name: str
    deleted: bool


class NodePage(Answer):
    nodes: list[NodeRecord] = Field(description="Nodes in name order")
    next: str | None = Field(description="The `cursor` of the next page; null on the last")


class QueueRow(Answer):
    """One squeue line: jobs holding GPUs by start time, then pending jobs in serving order."""

    job_id: str
    queue: str
    name: str
    user: str
    st: str = Field(description="Slurm's state code: R, PD, CG...")
    time: str = Field(description="Time running, as squeue writes it")
    gpus: str
    where: str = Field(description="The nodes (a Slurm hostlist), or the pending reason in parentheses")
    reason: str | None
    message: str


class QueueRows(Answer):
    rows: list[QueueRow]
    next: str | None = Field(description="The `cursor` of the next page; null on the last")


class QueueUse(Answer):
    """One queue of the tree (organisations before their teams): guarantee, use, and fair share."""

    queue: str
    parent: str | None
    depth: int = Field(description="0 for an organisation")
    guarantee_gpus: float
    limit_gpus: float | None = Field(description="null: no borrow limit")
    used_gpus: float
    borrowed_gpus: float
    pending_jobs: int
    pending_gpus: float
    fairshare: float | None = Field(description="The Fair-Tree factor of a leaf queue; null for an organisation")
    level_fs: float | None = Field(description="Its share over its usage among its siblings; null when it used none")
    usage_gpu_hours: float
    weight: float
    placement: str = Field(description="The queue's placement policy: best-fit or fgd")
    queueing: str = Field(description="The queue's queueing strategy: best-effort-fifo or strict-fifo")


class Queues(RootModel[list[QueueUse]]):
    pass


class Health(Answer):
    ok: bool
    mlflow: bool = Field(description="Whether MLflow webhooks are configured")


class Document(RootModel[dict[str, Any]]):
    """The OpenAPI document itself."""


MODELS: list[tuple[type[BaseModel], JsonSchemaMode]] = [
    (JobSpec, "validation"),
    (SubmitAnswer, "serialization"),
    (ErrorAnswer, "serialization"),
    (JobPage, "serialization"),
    (JobRecord, "serialization"),
    (CancelAnswer, "serialization"),
    (SignalBody, "validation"),
    (SignalAnswer, "serialization"),
    (AdvanceReservationRequest, "validation"),
    (AdvanceReservation, "serialization"),
    (Reservations, "serialization"),
    (ReservationDeleted, "serialization"),
    (NodePage, "serialization"),
    (QueueRows, "serialization"),
    (Queues, "serialization"),
    (Health, "serialization"),
    (Document, "serialization"),
]


def _param(name: str, where: str, description: str, schema: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "in": where,
        "description": description,
        "required": where == "path",
        "schema": schema,
        **extra,
    }


TEAM_HEADER = _param(
    "Oneplus-Team",
    "header",
    "With a platform token (or on a loopback intake without tokens): the team the request acts for; without it the "
    "caller is an operator who sees every team. With a team's token the team is the token's: a header naming "
    "another is 403",
    {"type": "string"},
)
TEAM_QUERY = _param(
    "team", "query", "The team, as the header (or the token) says it: they must agree", {"type": "string"}
)
BEARER = "bearer"
SECURED: list[dict[str, list[str]]] = [{BEARER: []}]
SECURITY_SCHEMES = {
    BEARER: {
        "type": "http",
        "scheme": "bearer",
        "description": (
            "A team's token (the team is the token's) or a platform token (acts for the team `Oneplus-Team` "
            "names, or every team), from ONEPLUS_HTTP_TOKENS_FILE / ONEPLUS_HTTP_TOKENS / ONEPLUS_HTTP_ADMIN_TOKEN. "
            "An intake without tokens listens on loopback only and asks for none."
        ),
    }
}
JOB_ID = _param("job_id", "path", "The job's id (`j-` and twelve hex digits)", {"type": "string"})


def _paging(most: int, what: str) -> list[dict[str, Any]]:
    return [
        _param(
            "limit",
            "query",
            f"At most this many {what} in the page",
            {"type": "integer", "minimum": 1, "maximum": most},
        ),
        _param("cursor", "query", "The `next` of the previous page", {"type": "string"}),
    ]


def document() -> dict[str, Any]:
    refs, defs = models_json_schema(MODELS, ref_template="#/components/schemas/{model}")

    def ref(model: type[BaseModel]) -> dict[str, Any]:
        mode = next(m for cls, m in MODELS if cls is model)
        return refs[(model, mode)]

    def answer(model: type[BaseModel], description: str) -> dict[str, Any]:
        return {"description": description, "content": {"application/json": {"schema": ref(model)}}}

    def errors(*statuses: int) -> dict[str, Any]:
        why = {
            400: "A parameter or the body is wrong, or the header's team and the `team` parameter disagree",
            401: "No bearer token, or an unknown one (`WWW-Authenticate: Bearer`)",
            403: "The job, the `Oneplus-Team` header or the `team` parameter names another team than the token's; "
            "or a team token creates or deletes a reservation (an operator's)",
            404: "No such job (another team's job does not exist, as far as the caller knows), or reservation",
            409: "The job has already ended (or, for a signal, is not running); a reservation overlaps another on "
            "the same nodes, its name is taken, or the cluster cannot hold its GPUs then",
            413: "The body is too large",
            422: "The job cannot run here (no such queue, more GPUs than the cluster has...)",
            503: "The service that answers this (topology-registry, placement-solver) is not running",
            504: "The service that answers this did not answer in time",
        }
        return {str(s): answer(ErrorAnswer, why[s]) for s in statuses}

    remote = errors(400, 401, 403, 503, 504)
    paths: dict[str, Any] = {
        "/v1/jobs": {
            "get": {
                "operationId": "listJobs",
                "summary": "One page of the caller's jobs: live ones first, then the archive",
                "parameters": [
                    _param(
                        "state",
                        "query",
                        "Job states or Slurm codes (RUNNING, PD...), repeated or as a comma list; ALL for every one",
                        {"type": "array", "items": {"type": "string"}},
                        style="form",
                        explode=True,
                    ),
                    _param(
                        "since",
                        "query",
                        "Jobs that had not ended by then: epoch seconds or an ISO-8601 time (UTC without a zone)",
                        {"type": "string"},
                    ),
                    _param("user", "query", "Jobs of this user only", {"type": "string"}),
                    TEAM_QUERY,
                    *_paging(JOB_PAGE_MAX, "jobs"),
                    TEAM_HEADER,
                ],
                "security": SECURED,
                "responses": {"200": answer(JobPage, "One page of jobs"), **errors(400, 401, 403)},
            },
            "post": {
                "operationId": "submitJob",
                "summary": "Submit a job: a JobSpec (JSON or YAML) or a CloudEvent carrying one",
                "parameters": [
                    _param(
                        "Idempotency-Key",
                        "header",
                        "Names the submission: a retry with the same key is the same job (200, `duplicate`)",
                        {"type": "string"},
                    ),
                    TEAM_HEADER,
                ],
                "security": SECURED,
                "requestBody": {"required": True, "content": {"application/json": {"schema": ref(JobSpec)}}},
                "responses": {
                    "201": answer(SubmitAnswer, "Accepted: a new job"),
                    "200": answer(SubmitAnswer, "A retry of a submission already accepted: the same job"),
                    **errors(400, 401, 403, 413, 422),
                },
            },
        },
        "/v1/jobs/{job_id}": {
            "get": {
                "operationId": "showJob",
                "summary": "One job, live or archived",
                "parameters": [JOB_ID, TEAM_QUERY, TEAM_HEADER],
                "security": SECURED,
                "responses": {"200": answer(JobRecord, "The job's record"), **errors(400, 401, 403, 404)},
            },
            "delete": {
                "operationId": "cancelJob",
                "summary": "Cancel a job: its owner stops it and frees its GPUs",
                "parameters": [JOB_ID, TEAM_QUERY, TEAM_HEADER],
                "security": SECURED,
                "responses": {
                    "202": answer(CancelAnswer, "Cancellation requested"),
                    **errors(400, 401, 403, 404, 409),
                },
            },
        },
        "/v1/jobs/{job_id}/signal": {
            "post": {
                "operationId": "signalJob",
                "summary": "Send a running job's processes a signal (scancel --signal): its batch script, ranks and "
                "running srun steps' tasks get it; the job goes on",
                "parameters": [JOB_ID, TEAM_QUERY, TEAM_HEADER],
                "security": SECURED,
                "requestBody": {"required": True, "content": {"application/json": {"schema": ref(SignalBody)}}},
                "responses": {
                    "202": answer(SignalAnswer, "The signal was sent to the job's nodes"),
                    **errors(400, 401, 403, 404, 409),
                },
            },
        },
        "/v1/reservations": {
            "get": {
                "operationId": "listReservations",
                "summary": "Every advance reservation with its state (WAITING, ACTIVE, ENDED)",
                "parameters": [TEAM_HEADER],
                "security": SECURED,
                "responses": {"200": answer(Reservations, "The reservations"), **errors(401)},
            },
            "post": {
                "operationId": "createReservation",
                "summary": "Set nodes, or whole nodes holding a GPU count, aside for a window (scontrol create "
                "reservation); an operator's (a platform token)",
                "security": SECURED,
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": ref(AdvanceReservationRequest)}},
                },
                "responses": {
                    "201": answer(AdvanceReservation, "Created: what was stored, its nodes picked for a GPU count"),
                    **errors(400, 401, 403, 409),
                },
            },
        },
        "/v1/reservations/{name}": {
            "delete": {
                "operationId": "deleteReservation",
                "summary": "Delete an advance reservation; an operator's (a platform token)",
                "parameters": [_param("name", "path", "The reservation's name", {"type": "string"})],
                "security": SECURED,
                "responses": {"200": answer(ReservationDeleted, "Deleted"), **errors(401, 403, 404)},
            },
        },
        "/v1/nodes": {
            "get": {
                "operationId": "listNodes",
                "summary": "One page of the cluster's nodes (100 unless `limit` says otherwise)",
                "parameters": [*_paging(NODE_PAGE_MAX, "nodes"), TEAM_HEADER],
                "security": SECURED,
                "responses": {"200": answer(NodePage, "One page of nodes"), **remote},
            }
        },
        "/v1/queue": {
            "get": {
                "operationId": "listQueueRows",
                "summary": "The queue as squeue shows it: running jobs, then pending ones with their reason",
                "parameters": [*_paging(QUEUE_PAGE_MAX, "rows"), TEAM_QUERY, TEAM_HEADER],
                "security": SECURED,
                "responses": {"200": answer(QueueRows, "One page of rows"), **remote},
            }
        },
        "/v1/queues": {
            "get": {
                "operationId": "listQueues",
                "summary": "Every queue: guarantee, limit, use, pending work and fair share",
                "parameters": [TEAM_QUERY, TEAM_HEADER],
                "security": SECURED,
                "responses": {"200": answer(Queues, "The queues, organisations before their teams"), **remote},
            }
        },
        "/healthz": {
            "get": {
                "operationId": "health",
                "summary": "Whether the intake answers (no token needed)",
                "security": [],
                "responses": {"200": answer(Health, "The intake is up")},
            }
        },
        PATH: {
            "get": {
                "operationId": "openapi",
                "summary": "This document (no token needed)",
                "security": [],
                "responses": {"200": answer(Document, "The OpenAPI 3.1 document of this API")},
            }
        },
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "OnePlus intake",
            "version": f"{SCHEMA_VERSION}.0.0",
            "description": (
                "Submit, list, show and cancel jobs, and see nodes and queues, over HTTP: the ops subjects of the "
                "`oneplus` CLI. Every error is `{ok: false, code, error}`. With tokens configured every `/v1` "
                "operation needs `Authorization: Bearer <token>` and the team is the token's. See docs/http-api.md."
            ),
        },
        "servers": [{"url": "http://127.0.0.1:8080", "description": "The dev stack's intake"}],
        "paths": paths,
        "components": {"schemas": defs["$defs"], "securitySchemes": SECURITY_SCHEMES},
    }


def render() -> str:
    """The document's text, exactly as checked in at proto/openapi.json."""
    return json.dumps(document(), indent=2, sort_keys=True) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, default=Path("proto/openapi.json"))
    args = ap.parse_args()
    args.out.write_text(render(), encoding="utf-8")
    print(args.out)


if __name__ == "__main__":
    main()
