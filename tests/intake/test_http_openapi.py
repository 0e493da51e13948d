"""The intake's OpenAPI document: generated from the contracts, checked in as proto/openapi.json (a stale copy
fails here: run `uv run task proto`), and describing every route the HTTP API has."""

from __future__ import annotations

import json
from pathlib import Path

import schemathesis
from oneplus_intake import openapi
from schemathesis.core.result import Ok

PROTO = Path(__file__).resolve().parents[2] / "proto" / "openapi.json"


def test_the_checked_in_openapi_document_is_fresh() -> None:
    assert PROTO.exists() and PROTO.read_text() == openapi.render(), "proto/openapi.json is stale: `uv run task proto`"


def test_the_document_is_openapi_3_1_with_every_operation_and_error_answer() -> None:
    doc = json.loads(openapi.render())
    assert doc["openapi"] == "3.1.0"
    ops = {(method.upper(), path) for path, item in doc["paths"].items() for method in item}
    assert ops == {
        ("GET", "/v1/jobs"),
        ("POST", "/v1/jobs"),
        ("GET", "/v1/jobs/{job_id}"),
        ("DELETE", "/v1/jobs/{job_id}"),
        ("POST", "/v1/jobs/{job_id}/signal"),
        ("GET", "/v1/reservations"),
        ("POST", "/v1/reservations"),
        ("DELETE", "/v1/reservations/{name}"),
        ("GET", "/v1/nodes"),
        ("GET", "/v1/queue"),
        ("GET", "/v1/queues"),
        ("GET", "/healthz"),
        ("GET", "/openapi.json"),
    }
    for path, item in doc["paths"].items():
        for method, op in item.items():
            for status, answer in op["responses"].items():
                ref = answer["content"]["application/json"]["schema"].get("$ref", "")
                assert (ref == "#/components/schemas/ErrorAnswer") == (int(status) >= 400), (method, path, status)
    error = doc["components"]["schemas"]["ErrorAnswer"]
    assert set(error["properties"]) == {"ok", "code", "error"} and error["additionalProperties"] is False
    assert {"JobRecord", "JobSpec", "NodeRecord", "AdvanceReservation", "AdvanceReservationRequest"} <= set(
        doc["components"]["schemas"]
    )
    # schemathesis reads it (every $ref resolves, every operation loads).
    schema = schemathesis.openapi.from_dict(doc)
    assert len([r for r in schema.get_all_operations() if isinstance(r, Ok)]) == len(ops)
