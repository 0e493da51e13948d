"""Advance reservations through a real bus and intake: `oneplus reservation create|list|delete` store them in their
bucket, a bad one is refused in one line and stores nothing, and the intake refuses `--reservation` naming none or
one that does not admit the submitter (nothing else accepted is lost)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from intake_process import IntakeProcess, fresh_bus
from nats.aio.client import Client
from oneplus_contracts import GpuInfo, JobSpec, NodeRecord, NodeTopology, subjects
from typer.testing import CliRunner

from oneplus.cli.app import app as cli
from oneplus.client import OnePlusClient

TEAM_TOKEN = "nlp-reservations-token-0123"
ADMIN = "platform-reservations-token-0123"


@pytest.fixture(scope="module")
async def intake(servers, tmp_path_factory) -> AsyncIterator[IntakeProcess]:  # type: ignore[no-untyped-def]
    await fresh_bus(servers.nats_url)
    proc = await IntakeProcess(
        servers.nats_url,
        Path(tmp_path_factory.mktemp("intake-advance")),
        env={
            "ONEPLUS_METRICS_PORT": "0",
            "ONEPLUS_HTTP_TOKENS": f"nlp={TEAM_TOKEN}",
            "ONEPLUS_HTTP_ADMIN_TOKEN": ADMIN,
        },
        redis_url=servers.redis_url,
    ).start()
    try:
        yield proc
    finally:
        proc.stop()


def job(reservation: str | None, user: str = "ana", team: str = "default") -> JobSpec:
    return JobSpec.model_validate(
        {"name": "j", "user": user, "team": team, "resources": {"gpus": 1}, "reservation": reservation}
    )


async def submit(url: str, spec: JobSpec) -> tuple[bool, str | None]:
    async with OnePlusClient.connect(url, timeout=10) as c:
        reply = await c.submit(spec, msg_id=uuid.uuid4().hex)
        return reply.ok, reply.error


async def cli_run(url: str, *args: str) -> tuple[int, str, str]:
    """The CLI as a user runs it (its own event loop: in a thread beside the test's)."""
    got = await asyncio.to_thread(CliRunner().invoke, cli, ["reservation", *args, "--nats", url])
    if got.exception is not None and not isinstance(got.exception, SystemExit):
        raise got.exception
    return got.exit_code, got.stdout, got.stderr


async def test_create_list_refuse_and_delete(intake: IntakeProcess) -> None:
    url = intake.nats_url
    code, out, err = await cli_run(url, "create", "maint1", "--nodes", "gpu[01-02]", "--start", "now+2h", "--duration",
                                   "4h", "--users", "ana", "--maint")  # fmt: skip
    assert code == 0 and out.strip() == "reservation maint1 created", (out, err)
    rows = json.loads((await cli_run(url, "list", "--json"))[1])
    assert [(r["name"], r["state"], r["nodes"], r["maint"]) for r in rows] == [
        ("maint1", "WAITING", "gpu[01-02]", True)
    ]
    # Refused, each in one line, and nothing stored.
    for args, says in [
        (["over", "--nodes", "gpu02", "--start", "now+3h", "--duration", "60"],
         "error: reservation over overlaps reservation maint1 on gpu02 ("),
        (["past", "--nodes", "gpu03", "--start", str(time.time() - 7200), "--duration", "30m"],
         "error: reservation past ends at "),
        (["maint1", "--nodes", "gpu09", "--duration", "1h"], "error: reservation maint1 already exists"),
        (["nobody", "--nodes", "gpu03", "--duration", "1h"], "error: reservation nobody: admits nobody"),
        (["bad", "--nodes", "gpu03", "--duration", "soon"], "error: 'soon' is not a duration"),
        (["g", "--gpus", "8", "--duration", "1h"], "error: reservation g: the cluster has no nodes to hold GPUs"),
        (["both", "--nodes", "gpu03", "--gpus", "8", "--duration", "1h"], "error: give one of --nodes and --gpus"),
        (["neither", "--duration", "1h"], "error: give one of --nodes and --gpus"),
    ]:  # fmt: skip
        who = [] if "nobody" in args else ["--teams", "ops"]
        code, _, err = await cli_run(url, "create", *args, *who)
        assert code == 2 and err.startswith(says) and err.count("\n") == 1, (args, err)
    assert [r["name"] for r in json.loads((await cli_run(url, "list", "--json"))[1])] == ["maint1"]
    # The intake follows the bucket: --reservation naming none, or one that does not admit the user, is refused.
    ok, error = await submit(url, job("nope"))
    assert not ok and error is not None and "--reservation nope: no such reservation" in error
    ok, error = await submit(url, job("maint1", user="bob"))
    assert not ok and error is not None and "--reservation maint1 does not admit user bob (team default)" in error
    assert (await submit(url, job("maint1")))[0]
    assert (await submit(url, job(None, user="bob")))[0]  # a job naming none is not affected
    code, out, _ = await cli_run(url, "delete", "maint1")
    assert code == 0 and out.strip() == "reservation maint1 deleted"
    code, _, err = await cli_run(url, "delete", "maint1")
    assert code == 2 and err.strip() == "error: no reservation 'maint1'"
    assert json.loads((await cli_run(url, "list", "--json"))[1]) == []


async def put_nodes(url: str, gpus: dict[str, int]) -> None:
    import nats

    nc: Client = await nats.connect(url)
    try:
        kv = await nc.jetstream().key_value(subjects.TOPOLOGY_KV)
        for node, count in gpus.items():
            topo = NodeTopology(node=node, gpu_model="H100", gpus=[GpuInfo(index=i) for i in range(count)])
            await kv.put(node, NodeRecord(topology=topo).model_dump_json().encode())
    finally:
        await nc.close()


def http(proc: IntakeProcess, method: str, path: str, token: str, body: object = None) -> tuple[int, dict[str, object]]:
    raw = b"" if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    return proc.request(method, path, raw, headers)


async def test_a_gpu_count_picks_whole_nodes_and_the_cli_and_http_api_refuse_in_the_same_line(
    intake: IntakeProcess,
) -> None:
    url = intake.nats_url
    await put_nodes(url, {"gpu01": 8, "gpu02": 8, "gpu03": 4})
    start = time.time() + 3600
    args = ["--start", str(start), "--duration", "2h", "--teams", "ops"]
    deadline = time.monotonic() + 15
    while True:  # until the intake follows the nodes just stored
        code, out, err = await cli_run(url, "create", "big", "--gpus", "16", *args)
        if code == 0 or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.2)
    assert code == 0 and out.strip() == "reservation big created on gpu[01-02]", (out, err)
    rows = json.loads((await cli_run(url, "list", "--json"))[1])
    assert [(r["name"], r["nodes"], r["gpus"], r["state"]) for r in rows] == [("big", "gpu[01-02]", 16, "WAITING")]

    # The same refusals, in the same one line, from the CLI and from POST /v1/reservations.
    later = {"start_ts": start + 1800, "end_ts": start + 5400, "teams": ["ops"]}
    cases = [
        (["more", "--gpus", "8"], {"name": "more", "gpus": 8}, 409,
         "reservation more: 8 GPUs asked but only 4 are free of other reservations from "),
        (["over", "--nodes", "gpu02"], {"name": "over", "nodes": ["gpu02"]}, 409,
         "reservation over overlaps reservation big on gpu02 ("),
        (["nowhere", "--nodes", "gpu09"], {"name": "nowhere", "nodes": "gpu09"}, 400,
         "reservation nowhere: node 'gpu09' is not in this cluster (it has gpu[01-03])"),
        (["big", "--gpus", "1"], {"name": "big", "gpus": 1}, 409, "reservation big already exists; delete it first"),
    ]  # fmt: skip
    for cli_args, body, status, says in cases:
        code, _, err = await cli_run(url, "create", *cli_args, "--start", str(later["start_ts"]),
                                     "--end", str(later["end_ts"]), "--teams", "ops")  # fmt: skip
        assert code == 2 and err.startswith(f"error: {says}") and err.count("\n") == 1, (cli_args, err)
        got_status, answer = await asyncio.to_thread(http, intake, "POST", "/v1/reservations", ADMIN, later | body)
        assert (got_status, answer["error"]) == (status, err.strip().removeprefix("error: ")), (body, answer)
    code, _, err = await cli_run(url, "create", "more", "--gpus", "8", "--start", str(later["start_ts"]), "--end",
                                 str(later["end_ts"]), "--teams", "ops")  # fmt: skip
    assert err.strip().endswith("(the cluster has 20; gpu[01-02] held by reservation big)"), err
    past = {"name": "past", "gpus": 4, "start_ts": time.time() - 7200, "end_ts": time.time() - 3600, "users": ["a"]}
    status, answer = await asyncio.to_thread(http, intake, "POST", "/v1/reservations", ADMIN, past)
    assert status == 400 and str(answer["error"]).startswith("reservation past ends at "), answer
    assert str(answer["error"]).endswith(", which is in the past"), answer
    for body, says in [
        (b"{not json", "the body is not JSON: "),
        ({"name": "x", "start_ts": start, "end_ts": start + 60, "teams": ["ops"]},
         "reservation x: give nodes or a GPU count, one of them"),
        ({"name": "x y", "gpus": 1, "start_ts": start, "end_ts": start + 60, "teams": ["ops"]},
         "reservation name 'x y' must be 1-64 letters"),
    ]:  # fmt: skip
        status, answer = await asyncio.to_thread(http, intake, "POST", "/v1/reservations", ADMIN, body)
        assert status == 400 and str(answer["error"]).startswith(says), answer

    # A team may list them, not create or delete them; over NATS a team caller is refused the same way.
    status, answer = await asyncio.to_thread(http, intake, "GET", "/v1/reservations", TEAM_TOKEN)
    assert status == 200 and [(r["name"], r["gpus"]) for r in answer["reservations"]] == [("big", 16)]  # type: ignore[union-attr]
    status, answer = await asyncio.to_thread(
        http, intake, "POST", "/v1/reservations", TEAM_TOKEN, later | {"name": "mine", "gpus": 4}
    )
    assert (status, answer["error"]) == (403, "creating a reservation is an operator's: team 'nlp' may not")
    async with OnePlusClient.connect(url, team="nlp", timeout=10) as c:
        with pytest.raises(Exception, match=r"^deleting a reservation is an operator's: team 'nlp' may not$"):
            await c.delete_advance_reservation("big")
    status, answer = await asyncio.to_thread(http, intake, "DELETE", "/v1/reservations/big", TEAM_TOKEN)
    assert (status, answer["error"]) == (403, "deleting a reservation is an operator's: team 'nlp' may not")

    # Over HTTP too, --reservation naming none or one that does not admit the team is refused in one line.
    for name, says in [
        ("nope", "--reservation nope: no such reservation"),
        ("big", "--reservation big does not admit user ana (team nlp)"),
    ]:
        body = job(name, team="nlp").model_dump_json(exclude_none=True).encode()
        status, answer = await asyncio.to_thread(http, intake, "POST", "/v1/jobs", TEAM_TOKEN, body)
        assert (status, answer["error"]) == (422, says), answer
    # A job naming a reservation created a moment ago is accepted (the intake reads the bucket for a name it lacks).
    quick = {"name": "quick", "nodes": "gpu03", "start_ts": start, "end_ts": start + 60, "users": ["ana"]}
    assert (await asyncio.to_thread(http, intake, "POST", "/v1/reservations", ADMIN, quick))[0] == 201
    assert await submit(url, job("quick")) == (True, None)
    assert (await asyncio.to_thread(http, intake, "DELETE", "/v1/reservations/quick", ADMIN))[0] == 200

    # A job waiting for it is counted beside it in `oneplus queue` (the solver's reason names it).
    assert (await submit(url, job("big", team="ops")))[0]
    deadline = time.monotonic() + 30
    while True:
        got = await asyncio.to_thread(CliRunner().invoke, cli, ["queue", "--nats", url])
        line = next((ln for ln in got.stdout.splitlines() if ln.startswith("big ")), "")
        if line.split()[-1:] == ["1"] or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.3)
    assert got.exit_code == 0 and "RESERVATION" in got.stdout, got.output
    assert line.split()[:4] == ["big", "WAITING", "gpu[01-02]", "16"] and line.split()[-1] == "1", got.stdout

    status, answer = await asyncio.to_thread(http, intake, "DELETE", "/v1/reservations/big", ADMIN)
    assert (status, answer) == (200, {"name": "big", "deleted": True})
    status, answer = await asyncio.to_thread(http, intake, "DELETE", "/v1/reservations/big", ADMIN)
    assert (status, answer["error"]) == (404, "no reservation 'big'")
    assert json.loads((await cli_run(url, "list", "--json"))[1]) == []
