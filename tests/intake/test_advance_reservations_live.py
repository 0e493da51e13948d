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
from oneplus_contracts import JobSpec
from typer.testing import CliRunner

from oneplus.cli.app import app as cli
from oneplus.client import OnePlusClient


@pytest.fixture(scope="module")
async def intake(servers, tmp_path_factory) -> AsyncIterator[IntakeProcess]:  # type: ignore[no-untyped-def]
    await fresh_bus(servers.nats_url)
    proc = await IntakeProcess(
        servers.nats_url,
        Path(tmp_path_factory.mktemp("intake-advance")),
        env={"ONEPLUS_METRICS_PORT": "0"},
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
