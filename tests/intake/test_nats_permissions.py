"""deploy/nats on a real nats-server: team accounts are walled off, service users publish only their own subjects,
and an intake running as its own user takes each request's team from the server's stamp, not from the caller."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
from intake_process import IntakeProcess
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import ConsumerConfig
from oneplus_contracts import CancelRanks, JobSpec, subjects
from oneplus_testing import Servers
from secured_nats import CONFIG, DEPLOY, SecuredNats

from oneplus.client import OnePlusClient, PlatformError
from oneplus.devstack import find_nats_server, spawn, stop


class Connection:
    """A connection as one user, remembering every permissions violation the server reported."""

    def __init__(self, nc: Client, violations: list[str]) -> None:
        self.nc = nc
        self.violations = violations

    @classmethod
    async def open(cls, url: str, **options: Any) -> Connection:
        violations: list[str] = []

        async def on_error(err: Exception) -> None:
            violations.append(str(err))

        return cls(await nats.connect(url, error_cb=on_error, allow_reconnect=False, **options), violations)

    async def saw_violation(self, text: str) -> bool:
        for _ in range(50):
            if any(text in v.lower() for v in self.violations):
                return True
            await asyncio.sleep(0.02)
        return False

    async def publish_is_refused(self, subject: str) -> bool:
        before = len(self.violations)
        await self.nc.publish(subject, b"{}")
        await self.nc.flush()
        for _ in range(20):  # the -ERR arrives after the PONG of flush at the latest; allow the reader a moment
            if len(self.violations) > before:
                break
            await asyncio.sleep(0.01)
        # nats-py lower-cases the whole -ERR line
        return any(
            f'permissions violation for publish to "{subject.lower()}"' in v.lower() for v in self.violations[before:]
        )


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredNats]:
    server = SecuredNats(Path(tmp_path_factory.mktemp("secured-nats"))).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
async def intake(
    secured: SecuredNats, servers: Servers, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[IntakeProcess]:
    proc = IntakeProcess(
        secured.url("intake"),
        Path(tmp_path_factory.mktemp("secured-intake")),
        redis_url=servers.redis_url,
        owner_url=secured.url("placement-solver"),
    )
    await proc.start()
    try:
        yield proc
    finally:
        proc.stop()


def test_the_shipped_config_is_valid_for_this_nats_server(secured: SecuredNats) -> None:
    out = subprocess.run(
        [find_nats_server(), "-c", str(CONFIG), "-t"], env=secured.env(), capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_team_import_shares_the_caller_so_the_server_stamps_it() -> None:
    text = (DEPLOY / "accounts.conf").read_text()
    imports = [line for line in text.splitlines() if "{service: {account: PLATFORM" in line]
    assert imports and all("share: true" in line for line in imports), "without share the caller can forge its team"


# --- service users ------------------------------------------------------------------------------------

SERVICE_SUBJECTS = [
    # Only the job owner (placement-solver) publishes job events and writes the hot view; the others report facts.
    ("intake", "oneplus.fact.job.j-1.accepted", True),
    ("intake", "oneplus.job.j-1.accepted", False),
    ("intake", "oneplus.job.j-1.rejected", True),
    ("intake", "oneplus.job.j-1.placed", False),
    ("intake", "$KV.jobs.j-1", False),
    ("intake", "oneplus.cmd.node.h100-0.launch", False),
    ("intake", "$KV.topology.h100-0", False),
    ("intake", "$JS.API.STREAM.DELETE.ONEPLUS_JOBS", False),
    ("placement-solver", "oneplus.cmd.node.h100-0.launch", True),
    ("placement-solver", "oneplus.job.j-1.running", True),
    ("placement-solver", "$KV.jobs.j-1", True),
    ("placement-solver", "oneplus.archive.j-1.SUCCEEDED.nlp.alice", True),
    ("placement-solver", "oneplus.outcome.job.j-1.accepted", True),  # a waiting reporter hears its fact folded
    ("intake", "oneplus.outcome.job.j-1.accepted", False),
    ("placement-solver", "oneplus.cmd.node.h100-0.preempt", True),  # the owner asks its victims to stand aside
    ("placement-solver", "oneplus.cmd.preemption.request", False),  # it records its victims itself
    ("placement-solver", "oneplus.node.h100-0.heartbeat", False),
    ("preemption", "oneplus.cmd.node.h100-0.preempt", False),  # the owner sends them, after the record
    ("preemption", "oneplus.fact.job.j-1.preempting", True),
    ("preemption", "oneplus.job.j-1.preempting", False),
    ("preemption", "oneplus.job.j-1.accepted", False),
    ("preemption", "$KV.jobs.j-1", False),
    ("topology-registry", "$KV.topology.h100-0", True),
    ("topology-registry", "$KV.node_heartbeats.h100-0", True),  # heartbeat times, in a bucket of their own
    ("placement-solver", "$KV.node_heartbeats.h100-0", False),
    ("executor-h100-0", "$KV.node_heartbeats.h100-0", False),
    ("topology-registry", "oneplus.job.j-1.accepted", False),
    ("executor-h100-0", "oneplus.node.h100-0.heartbeat", True),
    ("executor-h100-0", "oneplus.node.h100-1.heartbeat", False),
    ("executor-h100-0", "oneplus.node.h100-0.lease", True),  # alive, its last report holds
    ("executor-h100-0", "oneplus.node.h100-1.lease", False),
    ("executor-h100-0", "oneplus.nodes.report", False),  # asked for reports, never asks
    ("placement-solver", "oneplus.nodes.report", True),  # at its start, every node's ranks
    ("topology-registry", "oneplus.nodes.report", True),  # a lost node's full report before it counts again
    ("intake", "oneplus.nodes.report", False),
    ("executor-h100-0", "oneplus.cmd.node.h100-1.launch", False),
    ("executor-h100-0", "oneplus.job.j-1.placed", False),
    ("executor-h100-0", "$KV.jobs.j-1", False),
    ("executor-h100-1", "oneplus.fact.job.j-1.running", True),
    ("executor-h100-1", "oneplus.job.j-1.running", False),
    # The executor's facts straight to the job owner (core NATS requests); no other service reports on them.
    ("executor-h100-0", "oneplus.report.job.j-1.node_finished", True),
    ("executor-h100-0", "oneplus.report.job.j-1.accepted", False),
    ("intake", "oneplus.report.job.j-1.running", False),
    ("intake", "oneplus.report.job.j-1.accepted", True),
]


@pytest.mark.parametrize(("user", "subject", "allowed"), SERVICE_SUBJECTS)
async def test_a_service_user_publishes_only_its_own_subjects(
    secured: SecuredNats, user: str, subject: str, allowed: bool
) -> None:
    admin = await Connection.open(secured.url("admin"))
    who = await Connection.open(secured.url(user))
    try:
        sub = await admin.nc.subscribe(subject)
        await admin.nc.flush()
        refused = await who.publish_is_refused(subject)
        got = None
        # An allowed publish must arrive; on a loaded machine give it a few tries (a refused one never may).
        for attempt in range(4 if allowed else 1):
            if attempt:
                await who.nc.publish(subject, b"{}")
                await who.nc.flush()
            try:
                got = await sub.next_msg(timeout=2.0 if allowed else 0.3)
                break
            except nats.errors.TimeoutError:
                got = None
        assert refused is (not allowed), who.violations
        assert (got is not None) is allowed
    finally:
        await who.nc.close()
        await admin.nc.close()


async def test_the_intake_hears_the_owner_tell_the_outcome_of_the_facts_it_waits_for(secured: SecuredNats) -> None:
    intake = await Connection.open(secured.url("intake"))
    solver = await Connection.open(secured.url("placement-solver"))
    try:
        for event_type in ("accepted", "cancel_requested"):
            sub = await intake.nc.subscribe(subjects.fact_outcome("*", event_type))
            await intake.nc.flush()
            heard = None
            for _ in range(4):  # as above: an allowed publish on a loaded machine may need another try
                await solver.nc.publish(subjects.fact_outcome("j-1", event_type), b"{}")
                await solver.nc.flush()
                with contextlib.suppress(nats.errors.TimeoutError):
                    heard = await sub.next_msg(timeout=2.0)
                    break
            assert heard is not None and heard.subject == subjects.fact_outcome("j-1", event_type)
        assert not intake.violations and not solver.violations
    finally:
        await intake.nc.close()
        await solver.nc.close()


async def test_the_owner_answers_an_executors_direct_report_to_its_own_inbox(secured: SecuredNats) -> None:
    executor = await Connection.open(secured.url("executor-h100-0"), inbox_prefix="_INBOX.executor-h100-0")
    solver = await Connection.open(secured.url("placement-solver"))
    try:

        async def answer(msg: Msg) -> None:
            await msg.respond(b"folded")

        await solver.nc.subscribe(subjects.JOB_REPORTS_ALL, queue=subjects.JOB_REPORTS_QUEUE, cb=answer)
        await solver.nc.flush()
        reply = None
        for _ in range(4):  # as above: on a loaded machine an allowed request may need another try
            # No responders too (once in a serial suite run, once in a parallel one; 51 of 51 alone): a refused publish
            # is a permissions violation, counted below, so a retry hides no refusal.
            with contextlib.suppress(nats.errors.TimeoutError, nats.errors.NoRespondersError):
                reply = await executor.nc.request(subjects.job_report("j-1", "running"), b"{}", timeout=2.0)
                break
            await asyncio.sleep(0.2)
        assert reply is not None and reply.data == b"folded"
        assert not executor.violations and not solver.violations
    finally:
        await executor.nc.close()
        await solver.nc.close()


# --- a node's executor ---------------------------------------------------------------------------------


async def test_an_executor_runs_as_its_node_user_and_cannot_open_another_nodes_commands(
    secured: SecuredNats, servers: Servers, tmp_path: Path
) -> None:
    admin = await Connection.open(secured.url("admin"))
    js = admin.nc.jetstream()
    beats = await admin.nc.subscribe(subjects.node_heartbeat("h100-0"))
    env = {
        **os.environ,
        "NATS_URL": secured.url("executor-h100-0"),
        "REDIS_URL": servers.redis_url,
        "PYTHONUNBUFFERED": "1",
    }
    argv = [sys.executable, "-m", "oneplus_node_executor", "--node", "h100-0"]
    argv += ["--topology", "h100_sxm_8gpu_nvswitch_nv18", "--runtime", "simulated"]
    log = tmp_path / "executor.log"
    proc = spawn(argv, log, env)
    try:
        # Its heartbeat means it declared streams and buckets and opened its consumer under its own permissions.
        try:
            await beats.next_msg(timeout=60)
        except nats.errors.TimeoutError:
            pytest.fail(f"no heartbeat from the executor:\n{log.read_text(errors='replace')[-4000:]}")
        info = await js.consumer_info(subjects.COMMANDS_STREAM, "executor-h100-0")
        assert info.config.filter_subject == subjects.node_commands_of("h100-0")
        assert (info.config.deliver_subject or "").startswith("_INBOX.executor-h100-0.")
        cmd = CancelRanks(command_id="c-perm", job_id="j-none", node="h100-0", token=1, reason="permissions test")
        ack = await js.publish(subjects.node_command("h100-0", "cancel"), cmd.model_dump_json().encode())
        deadline = time.monotonic() + 30
        while True:  # delivered to its inbox and acknowledged on its own ack subject
            info = await js.consumer_info(subjects.COMMANDS_STREAM, "executor-h100-0")
            if info.ack_floor.stream_seq >= ack.seq:
                break
            assert time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
            await asyncio.sleep(0.2)
        assert "permissions violation" not in log.read_text(errors="replace").lower()
    finally:
        stop([proc])

    who = await Connection.open(secured.url("executor-h100-0"), inbox_prefix="_INBOX.executor-h100-0")
    try:
        theirs = who.nc.jetstream(timeout=1.0)
        other = "oneplus.cmd.node.h100-1.>"
        attempts = [  # another node's consumer; its own name on another node's commands; the unnamed legacy API
            ConsumerConfig(name="executor-h100-1", durable_name="executor-h100-1", filter_subject=other),
            ConsumerConfig(name="executor-h100-0", durable_name="executor-h100-0", filter_subject=other),
            ConsumerConfig(durable_name="snoop", filter_subject=other),
        ]
        for config in attempts:
            config.deliver_subject = "_INBOX.executor-h100-0.snoop"
            with pytest.raises((nats.errors.TimeoutError, nats.js.errors.APIError)):
                await theirs.add_consumer(subjects.COMMANDS_STREAM, config=config)
        assert await who.saw_violation('permissions violation for publish to "$js.api.consumer')
        for name in ("executor-h100-1", "snoop"):
            with pytest.raises(nats.js.errors.NotFoundError):
                await js.consumer_info(subjects.COMMANDS_STREAM, name)
        await who.nc.subscribe("_INBOX.>")  # everybody's replies and deliveries
        await who.nc.flush()
        assert await who.saw_violation('permissions violation for subscription to "_inbox.>"')
    finally:
        await who.nc.close()
        await admin.nc.close()


# --- team accounts -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "subject",
    [
        "oneplus.ops.node.drain",
        "oneplus.job.j-1.accepted",
        "oneplus.cmd.node.h100-0.launch",
        "$SRV.PING",
        "team.vision.x",
    ],
)
async def test_a_team_user_may_not_publish_beyond_the_platform_services_it_imports(
    secured: SecuredNats, subject: str
) -> None:
    nlp = await Connection.open(secured.url("nlp-ci"))
    try:
        assert await nlp.publish_is_refused(subject)
    finally:
        await nlp.nc.close()


async def test_a_team_cannot_reach_or_overhear_another_teams_subjects(
    secured: SecuredNats, intake: IntakeProcess
) -> None:
    alice = await Connection.open(secured.url("nlp-alice"))
    vision = await Connection.open(secured.url("vision-ci"))
    try:
        overheard = await alice.nc.subscribe("_INBOX.>")
        listening = await vision.nc.subscribe("_INBOX.vision-only")
        await alice.nc.flush()
        await vision.nc.flush()
        # vision asks the platform; the reply travels inside vision's account only
        reply = await vision.nc.request(f"{subjects.PREFIX}.ops.job.list", b"{}", timeout=5)
        assert json.loads(reply.data)["ok"] is True
        # nlp may not even publish on an inbox; and were it allowed, the name would be nlp's own, not vision's
        assert await alice.publish_is_refused("_INBOX.vision-only")
        with pytest.raises(nats.errors.TimeoutError):
            await listening.next_msg(timeout=0.3)
        with pytest.raises(nats.errors.TimeoutError):
            await overheard.next_msg(timeout=0.3)  # vision's request and its reply never showed in nlp's account
    finally:
        await alice.nc.close()
        await vision.nc.close()


def job(name: str, **kw: object) -> JobSpec:
    return JobSpec.model_validate({"name": name, "resources": {"gpus": 1}, **kw})


async def test_the_team_of_a_request_is_the_callers_account(secured: SecuredNats, intake: IntakeProcess) -> None:
    async with (
        OnePlusClient.connect(secured.url("nlp-ci")) as nlp,
        OnePlusClient.connect(secured.url("vision-ci")) as vision,
        OnePlusClient.connect(secured.url("admin")) as admin,
    ):
        mine = await nlp.submit(job("nlp-train"), msg_id=uuid.uuid4().hex)
        theirs = await vision.submit_cloudevent(job("vision-train"), "/ci/vision", uuid.uuid4().hex, mode="binary")
        assert mine.ok and theirs.ok, (mine.error, theirs.error)
        rec = await nlp.get_job(mine.job_id or "")
        assert (rec.spec.team, rec.spec.user) == ("nlp", "nlp-ci"), "team and user come from the NATS account"

        assert [r.job_id for r in await vision.list_jobs()] == [theirs.job_id]
        with pytest.raises(PlatformError, match="no job"):
            await vision.get_job(mine.job_id or "")
        with pytest.raises(PlatformError, match="no job"):
            await vision.cancel(mine.job_id or "")
        assert not (await admin.get_job(mine.job_id or "")).cancel_requested

        done = await nlp.cancel(mine.job_id or "")
        assert done["cancel_requested"] is True
        assert (await admin.get_job(mine.job_id or "")).reason == "cancelled by nlp-ci"
        assert {r.spec.team for r in await admin.list_jobs()} == {"nlp", "vision"}, "an operator sees every team"


async def test_a_team_cannot_act_as_another_even_by_forging_the_servers_header(
    secured: SecuredNats, intake: IntakeProcess
) -> None:
    forged = {"Nats-Request-Info": json.dumps({"acc": "vision", "user": "vision-ci"}), "Oneplus-Team": "vision"}
    nc = await nats.connect(secured.url("nlp-ci"))
    try:
        msg = await nc.request(
            subjects.SUBMIT, job("sneaky", team="vision").model_dump_json().encode(), 5, headers=forged
        )
        reply = json.loads(msg.data)
        assert not reply["ok"] and "NATS account 'nlp' acts for team 'nlp' only, not 'vision'" in reply["error"]
        spec = job("sneaky2", team="vision").model_dump_json().encode()
        msg = await nc.request(subjects.SUBMIT, spec, 5, headers={"Nats-Request-Info": forged["Nats-Request-Info"]})
        reply = json.loads(msg.data)
        assert not reply["ok"] and "names team 'vision' but the request comes from team 'nlp'" in reply["error"]
    finally:
        await nc.close()
    assert intake.alive()
