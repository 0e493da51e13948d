"""Bounded history: the archive of finished jobs (put, get, filtered pages), every stream's limits, and the job list
and job show of a real intake process paging over the hot view (`jobs` KV) and the archive, past 1 MB of records."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from intake_process import IntakeProcess, fresh_bus
from nats.aio.client import Client
from nats.js.kv import KeyValue
from oneplus_bus.ledger import latest_items
from oneplus_bus.streams import ARCHIVE_MAX_BYTES, ARCHIVE_RETENTION_S, ensure_streams, stream_limits
from oneplus_contracts import JobRecord, JobSpec, subjects
from oneplus_intake.submissions import job_id_for
from oneplus_stores.archive import JobArchive, archive_subject, job_token, parse_since, parse_states, reply_size, token
from typer.testing import CliRunner

from oneplus.cli.app import app as cli
from oneplus.client import OnePlusClient, PlatformError
from oneplus.demo import wait_for_platform
from oneplus.devstack import DEMO_NODES, EmbeddedServers, Platform

LIST = f"{subjects.PREFIX}.ops.job.list"
MAX_PAYLOAD = 1024 * 1024


def team_name() -> str:
    return f"t{uuid.uuid4().hex[:10]}"


def record(
    job_id: str,
    team: str,
    *,
    user: str = "ann",
    state: str = "SUCCEEDED",
    submitted: float = 1_700_000_000.0,
    finished: float | None = None,
    pad: int = 0,
    seq: int = 7,
) -> JobRecord:
    env = {"PAD": "x" * pad} if pad else {}
    spec = JobSpec.model_validate({"name": "train", "team": team, "user": user, "resources": {"gpus": 1}, "env": env})
    terminal = state in {"SUCCEEDED", "FAILED", "CANCELLED", "REJECTED"}
    end = finished if finished is not None else submitted + 60
    return JobRecord(
        job_id=job_id,
        spec=spec,
        state=state,
        submitted_ts=submitted,
        updated_ts=end if terminal else submitted,
        finished_ts=end if terminal else None,
        seq=seq,
    )


def records(page: list[bytes]) -> list[JobRecord]:
    return [JobRecord.model_validate_json(data) for data in page]


async def all_pages(archive: JobArchive, limit: int, **filters: Any) -> tuple[list[JobRecord], int]:
    out: list[JobRecord] = []
    cursor: str | None = None
    pages = 0
    while True:
        page, cursor = await archive.page(limit=limit, cursor=cursor, **filters)
        pages += 1
        assert len(page) <= limit
        out += records(page)
        if cursor is None:
            return out, pages


# --- the archive on its own ------------------------------------------------------------------------------------------
@pytest.fixture
async def archive(bus: Client) -> JobArchive:
    await ensure_streams(bus.jetstream())
    return JobArchive(bus.jetstream())


async def test_put_then_get_and_a_repeat_is_not_stored_twice(archive: JobArchive) -> None:
    team = team_name()
    rec = record(f"j-{uuid.uuid4().hex[:12]}", team, state="FAILED")
    seq = await archive.put(rec)
    assert await archive.put(rec) == seq, "the same record again is deduplicated by its Nats-Msg-Id"
    assert await archive.get(rec.job_id) == rec
    assert await archive.get(f"j-{uuid.uuid4().hex[:12]}") is None
    assert archive_subject(rec) == f"oneplus.archive.{rec.job_id}.FAILED.{team}.ann"


async def test_names_that_share_a_subject_token_are_told_apart(archive: JobArchive) -> None:
    team = team_name()
    stem = uuid.uuid4().hex[:8]
    dotted, underscored = record(f"j.{stem}", team, user="a.b"), record(f"j_{stem}", team, user="a_b")
    assert token("a.b") == token("a_b") == "a_b" and token("") == "_" and token("ok-Name_1") == "ok-Name_1"
    assert (
        job_token(underscored.job_id)
        == underscored.job_id
        != job_token(dotted.job_id)
        == "=" + dotted.job_id.encode().hex()
    )
    await archive.put(dotted)
    await archive.put(underscored)
    assert await archive.get(dotted.job_id) == dotted
    assert await archive.get(underscored.job_id) == underscored
    page, _ = await archive.page(team=team, user="a.b")
    assert [r.job_id for r in records(page)] == [dotted.job_id], "the exact user is checked on the record"


async def test_pages_filter_by_state_team_user_and_since_and_resume_at_their_cursor(archive: JobArchive) -> None:
    team, other = team_name(), team_name()
    now = time.time()
    recs = [
        record(
            f"j-{team}-{i:03d}",
            team,
            user=("ann", "bob")[i % 2],
            state=("SUCCEEDED", "FAILED", "CANCELLED")[i % 3],
            submitted=now - 7200 + i,
            finished=(now - 3600) if i < 30 else now - 10,
        )
        for i in range(60)
    ]
    for r in recs:
        await archive.put(r)
    await archive.put(record(f"j-{other}-0", other))

    everything, pages = await all_pages(archive, 7, team=team)
    assert [r.job_id for r in everything] == [r.job_id for r in recs], "archive order, each job once"
    assert pages == 9
    failed, _ = await all_pages(archive, 4, team=team, states={"FAILED"})
    assert [r.job_id for r in failed] == [r.job_id for r in recs if r.state == "FAILED"]
    assert (await all_pages(archive, 4, team=team, states={"FAILED", "RUNNING"}))[0] == failed
    bob_done, _ = await all_pages(archive, 5, team=team, user="bob", states={"SUCCEEDED", "CANCELLED"})
    assert {r.job_id for r in bob_done} == {
        r.job_id for r in recs if r.spec.user == "bob" and r.state in {"SUCCEEDED", "CANCELLED"}
    }
    recent, _ = await all_pages(archive, 8, team=team, since=now - 600)
    assert [r.job_id for r in recent] == [r.job_id for r in recs[30:]], "since: the jobs that ended after it"
    assert await archive.page(team=team, states=set()) == ([], None)
    assert await archive.page(team=team, states={"RUNNING"}) == ([], None)

    first, cursor = await archive.page(team=team, limit=60)
    assert len(first) == 60 and cursor is None, "a page that holds the rest says so"


async def test_a_page_stops_at_its_byte_budget_but_always_moves_on(archive: JobArchive) -> None:
    team = team_name()
    recs = [record(f"j-{team}-{i}", team, pad=2000) for i in range(6)]
    for r in recs:
        await archive.put(r)
    page, cursor = await archive.page(team=team, limit=100, max_bytes=reply_size(recs[0]) * 2 + 10)
    assert len(page) == 2 and cursor is not None
    page, cursor = await archive.page(team=team, limit=100, max_bytes=10, cursor=cursor)
    assert len(page) == 1 and cursor is not None, "one record comes whatever its size"
    page, _ = await archive.page(team=team, limit=100, max_bytes=10, cursor=cursor, at_least_one=False)
    assert page == []


def test_states_and_since_are_parsed_or_refused_by_name() -> None:
    assert parse_states("running, FAILED") == {"RUNNING", "FAILED"}
    assert parse_states(["PD", "CD"]) == {"SUBMITTED", "ACCEPTED", "SUCCEEDED"}
    assert parse_states(None) is None and parse_states("all") is None
    # Slurm's and Kubernetes' names, as users type them: `jobs list --state PENDING` is what `squeue` calls PD.
    assert parse_states("PENDING") == parse_states("PD") == {"SUBMITTED", "ACCEPTED"}
    assert parse_states("Pending,Succeeded,completed") == {"SUBMITTED", "ACCEPTED", "SUCCEEDED"}
    assert parse_states("preempted") == {"PREEMPTING", "CHECKPOINTED"}
    with pytest.raises(ValueError, match="'DONE' is not a job state"):
        parse_states("RUNNING,DONE")
    with pytest.raises(ValueError, match="comma-separated"):
        parse_states(5)
    assert parse_since(1_700_000_000) == 1_700_000_000.0 == parse_since("1700000000")
    assert parse_since("2023-11-14T22:13:20Z") == 1_700_000_000.0 == parse_since("2023-11-14T22:13:20")
    for bad in ("yesterday", True, -1, [1]):
        with pytest.raises(ValueError):
            parse_since(bad)


# --- every stream's limits -------------------------------------------------------------------------------------------
def test_every_stream_is_bounded_and_the_knobs_are_read() -> None:
    assert set(subjects.STREAMS) >= {subjects.ARCHIVE_STREAM, subjects.FACTS_STREAM}
    for name in subjects.STREAMS:
        lim = stream_limits(name, env={})
        assert lim.max_age > 0 or lim.max_msgs_per_subject > 0, f"{name} keeps everything forever"
    arc = stream_limits(subjects.ARCHIVE_STREAM, env={})
    assert (arc.max_age, arc.max_bytes, arc.max_msgs_per_subject) == (ARCHIVE_RETENTION_S, ARCHIVE_MAX_BYTES, 1)
    assert stream_limits(subjects.JOBS_STREAM, env={}).max_age == ARCHIVE_RETENTION_S
    assert stream_limits(subjects.FACTS_STREAM, env={}).max_age == 86400
    assert stream_limits(subjects.COMMANDS_STREAM, env={}).max_age == 86400
    assert stream_limits(subjects.DEAD_LETTER_STREAM, env={}).max_age == 7 * 86400
    assert stream_limits(subjects.NODES_STREAM, env={}).max_msgs_per_subject == 50
    env = {
        "ONEPLUS_ARCHIVE_RETENTION_S": "3600",
        "ONEPLUS_ARCHIVE_MAX_BYTES": "1e9",
        "ONEPLUS_JOBS_STREAM_MAX_MSGS": "5",
    }
    assert stream_limits(subjects.ARCHIVE_STREAM, env=env).max_bytes == 1_000_000_000
    assert stream_limits(subjects.JOBS_STREAM, env=env).max_msgs == 5
    assert stream_limits(subjects.JOBS_STREAM, env=env).max_age == 3600, "the event log follows the archive's knob"
    env["ONEPLUS_JOB_EVENTS_RETENTION_S"] = "86400"  # a shorter event log than the archive: less broker memory
    assert stream_limits(subjects.JOBS_STREAM, env=env).max_age == 86400
    assert stream_limits(subjects.ARCHIVE_STREAM, env=env).max_age == 3600
    with pytest.raises(ValueError, match="ONEPLUS_JOB_EVENTS_RETENTION_S='-1' must be positive"):
        stream_limits(subjects.JOBS_STREAM, env={"ONEPLUS_JOB_EVENTS_RETENTION_S": "-1"})
    with pytest.raises(ValueError, match="ONEPLUS_ARCHIVE_RETENTION_S='soon' is not a number"):
        stream_limits(subjects.ARCHIVE_STREAM, env={"ONEPLUS_ARCHIVE_RETENTION_S": "soon"})


async def test_ensure_streams_applies_the_limits_and_updates_a_stream_whose_limits_differ(
    bus: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    js = bus.jetstream()
    await ensure_streams(js)
    for name in subjects.STREAMS:
        cfg = (await js.stream_info(name)).config
        want = stream_limits(name)
        assert cfg.max_age == pytest.approx(want.max_age), name
        assert (cfg.max_msgs_per_subject or -1) == want.max_msgs_per_subject, name
    monkeypatch.setenv("ONEPLUS_ARCHIVE_RETENTION_S", "7200")
    monkeypatch.setenv("ONEPLUS_ARCHIVE_MAX_BYTES", str(2**30))
    await ensure_streams(js)
    cfg = (await js.stream_info(subjects.ARCHIVE_STREAM)).config
    assert (cfg.max_age, cfg.max_bytes, cfg.max_msgs_per_subject) == (7200, 2**30, 1)
    assert (await js.stream_info(subjects.JOBS_STREAM)).config.max_age == 7200
    monkeypatch.setenv("ONEPLUS_JOB_EVENTS_RETENTION_S", "3600")
    await ensure_streams(js)
    assert (await js.stream_info(subjects.JOBS_STREAM)).config.max_age == 3600
    assert (await js.stream_info(subjects.ARCHIVE_STREAM)).config.max_age == 7200
    monkeypatch.delenv("ONEPLUS_JOB_EVENTS_RETENTION_S")
    monkeypatch.delenv("ONEPLUS_ARCHIVE_RETENTION_S")
    monkeypatch.delenv("ONEPLUS_ARCHIVE_MAX_BYTES")
    await ensure_streams(js)
    cfg = (await js.stream_info(subjects.ARCHIVE_STREAM)).config
    assert (cfg.max_age, cfg.max_bytes) == (ARCHIVE_RETENTION_S, ARCHIVE_MAX_BYTES)


async def test_the_archive_is_read_by_direct_get_and_a_stream_declared_without_it_is_updated_and_still_read(
    bus: Client,
) -> None:
    js = bus.jetstream()
    await ensure_streams(js)
    assert (await js.stream_info(subjects.ARCHIVE_STREAM)).config.allow_direct, "a lookup is one direct get"
    rec = record(f"j-{uuid.uuid4().hex[:12]}", team_name())
    await JobArchive(js).put(rec)
    # A stream made before direct gets were allowed (an older release): lookups still find the job ...
    cfg = (await js.stream_info(subjects.ARCHIVE_STREAM)).config
    cfg.allow_direct = False
    await js.update_stream(cfg)
    assert await JobArchive(js).get(rec.job_id) == rec
    assert await JobArchive(js).get(f"j-{uuid.uuid4().hex[:12]}") is None
    # ... and the next service start allows them, keeping what the stream holds.
    await ensure_streams(js)
    assert (await js.stream_info(subjects.ARCHIVE_STREAM)).config.allow_direct
    assert await JobArchive(js).get(rec.job_id) == rec


# --- the intake's job list and job show ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
async def intake(servers, tmp_path_factory) -> AsyncIterator[IntakeProcess]:  # type: ignore[no-untyped-def]
    await fresh_bus(servers.nats_url)
    proc = await IntakeProcess(servers.nats_url, Path(tmp_path_factory.mktemp("intake-archive"))).start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
async def jobs_kv(intake: IntakeProcess, bus: Client) -> KeyValue:
    return await bus.jetstream().key_value(subjects.JOBS_KV)


async def hot(kv: KeyValue, *recs: JobRecord) -> None:
    await asyncio.gather(*(kv.put(r.job_id, r.model_dump_json().encode()) for r in recs))


async def ask(bus: Client, subject: str, payload: dict[str, Any], team: str | None = None) -> tuple[int, Any, int]:
    """(status code, result or error, reply bytes) of one raw ops request."""
    headers = {"Oneplus-Team": team} if team else None
    msg = await bus.request(subject, json.dumps(payload).encode(), timeout=10, headers=headers)
    reply = json.loads(msg.data)
    if reply["ok"]:
        return 200, reply["result"], len(msg.data)
    return int((msg.headers or {}).get("Nats-Service-Error-Code", 0)), reply["error"], len(msg.data)


async def test_job_list_pages_past_one_megabyte_hot_view_first_then_the_archive(
    intake: IntakeProcess, bus: Client, jobs_kv: KeyValue
) -> None:
    team = team_name()
    archive = JobArchive(bus.jetstream())
    # 2 kB records: 600 live ones and 600 archived ones are 2.4 MB, more than twice max_payload.
    live = [
        record(f"j-{team}-h{i:04d}", team, state="RUNNING", submitted=1_700_000_000 + (i * 7919) % 600, pad=2000)
        for i in range(600)
    ]
    done = [record(f"j-{team}-a{i:04d}", team, state="SUCCEEDED", pad=2000) for i in range(600)]
    await hot(jobs_kv, *live)
    for r in done:
        await archive.put(r)

    seen: list[str] = []
    cursor, sizes, pages = None, [], 0
    while True:
        code, result, size = await ask(bus, LIST, {"limit": 1000, "cursor": cursor}, team)
        assert code == 200, result
        sizes.append(size)
        pages += 1
        seen += [r["job_id"] for r in result["jobs"]]
        cursor = result["next"]
        if cursor is None:
            break
    assert max(sizes) < MAX_PAYLOAD and pages >= 3, (sizes, pages)
    hot_order = [r.job_id for r in sorted(live, key=lambda r: (r.submitted_ts, r.job_id))]
    assert seen == hot_order + [r.job_id for r in done]

    async with OnePlusClient.connect(intake.nats_url, team=team) as c:
        listed = await c.list_jobs()
        assert [r.job_id for r in listed] == seen, "the client follows every page"
        assert [r.job_id for r in await c.list_jobs(limit=650)] == seen[:650]
        assert [r.job_id async for r in c.iter_jobs(state="CD", page_size=50)] == [r.job_id for r in done]
        assert [r.job_id for r in await c.list_jobs(state=["RUNNING"], limit=3)] == hot_order[:3]
    code, result, _ = await ask(bus, LIST, {}, team)
    assert code == 200 and len(result["jobs"]) == 100 and result["next"], "100 per page unless asked"


async def test_a_page_carries_each_record_as_the_job_owner_stored_it(
    intake: IntakeProcess, bus: Client, jobs_kv: KeyValue
) -> None:
    # Nothing is decoded and encoded again on the way: the reply holds the stored bytes, hot view and archive alike.
    team = team_name()
    live = record(f"j-{team}-live", team, state="RUNNING", user="zoë")
    done = record(f"j-{team}-done", team, user="zoë")
    await hot(jobs_kv, live)
    await JobArchive(bus.jetstream()).put(done)
    msg = await bus.request(LIST, json.dumps({"user": "zoë"}).encode(), timeout=10, headers={"Oneplus-Team": team})
    for rec in (live, done):
        assert rec.model_dump_json().encode() in msg.data, rec.job_id
    result = json.loads(msg.data)["result"]
    assert result == {"jobs": [live.model_dump(mode="json"), done.model_dump(mode="json")], "next": None}
    code, other, _ = await ask(bus, LIST, {"user": "zo_"}, team)
    assert code == 200 and other["jobs"] == [], "a user whose subject token is the same is not listed"


async def test_a_finished_job_moved_to_the_archive_is_still_shown_and_listed_by_state(
    intake: IntakeProcess, bus: Client, jobs_kv: KeyValue
) -> None:
    team = team_name()
    job_id = f"j-{uuid.uuid4().hex[:12]}"
    running = record(job_id, team, state="RUNNING", submitted=time.time() - 100)
    await hot(jobs_kv, running)
    async with OnePlusClient.connect(intake.nats_url, team=team) as c:
        assert [r.state for r in await c.list_jobs(state="R")] == ["RUNNING"]
        finished = running.model_copy(
            update={"state": "SUCCEEDED", "finished_ts": time.time(), "updated_ts": time.time(), "seq": 12}
        )
        await hot(jobs_kv, finished)
        # What the job owner does once the job has been finished ONEPLUS_MIN_JOB_AGE_S: archive, then forget.
        await JobArchive(bus.jetstream()).put(finished)
        assert [r.job_id for r in await c.list_jobs()] == [job_id], "hot view and archive at once: listed once"
        await jobs_kv.delete(job_id)

        assert await c.get_job(job_id) == finished
        assert [r.job_id for r in await c.list_jobs(state="SUCCEEDED")] == [job_id]
        assert [r.job_id for r in await c.list_jobs(state="CD,F", since=time.time() - 60)] == [job_id]
        assert await c.list_jobs(state="RUNNING") == []
        assert await c.list_jobs(state="SUCCEEDED", since=time.time() + 60) == []
        assert await c.list_jobs(state="SUCCEEDED", user="someone-else") == []

    async with OnePlusClient.connect(intake.nats_url, team=team_name()) as other:
        with pytest.raises(PlatformError, match="no job"):
            await other.get_job(job_id)
        assert await other.list_jobs(state="SUCCEEDED") == [], "another team's archive is not shown"

    # The same through the CLI, as a user types it.
    def run(*args: str) -> Any:
        return CliRunner().invoke(cli, [*args, "--nats", intake.nats_url, "--team", team])

    shown = await asyncio.to_thread(run, "jobs", "show", job_id, "--json")
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout)["state"] == "SUCCEEDED"
    listed = await asyncio.to_thread(run, "jobs", "list", "--state", "SUCCEEDED", "--since", "1h", "--json")
    assert listed.exit_code == 0, listed.output
    assert [r["job_id"] for r in json.loads(listed.stdout)] == [job_id]
    limited = await asyncio.to_thread(run, "jobs", "list", "--limit", "1", "--user", "ann", "--json")
    assert limited.exit_code == 0 and [r["job_id"] for r in json.loads(limited.stdout)] == [job_id]
    table = await asyncio.to_thread(run, "jobs", "list", "-n", "5", "-s", "CD")
    assert table.exit_code == 0 and "SUCCEE" in table.stdout, table.output


async def test_a_retry_past_the_dedupe_window_is_answered_duplicate_from_the_hot_view_and_from_the_archive(
    intake: IntakeProcess, bus: Client, jobs_kv: KeyValue
) -> None:
    # Records written straight into the bucket and the archive: no `accepted` fact was ever published for these
    # ids, so the facts stream's dedupe cannot answer; only the intake's lookup of earlier submissions can.
    team = team_name()
    live_id, done_id = f"live-{uuid.uuid4().hex[:8]}", f"done-{uuid.uuid4().hex[:8]}"
    live = record(job_id_for(f"{team}/{live_id}"), team, state="RUNNING", submitted=time.time() - 7200)
    done = record(job_id_for(f"{team}/{done_id}"), team, state="SUCCEEDED", submitted=time.time() - 7200)
    await hot(jobs_kv, live)
    await JobArchive(bus.jetstream()).put(done)
    body = JobSpec.model_validate({"name": "train", "resources": {"gpus": 1}}).model_dump_json().encode()
    facts = (await bus.jetstream().stream_info(subjects.FACTS_STREAM)).state.last_seq
    code, listed, _ = await ask(bus, LIST, {"state": "R"}, team)  # a listing waits for the copy to follow
    assert code == 200 and [r["job_id"] for r in listed["jobs"]] == [live.job_id]
    for sub_id, rec in ((live_id, live), (done_id, done)):
        msg = await bus.request(
            subjects.SUBMIT, body, timeout=10, headers={"Nats-Msg-Id": sub_id, "Oneplus-Team": team}
        )
        reply = json.loads(msg.data)
        assert reply["ok"] and reply["duplicate"] and reply["job_id"] == rec.job_id, reply
    assert (await bus.jetstream().stream_info(subjects.FACTS_STREAM)).state.last_seq == facts, "no new job accepted"


async def test_the_hot_view_alone_answers_a_listing_of_live_states(
    intake: IntakeProcess, bus: Client, jobs_kv: KeyValue
) -> None:
    team = team_name()
    await hot(jobs_kv, *(record(f"j-{team}-{i}", team, state="ACCEPTED", submitted=1e9 + i) for i in range(3)))
    await JobArchive(bus.jetstream()).put(record(f"j-{team}-old", team))
    code, result, _ = await ask(bus, LIST, {"state": "PD", "limit": 3}, team)
    assert code == 200 and result["next"] is None and len(result["jobs"]) == 3, "no archive page after live states"
    code, result, _ = await ask(bus, LIST, {"limit": 3}, team)
    assert code == 200 and len(result["jobs"]) == 3 and result["next"], "the archive is next"
    code, result, _ = await ask(bus, LIST, {"limit": 3, "cursor": result["next"]}, team)
    assert code == 200 and [r["job_id"] for r in result["jobs"]] == [f"j-{team}-old"] and result["next"] is None


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"limit": 0}, "limit"),
        ({"limit": 1001}, "limit"),
        ({"limit": "ten"}, "limit"),
        ({"limit": True}, "limit"),
        ({"state": "RUNNING,DONE"}, "state"),
        ({"state": [1]}, "state"),
        ({"since": "last tuesday"}, "since"),
        ({"since": -5}, "since"),
        ({"user": 7}, "user"),
        ({"cursor": "not-a-cursor"}, "cursor"),
        ({"cursor": 12}, "cursor"),
    ],
)
async def test_a_bad_request_is_refused_naming_its_field(
    intake: IntakeProcess, bus: Client, payload: dict[str, Any], field: str
) -> None:
    code, error, _ = await ask(bus, LIST, payload)
    assert code == 400 and error.startswith(field), error


async def test_a_cursor_fits_only_the_filters_that_made_it(
    intake: IntakeProcess, bus: Client, jobs_kv: KeyValue
) -> None:
    team = team_name()
    await hot(jobs_kv, *(record(f"j-{team}-{i}", team, state="RUNNING", submitted=1e9 + i) for i in range(3)))
    code, result, _ = await ask(bus, LIST, {"limit": 1, "state": "RUNNING"}, team)
    assert code == 200 and result["next"]
    code, error, _ = await ask(bus, LIST, {"limit": 1, "state": "FAILED", "cursor": result["next"]}, team)
    assert code == 400 and "other filters" in error
    code, error, _ = await ask(bus, subjects.OPS_JOB_SHOW, {}, team)
    assert code == 400 and error.startswith("job_id")


def test_the_cli_says_what_is_wrong_with_since_and_state() -> None:
    bad_since = CliRunner().invoke(cli, ["jobs", "list", "--since", "last tuesday", "--nats", "nats://127.0.0.1:1"])
    assert bad_since.exit_code == 2 and "--since: 'last tuesday' is not a time" in bad_since.stderr
    bad_state = CliRunner().invoke(cli, ["jobs", "list", "--state", "R,DONE", "--nats", "nats://127.0.0.1:1"])
    assert bad_state.exit_code == 2 and "--state: 'DONE' is not a job state" in bad_state.stderr


# --- the whole platform: the job owner moves a finished job to the archive ------------------------------------------
@pytest.mark.e2e
async def test_the_job_owner_moves_a_finished_job_to_the_archive_where_show_and_list_find_it(tmp_path: Path) -> None:
    servers = EmbeddedServers(workdir=tmp_path / "servers").start()  # its own: the intake above keeps its bus
    env = {"ONEPLUS_MIN_JOB_AGE_S": "1", "ONEPLUS_HTTP_PORT": "off", "ONEPLUS_HEARTBEAT_S": "0.5"}
    platform = Platform(
        servers.nats_url, servers.redis_url, nodes=DEMO_NODES[:1], logdir=tmp_path / "logs", extra_env=env
    ).start()
    try:
        async with OnePlusClient.connect(servers.nats_url, team="nlp", timeout=10) as c:
            await wait_for_platform(c, 1, timeout=120)
            spec = JobSpec.model_validate({"name": "short", "resources": {"gpus": 1}, "simulate": {"duration_s": 0.2}})
            reply = await c.submit(spec, msg_id=uuid.uuid4().hex)
            assert reply.ok and reply.job_id, reply.error
            job_id = reply.job_id
            js = c.nc.jetstream()
            archive = JobArchive(js)
            deadline = time.monotonic() + 90
            # Finished, then archived by the owner's next state save (every second); its key is never left in the
            # bucket of live records.
            while (archived := await archive.get(job_id)) is None or job_id in dict(
                await latest_items(js, subjects.JOBS_KV)
            ):
                assert time.monotonic() < deadline, f"{job_id} never left the hot view: {await c.get_job(job_id)}"
                await asyncio.sleep(0.5)
            assert archived.state == "SUCCEEDED"
            assert await c.get_job(job_id) == archived, "jobs show finds it in the archive"
            assert [r.job_id for r in await c.list_jobs(state="SUCCEEDED")] == [job_id]
            assert [r.job_id for r in await c.list_jobs(state="CD", since=time.time() - 300)] == [job_id]
            assert await c.list_jobs(state="RUNNING,PD") == []
        async with OnePlusClient.connect(servers.nats_url, team="vision") as other:
            with pytest.raises(PlatformError, match="no job"):
                await other.get_job(job_id)
    finally:
        platform.stop()
        servers.stop()
