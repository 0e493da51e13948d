"""CloudEvents over NATS (structured, binary, retried) and `POST /v1/jobs`, against an intake process and real NATS."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Literal, cast

import pytest
from intake_process import IntakeProcess, fresh_bus
from oneplus_contracts import JobSpec, subjects
from oneplus_jobformats import encode_binary, encode_structured

from oneplus.client import OnePlusClient, PlatformError


def spec(name: str = "train", **kw: object) -> JobSpec:
    return JobSpec.model_validate({"name": name, "resources": {"gpus": 1}, "command": ["python", "t.py"], **kw})


@pytest.fixture(scope="module")
async def intake(servers, tmp_path_factory) -> AsyncIterator[IntakeProcess]:  # type: ignore[no-untyped-def]
    await fresh_bus(servers.nats_url)
    proc = await IntakeProcess(
        servers.nats_url, Path(tmp_path_factory.mktemp("intake")), redis_url=servers.redis_url
    ).start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
async def client(intake: IntakeProcess) -> AsyncIterator[OnePlusClient]:
    async with OnePlusClient.connect(intake.nats_url) as c:
        yield c


Mode = Literal["structured", "binary"]


def ce_id() -> str:
    return f"gh-{uuid.uuid4().hex}-1"


@pytest.mark.parametrize("mode", ["structured", "binary"])
async def test_a_cloudevent_is_accepted_and_its_retry_is_the_same_job(client: OnePlusClient, mode: Mode) -> None:
    event_id = ce_id()
    first = await client.submit_cloudevent(spec(f"ce-{mode}"), "/ci/acme/repo", event_id, mode=mode)
    assert first.ok and not first.duplicate, first.error
    again = await client.submit_cloudevent(spec(f"ce-{mode}"), "/ci/acme/repo", event_id, mode=mode)
    assert again.ok and again.duplicate and again.job_id == first.job_id
    rec = await client.get_job(first.job_id or "")
    assert rec.spec.name == f"ce-{mode}" and rec.state == "ACCEPTED"
    jobs = [r for r in await client.list_jobs() if r.spec.name == f"ce-{mode}"]
    assert len(jobs) == 1, "a retried CloudEvent must not be a second job"


async def test_structured_and_binary_with_the_same_id_are_one_job(client: OnePlusClient) -> None:
    event_id = ce_id()
    a = await client.submit_cloudevent(spec("same-id"), "/ci/x", event_id, mode="structured")
    b = await client.submit_cloudevent(spec("same-id"), "/ci/x", event_id, mode="binary")
    assert a.job_id == b.job_id and b.duplicate


async def test_a_cloudevent_id_with_spaces_and_unicode_survives_binary_percent_encoding(client: OnePlusClient) -> None:
    event_id = f"run 42 ✓ {uuid.uuid4().hex}"
    a = await client.submit_cloudevent(spec("pct"), "/ci/with space", event_id, mode="binary")
    b = await client.submit_cloudevent(spec("pct"), "/ci/with space", event_id, mode="structured")
    assert a.ok and b.duplicate and a.job_id == b.job_id
    rec = await client.get_job(a.job_id or "")
    assert rec.source == "/ci/with space"


async def test_a_cloudevent_without_an_id_is_refused_naming_the_attribute(client: OnePlusClient) -> None:
    headers, body = encode_binary(spec(), "/ci/x", "id-1")
    del headers["ce-id"]
    reply = await client.submit_raw(body, headers)
    assert not reply.ok and reply.error and "'id' is missing" in reply.error


async def test_a_structured_event_that_is_not_json_is_refused_with_the_reason(client: OnePlusClient) -> None:
    reply = await client.submit_raw(b"{not json", {"content-type": "application/cloudevents+json"})
    assert not reply.ok and reply.error and "not JSON" in reply.error


async def test_an_unknown_client_mode_is_a_clear_error(client: OnePlusClient) -> None:
    with pytest.raises(ValueError, match="mode must be"):
        await client.submit_cloudevent(spec(), "/ci/x", "id", mode=cast(Mode, "batch"))


# --- HTTP ---------------------------------------------------------------------------------------


async def post(intake: IntakeProcess, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, dict]:  # type: ignore[type-arg]
    return await asyncio.to_thread(intake.post, "/v1/jobs", body, headers)


async def test_http_post_of_a_job_spec_is_201_then_200_for_the_same_idempotency_key(intake: IntakeProcess) -> None:
    key = uuid.uuid4().hex
    body = spec("http-json").model_dump_json().encode()
    status, reply = await post(intake, body, {"Idempotency-Key": key})
    assert status == 201 and reply["ok"] and reply["job_id"].startswith("j-"), reply
    status2, reply2 = await post(intake, body, {"Idempotency-Key": key})
    assert status2 == 200 and reply2["duplicate"] and reply2["job_id"] == reply["job_id"]


async def test_http_post_takes_yaml_and_both_cloudevent_modes(intake: IntakeProcess) -> None:
    yaml_body = b"name: http-yaml\nresources: {gpus: 2}\ncommand: [python, t.py]\n"
    status, reply = await post(intake, yaml_body, {"Content-Type": "application/yaml"})
    assert status == 201, reply
    for mode, encode in (("structured", encode_structured), ("binary", encode_binary)):
        event_id = ce_id()
        headers, body = encode(spec(f"http-{mode}"), "/gitlab/acme", event_id)
        status, reply = await post(intake, body, headers)
        assert status == 201, (mode, reply)
        status, again = await post(intake, body, headers)
        assert status == 200 and again["job_id"] == reply["job_id"], (mode, again)


async def test_http_post_of_a_bad_body_is_400_naming_the_field(intake: IntakeProcess) -> None:
    status, reply = await post(intake, json.dumps({"name": "x", "resources": {"gpus": 0}}).encode())
    assert status == 400 and not reply["ok"]
    assert "resources.gpus" in reply["error"] and "> 0" in reply["error"], reply


async def test_http_post_of_a_job_the_queues_refuse_is_422(intake: IntakeProcess) -> None:
    status, reply = await post(intake, spec("nowhere", queue="no-such-queue").model_dump_json().encode())
    assert status == 422 and "no-such-queue" in reply["error"], reply


async def test_http_team_header_binds_the_job_and_another_team_is_403(intake: IntakeProcess) -> None:
    status, reply = await post(intake, spec("teamed").model_dump_json().encode(), {"Oneplus-Team": "nlp"})
    assert status == 201, reply
    async with OnePlusClient.connect(intake.nats_url) as c:
        assert (await c.get_job(reply["job_id"])).spec.team == "nlp"
    status, reply = await post(intake, spec("x", team="vision").model_dump_json().encode(), {"Oneplus-Team": "nlp"})
    assert status == 403 and "team 'vision'" in reply["error"], reply


async def test_http_ignores_a_nats_request_info_header_sent_by_the_caller(intake: IntakeProcess) -> None:
    forged = {"Nats-Request-Info": json.dumps({"acc": "vision", "user": "mallory"})}
    status, reply = await post(intake, spec("forged").model_dump_json().encode(), forged)
    assert status == 201, reply
    async with OnePlusClient.connect(intake.nats_url) as c:
        rec = await c.get_job(reply["job_id"])
    assert rec.spec.team == "default" and rec.spec.user == "unknown"


async def test_http_unknown_path_and_method_are_json_errors(intake: IntakeProcess) -> None:
    status, reply = await asyncio.to_thread(intake.request, "PUT", "/v1/jobs")
    assert status == 405 and not reply["ok"]
    status, reply = await asyncio.to_thread(intake.post, "/v2/nothing", b"{}")
    assert status == 404 and not reply["ok"]


# --- tenancy over NATS in the platform account (header) ----------------------------------------------


async def test_a_team_sees_and_cancels_only_its_own_jobs(intake: IntakeProcess) -> None:
    async with (
        OnePlusClient.connect(intake.nats_url, team="nlp") as nlp,
        OnePlusClient.connect(intake.nats_url, team="vision") as vision,
    ):
        mine = await nlp.submit(spec("nlp-job"), msg_id=uuid.uuid4().hex)
        theirs = await vision.submit(spec("vision-job"), msg_id=uuid.uuid4().hex)
        assert mine.ok and theirs.ok, (mine.error, theirs.error)
        assert (await nlp.get_job(mine.job_id or "")).spec.team == "nlp"
        assert {r.spec.team for r in await nlp.list_jobs()} == {"nlp"}
        with pytest.raises(PlatformError, match="no job"):
            await nlp.get_job(theirs.job_id or "")
        with pytest.raises(PlatformError, match="no job"):
            await nlp.cancel(theirs.job_id or "")
        assert (await vision.get_job(theirs.job_id or "")).cancel_requested is False
        assert (await nlp.cancel(mine.job_id or ""))["cancel_requested"] is True


async def test_the_same_submission_id_from_two_teams_is_two_jobs(intake: IntakeProcess) -> None:
    shared = f"build-{uuid.uuid4().hex}"
    async with (
        OnePlusClient.connect(intake.nats_url, team="nlp") as nlp,
        OnePlusClient.connect(intake.nats_url, team="vision") as vision,
    ):
        a = await nlp.submit_cloudevent(spec("a"), "/ci", shared)
        b = await vision.submit_cloudevent(spec("b"), "/ci", shared)
    assert a.ok and b.ok and not b.duplicate and a.job_id != b.job_id


async def test_a_header_team_and_a_payload_team_that_disagree_are_refused(intake: IntakeProcess, bus) -> None:  # type: ignore[no-untyped-def]
    msg = await bus.request(
        subjects.OPS_JOB_SHOW, b'{"job_id": "j-1", "team": "vision"}', headers={"Oneplus-Team": "nlp"}, timeout=5
    )
    reply = json.loads(msg.data)
    assert not reply["ok"] and "says 'nlp'" in reply["error"]
    assert msg.headers and msg.headers.get("Nats-Service-Error-Code") == "400"


async def test_mlflow_webhooks_without_a_secret_are_503_saying_what_to_set(intake: IntakeProcess) -> None:
    status, reply = await asyncio.to_thread(intake.post, "/webhooks/mlflow", b"{}")
    assert status == 503 and "ONEPLUS_MLFLOW_SECRET" in reply["error"]
