"""The intake's HTTP API beside `POST /v1/jobs` (list, show, cancel jobs; nodes; queues) against an intake process,
its job owner and a topology-registry on real NATS; every error path answers `{ok: false, code, error}`."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import nats
import pytest
from http_platform import HttpPlatform, start_platform
from oneplus_contracts import JobRecord, JobSpec, subjects
from oneplus_intake.http_api import unwrap
from oneplus_stores.archive import JobArchive

SPEC = {"resources": {"gpus": 1}, "command": ["python", "t.py"]}


@pytest.fixture(scope="module")
async def platform(servers, tmp_path_factory) -> AsyncIterator[HttpPlatform]:  # type: ignore[no-untyped-def]
    p = await start_platform(servers.nats_url, servers.redis_url, Path(tmp_path_factory.mktemp("http-api")))
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


async def submit(p: HttpPlatform, name: str, team: str | None = None, **spec: Any) -> str:
    headers = {"Oneplus_Team": team} if team else {}
    status, answer = await call(p, "POST", "/v1/jobs", {"name": name, **SPEC, **spec}, **headers)
    assert status == 201 and answer["ok"], answer
    return str(answer["job_id"])


def assert_error(status: int, answer: Any, want: int, code: str, says: str = "") -> None:
    assert status == want, (status, answer)
    assert set(answer) == {"ok", "code", "error"} and answer["ok"] is False, answer
    assert answer["code"] == code and says in answer["error"], answer


async def archived(p: HttpPlatform, team: str, state: str = "SUCCEEDED") -> JobRecord:
    """A finished job as the owner leaves it in the archive, long gone from the hot view."""
    job_id = f"j-{uuid.uuid4().hex[:12]}"
    spec = JobSpec.model_validate({"name": "old", "team": team, "user": "ann", **SPEC})
    rec = JobRecord(
        job_id=job_id,
        spec=spec,
        state=state,
        submitted_ts=1_700_000_000.0,
        updated_ts=1_700_000_060.0,
        finished_ts=1_700_000_060.0,
        seq=5,
    )
    nc = await nats.connect(p.intake.nats_url)
    try:
        await JobArchive(nc.jetstream()).put(rec)
    finally:
        await nc.close()
    return rec


# --- jobs ------------------------------------------------------------------------------------------


async def test_list_pages_through_the_teams_jobs_and_show_reads_each(platform: HttpPlatform) -> None:
    team = f"t{uuid.uuid4().hex[:6]}"
    ids = {await submit(platform, f"job-{i}", team) for i in range(3)}
    other = await submit(platform, "elsewhere", f"o{uuid.uuid4().hex[:6]}")
    seen: list[str] = []
    cursor: str | None = None
    for _ in range(10):
        query = "/v1/jobs?limit=2" + (f"&cursor={cursor}" if cursor else "")
        status, page = await call(platform, "GET", query, Oneplus_Team=team)
        assert status == 200 and len(page["jobs"]) <= 2, page
        seen += [j["job_id"] for j in page["jobs"]]
        cursor = page["next"]
        if cursor is None:
            break
    assert set(seen) == ids and len(seen) == 3 and other not in seen
    for job_id in ids:
        status, rec = await call(platform, "GET", f"/v1/jobs/{job_id}", Oneplus_Team=team)
        assert status == 200 and JobRecord.model_validate(rec).spec.team == team
    # The `team` parameter does what the header does; an operator (no team) sees every team.
    status, page = await call(platform, "GET", f"/v1/jobs?team={team}&limit=100")
    assert status == 200 and {j["job_id"] for j in page["jobs"]} == ids
    status, rec = await call(platform, "GET", f"/v1/jobs/{other}")
    assert status == 200 and rec["job_id"] == other


async def test_list_filters_by_state_since_and_user(platform: HttpPlatform) -> None:
    team = f"t{uuid.uuid4().hex[:6]}"
    mine = await submit(platform, "filtered", team, user="ann")
    await submit(platform, "filtered", team, user="bob")
    old = await archived(platform, team)

    async def ids(query: str) -> set[str]:
        status, page = await call(platform, "GET", f"/v1/jobs?{query}", Oneplus_Team=team)
        assert status == 200, page
        return {j["job_id"] for j in page["jobs"]}

    assert await ids("user=ann") == {mine, old.job_id}
    assert await ids("state=SUCCEEDED") == {old.job_id}
    assert await ids("state=CD") == {old.job_id}  # Slurm's code
    assert old.job_id not in await ids("state=PD&state=R,CF")  # repeated and a comma list
    assert len(await ids("state=all")) == 3
    now = time.time() - 5
    assert await ids(f"since={now}&user=ann") == {mine}  # the archived job ended long ago
    iso = datetime.fromtimestamp(now, UTC).isoformat()
    assert await ids(f"since={quote(iso)}&user=ann") == {mine}
    assert await ids(f"since={quote(iso[:19])}&user=ann") == {mine}  # without a zone: UTC


async def test_an_archived_job_is_shown_and_cancelling_it_is_a_conflict(platform: HttpPlatform) -> None:
    team = f"t{uuid.uuid4().hex[:6]}"
    rec = await archived(platform, team)
    status, shown = await call(platform, "GET", f"/v1/jobs/{rec.job_id}", Oneplus_Team=team)
    assert status == 200 and JobRecord.model_validate(shown) == rec
    status, answer = await call(platform, "DELETE", f"/v1/jobs/{rec.job_id}", Oneplus_Team=team)
    assert_error(status, answer, 409, "conflict", "already SUCCEEDED")
    status, answer = await call(platform, "GET", f"/v1/jobs/{rec.job_id}", Oneplus_Team="someone-else")
    assert_error(status, answer, 404, "not_found", "no job")


async def test_delete_cancels_a_job_of_the_callers_team_only(platform: HttpPlatform) -> None:
    team = f"t{uuid.uuid4().hex[:6]}"
    job_id = await submit(platform, "to-cancel", team)
    status, answer = await call(platform, "DELETE", f"/v1/jobs/{job_id}", Oneplus_Team="intruder")
    assert_error(status, answer, 404, "not_found", job_id)
    status, answer = await call(platform, "DELETE", f"/v1/jobs/{job_id}", Oneplus_Team=team)
    assert status == 202 and answer["job_id"] == job_id and answer["cancel_requested"] is True, answer
    assert answer["state"] in {"ACCEPTED", "PLACED", "LAUNCHING", "RUNNING"}
    status, rec = await call(platform, "GET", f"/v1/jobs/{job_id}", Oneplus_Team=team)
    assert status == 200 and (rec["cancel_requested"] or rec["state"] == "CANCELLED"), rec


async def test_job_errors_are_json_with_a_code_and_no_job_id(platform: HttpPlatform) -> None:
    cases = [
        ("GET", "/v1/jobs?limit=0", 400, "bad_request", "limit"),
        ("GET", "/v1/jobs?limit=1001", 400, "bad_request", "limit"),
        ("GET", "/v1/jobs?limit=many", 400, "bad_request", "limit"),
        ("GET", "/v1/jobs?state=SLEEPING", 400, "bad_request", "state"),
        ("GET", "/v1/jobs?since=yesterday", 400, "bad_request", "since"),
        ("GET", "/v1/jobs?cursor=not-a-cursor", 400, "bad_request", "cursor"),
        ("GET", "/v1/jobs/j-000000000000", 404, "not_found", "no job"),
        ("GET", "/v1/jobs/a*b", 404, "not_found", "no job"),  # never a subject wildcard
        ("GET", "/v1/jobs/a.b", 404, "not_found", "no job"),
        ("DELETE", "/v1/jobs/j-000000000000", 404, "not_found", "no job"),
        ("DELETE", "/v1/jobs/%3E", 404, "not_found", "no job"),
        ("PATCH", "/v1/jobs", 405, "http_405", ""),
        ("GET", "/v2/nothing", 404, "http_404", ""),
    ]
    for method, path, want, code, says in cases:
        status, answer = await call(platform, method, path)
        assert_error(status, answer, want, code, says)
    # A cursor fits only the listing that made it.
    team = f"t{uuid.uuid4().hex[:6]}"
    for i in range(2):
        await submit(platform, f"c{i}", team)
    status, page = await call(platform, "GET", "/v1/jobs?limit=1", Oneplus_Team=team)
    assert status == 200 and page["next"], page
    status, answer = await call(platform, "GET", f"/v1/jobs?limit=1&state=R&cursor={page['next']}", Oneplus_Team=team)
    assert_error(status, answer, 400, "bad_request", "other filters")
    # The header and the `team` parameter must name the same team.
    for path in ("/v1/jobs?team=vision", "/v1/jobs/j-000000000000?team=vision", "/v1/queue?team=vision"):
        status, answer = await call(platform, "GET", path, Oneplus_Team="nlp")
        assert_error(status, answer, 400, "bad_request", "says 'nlp'")
    status, answer = await call(platform, "DELETE", "/v1/jobs/j-000000000000?team=vision", Oneplus_Team="nlp")
    assert_error(status, answer, 400, "bad_request", "says 'nlp'")


async def test_a_refused_submission_answers_the_error_without_a_job_id(platform: HttpPlatform) -> None:
    status, answer = await call(platform, "POST", "/v1/jobs", {"name": "x", "resources": {"gpus": 0}})
    assert_error(status, answer, 400, "unreadable", "resources.gpus")
    status, answer = await call(
        platform, "POST", "/v1/jobs", {"name": "x", "team": "vision", **SPEC}, Oneplus_Team="nlp"
    )
    assert_error(status, answer, 403, "wrong_team", "team 'vision'")
    status, answer = await call(platform, "POST", "/v1/jobs", {"name": "x", "queue": "no-such-queue", **SPEC})
    assert_error(status, answer, 422, "cannot_run", "no-such-queue")
    status, answer = await call(platform, "POST", "/v1/jobs", b"x" * (2 << 20))
    assert_error(status, answer, 413, "http_413", "")


# --- nodes and queues ----------------------------------------------------------------------------------


async def test_nodes_page_in_name_order(platform: HttpPlatform) -> None:
    status, first = await call(platform, "GET", "/v1/nodes?limit=1")
    assert status == 200 and [n["topology"]["node"] for n in first["nodes"]] == ["gpu-0"] and first["next"], first
    status, rest = await call(platform, "GET", f"/v1/nodes?limit=1000&cursor={first['next']}")
    assert status == 200 and [n["topology"]["node"] for n in rest["nodes"]] == ["gpu-1"] and rest["next"] is None
    status, every = await call(platform, "GET", "/v1/nodes", Oneplus_Team="nlp")  # teams see the nodes too
    assert status == 200 and len(every["nodes"]) == 2
    for query in ("limit=0", "limit=1001", "limit=x"):
        status, answer = await call(platform, "GET", f"/v1/nodes?{query}")
        assert_error(status, answer, 400, "bad_request", "limit")


async def test_queue_rows_and_queues(platform: HttpPlatform) -> None:
    team = f"t{uuid.uuid4().hex[:6]}"
    job_id = await submit(platform, "queued", team)
    # The 201 waits up to ONEPLUS_ACCEPT_WAIT_S for the owner's record; on a loaded machine the record comes later.
    deadline = time.monotonic() + 30
    while True:
        status, rows = await call(platform, "GET", "/v1/queue", Oneplus_Team=team)
        if status != 200 or rows["rows"] or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.2)
    assert status == 200 and [r["job_id"] for r in rows["rows"]] == [job_id] and rows["next"] is None, rows
    status, every = await call(platform, "GET", "/v1/queue?limit=1")
    assert status == 200 and len(every["rows"]) == 1, every
    status, queues = await call(platform, "GET", "/v1/queues")
    assert status == 200 and "default" in {q["queue"] for q in queues}, queues
    for query, says in (("limit=0", "limit"), ("limit=2001", "limit"), ("cursor=-1", "cursor"), ("cursor=x", "cursor")):
        status, answer = await call(platform, "GET", f"/v1/queue?{query}")
        assert_error(status, answer, 400, "bad_request", says)


async def test_an_ops_subject_nobody_answers_is_503_and_a_silent_one_504(platform: HttpPlatform) -> None:
    nc = await nats.connect(platform.intake.nats_url)
    try:
        platform.registry.terminate()
        await asyncio.to_thread(platform.registry.wait, 15)
        status, answer = await call(platform, "GET", "/v1/nodes")
        assert_error(status, answer, 503, "unavailable", subjects.OPS_NODE_LIST)
        sub = await nc.subscribe(subjects.OPS_NODE_LIST)  # hears every request, answers none
        await nc.flush()
        status, answer = await call(platform, "GET", "/v1/nodes")
        assert_error(status, answer, 504, "timeout", subjects.OPS_NODE_LIST)
        await sub.unsubscribe()
    finally:
        await nc.close()


def test_an_ops_answer_keeps_its_4xx_and_a_failed_service_is_502() -> None:
    assert unwrap("s", b'{"ok": true, "result": [1]}', None) == [1]
    cases = [
        (b'{"ok": false, "error": "too big"}', {"Nats-Service-Error-Code": "413"}, 413, "too big"),
        (b'{"ok": false, "error": "boom"}', {"Nats-Service-Error-Code": "500"}, 502, "s failed: boom"),
        (b"", {"Nats-Service-Error-Code": "404", "Nats-Service-Error": "gone"}, 404, "gone"),
        (b"not json", None, 502, "unreadable answer"),
        (b'{"ok": true}', None, 502, "unreadable answer"),
    ]
    from oneplus_intake.http_api import ApiError

    for data, headers, want, says in cases:
        with pytest.raises(ApiError) as err:
            unwrap("s", data, headers)
        assert err.value.status == want and says in err.value.error, (data, err.value.error)
