"""The HTTP intake's bearer tokens (oneplus_intake.auth): every refusal, in process (a fake intake that records the
team each request arrives with) and end to end (an intake process, its job owner and the registry on real NATS)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from http_platform import HttpPlatform, start_platform
from intake_process import IntakeProcess, fresh_bus
from nats.errors import NoRespondersError
from oneplus_bus.service import OpsError
from oneplus_bus.tenancy import Caller, caller_of
from oneplus_contracts import JobRecord, SubmitReply
from oneplus_intake import openapi
from oneplus_intake.auth import COOKIE, Identity, TokenBook, is_loopback, token_hash
from oneplus_intake.http_api import JobsApi
from oneplus_intake.settings import IntakeSettings, SettingsError
from oneplus_intake.submissions import Outcome
from oneplus_intake.web import IntakeHttp
from oneplus_jobformats.mlflow import sign
from opentelemetry import trace

NLP = "nlp-token-0123456789abcdef"
VISION = "vision-token-0123456789abcdef"
ADMIN = "platform-token-0123456789abcdef"
TOKENS = f"nlp={NLP},vision={VISION}"


# --- the token book ------------------------------------------------------------------------------------------------


def test_tokens_from_a_yaml_file_of_hashes_and_tokens_the_variable_and_the_admin_token(tmp_path: Path) -> None:
    path = tmp_path / "tokens.yaml"
    path.write_text(f'nlp:\n  - {token_hash(NLP)}\n  - another-nlp-token-0000\n"*": [{token_hash(ADMIN)}]\n')
    env = {
        "ONEPLUS_HTTP_TOKENS_FILE": str(path),
        "ONEPLUS_HTTP_TOKENS": f"vision={token_hash(VISION)}",
        "ONEPLUS_HTTP_ADMIN_TOKEN": "second-platform-token-00",
    }
    book = IntakeSettings.from_env(env).http_tokens
    assert len(book) == 5 and book.teams == {"nlp", "vision", None}
    assert book.identify(NLP) == Identity("nlp") and book.identify("another-nlp-token-0000") == Identity("nlp")
    assert book.identify(VISION) == Identity("vision")
    assert book.identify(ADMIN) == Identity(None) and book.identify("second-platform-token-00") == Identity(None)
    assert book.identify("nope") is None and book.identify(token_hash(NLP)) is None  # a hash is not a token
    assert book.identify(NLP.upper()) is None


def test_tokens_from_a_json_file(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps({"nlp": [token_hash(NLP).upper().replace("SHA256:", "sha256:")], "*": ADMIN}))
    book = TokenBook.from_env({"ONEPLUS_HTTP_TOKENS_FILE": str(path)})
    assert book.identify(NLP) == Identity("nlp") and book.identify(ADMIN) == Identity(None)


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ("nlp: [short]", "at least 16 characters"),
        ("nlp: ['sha256:abc']", "64 hex digits"),
        ("'bad team!': [nlp-token-0123456789abcdef]", "is not a team name"),
        ("- nlp-token-0123456789abcdef", "must map each team"),
        ("nlp: {a: b}", "must have a list of strings"),
        ("nlp: [nlp-token-0123456789abcdef]\nvision: [nlp-token-0123456789abcdef]", "one token is configured for two"),
        ("nlp: [unterminated", "not YAML"),
    ],
)
def test_a_tokens_file_that_cannot_be_used_is_refused_without_showing_a_token(
    tmp_path: Path, content: str, says: str
) -> None:
    path = tmp_path / "tokens.yaml"
    path.write_text(content)
    with pytest.raises(SettingsError, match=says) as err:
        IntakeSettings.from_env({"ONEPLUS_HTTP_TOKENS_FILE": str(path)})
    assert "0123456789abcdef" not in str(err.value)


def test_an_unreadable_tokens_file_and_bad_pairs_are_refused(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="cannot read it"):
        IntakeSettings.from_env({"ONEPLUS_HTTP_TOKENS_FILE": str(tmp_path / "absent.yaml")})
    with pytest.raises(SettingsError, match="entry 2 is not team=token"):
        IntakeSettings.from_env({"ONEPLUS_HTTP_TOKENS": f"nlp={NLP},{VISION}"})
    with pytest.raises(SettingsError, match="ONEPLUS_HTTP_ADMIN_TOKEN: a token must be at least"):
        IntakeSettings.from_env({"ONEPLUS_HTTP_ADMIN_TOKEN": "admin"})
    with pytest.raises(SettingsError, match="ONEPLUS_HTTP_INSECURE='maybe'"):
        IntakeSettings.from_env({"ONEPLUS_HTTP_INSECURE": "maybe"})


def test_without_tokens_only_loopback_listens_unless_insecure_says_so() -> None:
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "10.0.0.5", "intake.example.com"))
    assert IntakeSettings.from_env({}).check_listen() is None
    with pytest.raises(
        SettingsError, match=r"ONEPLUS_HTTP_HOST=0\.0\.0\.0 is not a loopback address and no HTTP tokens"
    ):
        IntakeSettings.from_env({"ONEPLUS_HTTP_HOST": "0.0.0.0"}).check_listen()
    warning = IntakeSettings.from_env({"ONEPLUS_HTTP_HOST": "0.0.0.0", "ONEPLUS_HTTP_INSECURE": "1"}).check_listen()
    assert warning and "WITHOUT authentication" in warning
    assert (
        IntakeSettings.from_env({"ONEPLUS_HTTP_HOST": "0.0.0.0", "ONEPLUS_HTTP_TOKENS": TOKENS}).check_listen() is None
    )
    assert IntakeSettings.from_env({"ONEPLUS_HTTP_HOST": "0.0.0.0", "ONEPLUS_HTTP_PORT": "off"}).check_listen() is None


# --- the middleware, in process ------------------------------------------------------------------------------------


class FakeJobs:
    """The intake's job ops as JobsApi calls them: each answer says which team the request arrived as."""

    async def job_list(self, payload: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
        return {"jobs": [], "next": None, "team": caller_of(headers, payload.get("team")).team}

    async def job_show(self, payload: dict[str, Any], headers: dict[str, str]) -> JobRecord:
        # No job exists behind this fake: what the intake answers for an unknown one.
        raise OpsError(f"no job {payload.get('job_id')!r}", 404)

    async def job_cancel(self, payload: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
        team = caller_of(headers, payload.get("team")).team
        return {"job_id": payload["job_id"], "state": "RUNNING", "cancel_requested": True, "team": team}

    async def job_signal(self, payload: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
        team = caller_of(headers, payload.get("team")).team
        return {"job_id": payload["job_id"], "signal": payload["signal"], "nodes": [], "team": team}

    async def reservation_list(self, payload: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
        return {"reservations": [], "team": caller_of(headers).team}

    async def reservation_create(self, payload: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
        return {"name": payload.get("name"), "team": caller_of(headers).team}

    async def reservation_delete(self, payload: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
        return {"name": payload["name"], "deleted": True, "team": caller_of(headers).team}


class NobodyAnswers:
    """The dashboard's bus: nobody answers its requests (503), which is past the authentication this file tests."""

    @property
    def nc(self) -> NobodyAnswers:
        return self

    async def request(self, *args: Any, **kwargs: Any) -> Any:
        raise NoRespondersError


class FakeIntake:
    def __init__(self) -> None:
        self.callers: list[Caller] = []
        self.svc = NobodyAnswers()

    async def submit(self, headers: Any, body: bytes, caller: Caller, source: str = "nats") -> Outcome:
        self.callers.append(caller)
        return Outcome(SubmitReply(ok=True, job_id="j-000000000001"), 201)


@pytest.fixture
async def client() -> AsyncIterator[tuple[TestClient[web.Request, web.Application], FakeIntake]]:
    book = TokenBook.from_env({"ONEPLUS_HTTP_TOKENS": TOKENS, "ONEPLUS_HTTP_ADMIN_TOKEN": ADMIN})
    intake = FakeIntake()
    tracer = trace.get_tracer("test")
    api = JobsApi(FakeJobs(), None, tracer)
    app = IntakeHttp(intake, None, tracer, api=api, tokens=book).app()  # type: ignore[arg-type]
    async with TestClient(TestServer(app)) as c:
        yield c, intake


def bearer(token: str, **headers: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", **{k.replace("_", "-"): v for k, v in headers.items()}}


SECURED = [
    ("GET", "/v1/jobs"),
    ("POST", "/v1/jobs"),
    ("GET", "/v1/jobs/j-000000000001"),
    ("DELETE", "/v1/jobs/j-000000000001"),
    ("POST", "/v1/jobs/j-000000000001/signal"),
    ("GET", "/v1/reservations"),
    ("POST", "/v1/reservations"),
    ("DELETE", "/v1/reservations/maint"),
    ("GET", "/v1/nodes"),
    ("GET", "/v1/queue"),
    ("GET", "/v1/queues"),
    ("GET", "/v1/no-such-path"),
    ("GET", "/ui/api/cluster"),
    ("GET", "/ui/api/queue"),
    ("GET", "/ui/api/job/j-000000000001"),
]


async def test_every_v1_and_dashboard_endpoint_refuses_a_missing_malformed_or_unknown_token(client: Any) -> None:
    c, intake = client
    for method, path in SECURED:
        for headers, says, invalid in [
            ({}, "needs 'Authorization: Bearer <token>'", False),
            ({"Oneplus-Team": "nlp"}, "needs 'Authorization: Bearer <token>'", False),  # the header alone is nobody
            ({"Authorization": f"Basic {NLP}"}, "must be 'Bearer <token>'", True),
            ({"Authorization": "Bearer"}, "must be 'Bearer <token>'", True),
            (bearer("not-a-token-0123456789"), "unknown token", True),
            (bearer(token_hash(NLP)), "unknown token", True),
        ]:
            r = await c.request(method, path, headers=headers, data=b"{}")
            answer = await r.json()
            assert r.status == 401, (method, path, headers, answer)
            assert answer == {"ok": False, "code": "unauthorized", "error": answer["error"]} and says in answer["error"]
            challenge = r.headers["WWW-Authenticate"]
            assert challenge.startswith('Bearer realm="oneplus"')
            assert ('error="invalid_token"' in challenge) is invalid
    assert intake.callers == []


async def test_health_openapi_and_the_dashboard_page_stay_open(client: Any) -> None:
    c, _ = client
    r = await c.get("/healthz")
    assert r.status == 200 and (await r.json())["ok"] is True
    r = await c.get(openapi.PATH)
    assert r.status == 200 and json.loads(await r.text()) == openapi.document()
    r = await c.get("/ui/")
    assert r.status == 200 and 'action="/ui/login"' in await r.text()  # asks for a token
    r = await c.get("/ui/static/dashboard.js")
    assert r.status == 200


async def test_the_team_is_the_tokens_and_a_header_or_parameter_naming_another_is_403(client: Any) -> None:
    c, intake = client
    r = await c.get("/v1/jobs", headers=bearer(NLP))
    assert r.status == 200 and (await r.json())["team"] == "nlp"
    r = await c.get("/v1/jobs?team=nlp", headers=bearer(NLP, Oneplus_Team="nlp"))
    assert r.status == 200 and (await r.json())["team"] == "nlp"
    r = await c.delete("/v1/jobs/j-000000000001", headers=bearer(VISION))
    assert r.status == 202 and (await r.json())["team"] == "vision"
    r = await c.post("/v1/jobs", headers=bearer(VISION), data=b"{}")
    assert r.status == 201 and intake.callers == [Caller(team="vision")]
    for path, headers in [
        ("/v1/jobs", bearer(NLP, Oneplus_Team="vision")),
        ("/v1/jobs?team=vision", bearer(NLP)),
        ("/v1/jobs?team=nlp&team=vision", bearer(NLP)),
        ("/v1/queues", bearer(NLP, Oneplus_Team="vision")),
    ]:
        r = await c.get(path, headers=headers)
        answer = await r.json()
        assert r.status == 403 and answer["code"] == "wrong_team" and "the token is team 'nlp'" in answer["error"]
    r = await c.post("/v1/jobs", headers=bearer(NLP, Oneplus_Team="vision"), data=b"{}")
    assert r.status == 403 and intake.callers == [Caller(team="vision")]  # never reached the intake
    # The new routes take the token's team the same way (the intake then refuses a team's reservation writes).
    r = await c.post("/v1/jobs/j-000000000001/signal", headers=bearer(NLP), json={"signal": "USR1"})
    assert r.status == 202 and (await r.json())["team"] == "nlp"
    r = await c.post("/v1/reservations", headers=bearer(VISION), json={"name": "r"})
    assert r.status == 201 and (await r.json()) == {"name": "r", "team": "vision"}
    r = await c.delete("/v1/reservations/r", headers=bearer(ADMIN))
    assert r.status == 200 and (await r.json())["team"] is None
    r = await c.post("/v1/reservations", headers=bearer(ADMIN), data=b"[1, 2]")
    answer = await r.json()
    assert (r.status, answer["error"]) == (400, "the body must be a JSON object, got list")


async def test_a_platform_token_acts_for_the_team_its_header_names_or_for_every_team(client: Any) -> None:
    c, intake = client
    r = await c.get("/v1/jobs", headers=bearer(ADMIN))
    assert r.status == 200 and (await r.json())["team"] is None  # an operator: every team
    r = await c.get("/v1/jobs", headers=bearer(ADMIN, Oneplus_Team="vision"))
    assert r.status == 200 and (await r.json())["team"] == "vision"
    r = await c.post("/v1/jobs", headers=bearer(ADMIN, Oneplus_Team="nlp"), data=b"{}")
    assert r.status == 201 and intake.callers == [Caller(team="nlp")]


async def test_the_dashboard_takes_a_platform_token_from_the_header_or_the_login_cookie(client: Any) -> None:
    c, _ = client
    r = await c.get("/ui/api/cluster", headers=bearer(NLP))
    assert r.status == 403 and "needs a platform token" in (await r.json())["error"]
    r = await c.get("/ui/api/cluster", headers=bearer(ADMIN))
    assert r.status == 503  # through to the dashboard, whose bus has nobody to answer

    r = await c.post("/ui/login", data={"token": "not-a-token-0123456789"}, allow_redirects=False)
    assert r.status == 401 and "Unknown token" in await r.text() and COOKIE not in r.cookies
    r = await c.post("/ui/login", data={"token": NLP}, allow_redirects=False)
    assert r.status == 403 and "a team token" in await r.text() and COOKIE not in r.cookies
    r = await c.post("/ui/login", data={}, allow_redirects=False)
    assert r.status == 401
    r = await c.post("/ui/login", data={"token": ADMIN}, allow_redirects=False)
    assert r.status == 303 and r.headers["Location"] == "/ui/"
    cookie = r.cookies[COOKIE]
    assert cookie.value == ADMIN and cookie["httponly"] and cookie["samesite"] == "Strict" and cookie["path"] == "/ui"

    jar = {COOKIE: ADMIN}
    r = await c.get("/ui/", cookies=jar)
    assert r.status == 200 and 'action="/ui/login"' not in await r.text()  # the dashboard itself
    r = await c.get("/ui/api/cluster", cookies=jar)
    assert r.status == 503
    r = await c.get("/ui/api/cluster", cookies={COOKIE: NLP})
    assert r.status == 403
    r = await c.get("/ui/api/cluster", cookies={COOKIE: "not-a-token-0123456789"})
    assert r.status == 401
    r = await c.get("/v1/jobs", cookies=jar)  # the cookie is the dashboard's: the API wants the header (no CSRF)
    assert r.status == 401
    r = await c.post("/ui/logout", allow_redirects=False)
    assert r.status == 303 and r.cookies[COOKIE].value == ""


# --- end to end: an intake process with tokens ---------------------------------------------------------------------


@pytest.fixture(scope="module")
async def platform(servers, tmp_path_factory) -> AsyncIterator[HttpPlatform]:  # type: ignore[no-untyped-def]
    workdir = Path(tmp_path_factory.mktemp("http-auth"))
    (workdir / "tokens.yaml").write_text(f"nlp: [{token_hash(NLP)}]\nvision: [{token_hash(VISION)}]\n")
    env = {
        "ONEPLUS_HTTP_TOKENS_FILE": str(workdir / "tokens.yaml"),
        "ONEPLUS_HTTP_ADMIN_TOKEN": ADMIN,
        "ONEPLUS_MLFLOW_SECRET": "whsec-0123456789",
    }
    p = await start_platform(servers.nats_url, servers.redis_url, workdir, env=env)
    try:
        yield p
    finally:
        p.stop()


async def call(p: HttpPlatform, method: str, path: str, body: Any = None, **headers: str) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else b"" if body is None else json.dumps(body).encode()
    hdrs = {k.replace("_", "-"): v for k, v in headers.items()}
    if body is not None:
        hdrs.setdefault("Content-Type", "application/json")
    return await asyncio.to_thread(p.call, method, path, data, hdrs)


SPEC = {"resources": {"gpus": 1}, "command": ["python", "t.py"]}


async def test_a_team_token_submits_sees_and_cancels_its_own_teams_jobs_only(platform: HttpPlatform) -> None:
    nlp, vision = f"Bearer {NLP}", f"Bearer {VISION}"
    status, answer = await call(platform, "POST", "/v1/jobs", {"name": "a", **SPEC}, Authorization=nlp)
    assert status == 201, answer
    job_id = answer["job_id"]
    status, rec = await call(platform, "GET", f"/v1/jobs/{job_id}", Authorization=nlp)
    assert status == 200 and rec["spec"]["team"] == "nlp"

    status, answer = await call(platform, "POST", "/v1/jobs", {"name": "b", **SPEC})
    assert status == 401 and answer["code"] == "unauthorized"
    status, answer = await call(platform, "POST", "/v1/jobs", {"name": "b", **SPEC}, Oneplus_Team="nlp")
    assert status == 401  # the header alone names nobody
    body = {"name": "b", "team": "vision", **SPEC}
    status, answer = await call(platform, "POST", "/v1/jobs", body, Authorization=nlp)
    assert status == 403 and answer["code"] == "wrong_team", answer  # the job names another team than the token
    body = {"name": "b", **SPEC}
    status, answer = await call(platform, "POST", "/v1/jobs", body, Authorization=nlp, Oneplus_Team="vision")
    assert status == 403 and answer["code"] == "wrong_team", answer

    # another team's token: the job does not exist
    assert (await call(platform, "GET", f"/v1/jobs/{job_id}", Authorization=vision))[0] == 404
    assert (await call(platform, "DELETE", f"/v1/jobs/{job_id}", Authorization=vision))[0] == 404
    status, page = await call(platform, "GET", "/v1/jobs?state=ALL", Authorization=vision)
    assert status == 200 and job_id not in {j["job_id"] for j in page["jobs"]}
    status, page = await call(platform, "GET", "/v1/jobs?state=ALL", Authorization=nlp)
    assert status == 200 and job_id in {j["job_id"] for j in page["jobs"]}
    assert {j["spec"]["team"] for j in page["jobs"]} == {"nlp"}

    # the platform token sees it, as the operator
    status, page = await call(platform, "GET", "/v1/jobs?state=ALL", Authorization=f"Bearer {ADMIN}")
    assert status == 200 and job_id in {j["job_id"] for j in page["jobs"]}
    status, answer = await call(platform, "DELETE", f"/v1/jobs/{job_id}", Authorization=nlp)
    assert status == 202 and answer["cancel_requested"] is True


async def test_nodes_and_queues_need_a_token_and_the_webhook_its_signature(platform: HttpPlatform) -> None:
    for path in ("/v1/nodes", "/v1/queue", "/v1/queues"):
        assert (await call(platform, "GET", path))[0] == 401
        status, answer = await call(platform, "GET", path, Authorization=f"Bearer {VISION}")
        assert status == 200, (path, answer)
    status, answer = await call(platform, "GET", "/healthz")
    assert status == 200 and answer["mlflow"] is True
    # MLflow cannot send a bearer token: the webhook is its HMAC signature's, and a bad signature is refused
    body = json.dumps({"entity": "model_version", "action": "created", "data": {}}).encode()
    now = str(int(time.time()))
    hook = {"X-MLflow-Delivery-Id": "d-auth-1", "X-MLflow-Timestamp": now, "Content-Type": "application/json"}
    wrong = sign("not-the-secret", "d-auth-1", now, body)
    status, answer = await call(platform, "POST", "/webhooks/mlflow", body, **hook, X_MLflow_Signature=wrong)
    assert status == 401 and answer["ok"] is False, answer
    status, answer = await call(
        platform, "POST", "/webhooks/mlflow", body, **hook, X_MLflow_Signature=wrong, Authorization=f"Bearer {ADMIN}"
    )
    assert status == 401, answer  # a bearer token is no signature
    right = sign("whsec-0123456789", "d-auth-1", now, body)
    status, answer = await call(platform, "POST", "/webhooks/mlflow", body, **hook, X_MLflow_Signature=right)
    assert status != 401, answer  # signed: no bearer token needed


async def test_an_intake_without_tokens_refuses_to_listen_beyond_loopback(servers, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    await fresh_bus(servers.nats_url)
    proc = IntakeProcess(servers.nats_url, tmp_path, env={"ONEPLUS_HTTP_HOST": "0.0.0.0"})
    with pytest.raises(RuntimeError, match="intake exited") as err:
        await proc.start(timeout=60)
    proc.stop()
    assert "is not a loopback address and no HTTP tokens are configured" in str(err.value)
    assert "ONEPLUS_HTTP_INSECURE=1" in str(err.value)


async def test_an_insecure_intake_beyond_loopback_warns(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from oneplus_intake.app import IntakeService

    settings = IntakeSettings.from_env({"ONEPLUS_HTTP_HOST": "0.0.0.0", "ONEPLUS_HTTP_INSECURE": "1"})
    it = IntakeService(None, settings)  # type: ignore[arg-type]

    async def nothing() -> None:
        return None

    it.intake.start = nothing  # type: ignore[method-assign]
    it.start_hot_view = nothing  # type: ignore[method-assign]
    it.start_http = lambda s: nothing()  # type: ignore[method-assign,assignment]
    with caplog.at_level(logging.WARNING, logger="oneplus.intake"):
        await it.start()
    assert any("WITHOUT authentication" in r.getMessage() for r in caplog.records)
