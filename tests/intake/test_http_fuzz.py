"""schemathesis against a running intake (its own process, real NATS, the job owner and the topology-registry
beside it): whatever it sends, no 5xx, and every answer conforms to the OpenAPI document (status, content type,
body). The intake takes bearer tokens; the cases carry the platform token, so that the `Oneplus-Team` header the
fuzzer sends picks the team (a team token would turn most cases into 403s).
Bounded: ONEPLUS_FUZZ_EXAMPLES (default 30 per operation, nine operations) raises it for a long hunt."""

from __future__ import annotations

import asyncio
import json
import os
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from http_platform import HttpPlatform, start_platform
from hypothesis import HealthCheck, Phase, settings
from oneplus_intake import openapi
from requests.structures import CaseInsensitiveDict
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

EXAMPLES = int(os.environ.get("ONEPLUS_FUZZ_EXAMPLES", "30"))
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
schema = schemathesis.openapi.from_dict(openapi.document())
PLATFORM_TOKEN = "fuzz-platform-token-0123456789"
TOKENS = {"ONEPLUS_HTTP_ADMIN_TOKEN": PLATFORM_TOKEN, "ONEPLUS_HTTP_TOKENS": "nlp=fuzz-nlp-token-0123456789"}


@pytest.fixture(scope="module")
def platform(servers, tmp_path_factory) -> Iterator[HttpPlatform]:  # type: ignore[no-untyped-def]
    workdir = Path(tmp_path_factory.mktemp("http-fuzz"))
    # Its own event loop in a thread: the cases are synchronous (requests), the session's loop is not running. The
    # thread lives as long as the processes it started: they die with the thread that spawned them (PDEATHSIG).
    pool = ThreadPoolExecutor(1)
    try:
        p = pool.submit(asyncio.run, start_platform(servers.nats_url, servers.redis_url, workdir, env=TOKENS)).result(
            120
        )
        try:
            yield p
        finally:
            p.stop()
    finally:
        pool.shutdown()


def test_the_served_document_is_the_generated_one(platform: HttpPlatform) -> None:
    with urllib.request.urlopen(platform.intake.base_url + openapi.PATH, timeout=10) as resp:
        assert resp.headers["Content-Type"].startswith("application/json")
        assert json.loads(resp.read()) == json.loads(openapi.render())


@schema.parametrize()
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    phases=[Phase.explicit, Phase.generate],
    derandomize=True,
)
def test_every_answer_conforms_and_none_is_a_5xx(case: schemathesis.Case[Any], platform: HttpPlatform) -> None:
    # In the case itself: schemathesis drops an Authorization header passed to call() on a secured operation
    case.headers = CaseInsensitiveDict({**dict(case.headers or {}), "Authorization": f"Bearer {PLATFORM_TOKEN}"})
    response = case.call(base_url=platform.intake.base_url, timeout=30)
    case.validate_response(response, checks=CHECKS)
    assert response.status_code != 401, response.text  # the token went along: the cases reach the API
    assert platform.intake.alive(), platform.intake.logs()[-2000:]
