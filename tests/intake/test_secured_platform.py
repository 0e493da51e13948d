"""The whole platform on the deploy/nats configuration: every service connects as its own NATS user with only its
own permissions, a team submits through its account, and the gangs run to the end without one permission refused."""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from oneplus_contracts import JobSpec
from oneplus_reservations import ReservationStore
from secured_nats import SecuredNats

from oneplus.client import OnePlusClient
from oneplus.demo import wait_for_platform
from oneplus.devstack import DEMO_NODES, SERVICE_MODULES, free_port, spawn, stop

pytestmark = pytest.mark.e2e
NODES = DEMO_NODES[:2]  # the two nodes deploy/nats has executor users for


class SecuredPlatform:
    def __init__(self, nats: SecuredNats, redis_url: str, workdir: Path) -> None:
        self.nats = nats
        self.redis_url = redis_url
        self.workdir = workdir
        self.cluster = f"sec{uuid.uuid4().hex[:8]}"
        self.procs: dict[str, Any] = {}

    def env(self, user: str) -> dict[str, str]:
        import os

        return {
            **os.environ,
            "NATS_URL": self.nats.url(user),
            "REDIS_URL": self.redis_url,
            "ONEPLUS_CLUSTER": self.cluster,
            "ONEPLUS_HTTP_PORT": str(free_port()),
            "ONEPLUS_HEARTBEAT_S": "0.5",
            "PYTHONUNBUFFERED": "1",
        }

    def start(self) -> SecuredPlatform:
        for name, module in SERVICE_MODULES.items():
            self.procs[name] = spawn([sys.executable, "-m", module], self.workdir / f"{name}.log", self.env(name))
        for node in NODES:
            argv = [sys.executable, "-m", "oneplus_node_executor", "--node", node.name, "--topology", node.topology]
            argv += ["--runtime", "simulated", "--leaf", node.leaf or "", "--spine", node.spine or ""]
            user = f"executor-{node.name}"
            self.procs[user] = spawn(argv, self.workdir / f"{user}.log", self.env(user))
        return self

    def dead(self) -> dict[str, int]:
        return {n: p.returncode for n, p in self.procs.items() if p.poll() is not None}

    def stop(self) -> None:
        stop(list(self.procs.values()))


@pytest.fixture(scope="module")
def platform(servers, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredPlatform]:  # type: ignore[no-untyped-def]
    workdir = Path(tmp_path_factory.mktemp("secured-platform"))
    nats_server = SecuredNats(workdir).start()
    p = SecuredPlatform(nats_server, servers.redis_url, workdir).start()
    try:
        yield p
    finally:
        p.stop()
        nats_server.stop()
        asyncio.run(ReservationStore(aioredis.Redis.from_url(servers.redis_url), cluster=p.cluster).wipe())


def gang(name: str, ranks: int, gpus: int) -> JobSpec:
    return JobSpec.model_validate(
        {"name": name, "ranks": ranks, "resources": {"gpus": gpus}, "simulate": {"duration_s": 0.3}}
    )


async def test_gangs_of_a_team_run_to_the_end_with_every_service_on_its_own_permissions(
    platform: SecuredPlatform,
) -> None:
    async with OnePlusClient.connect(platform.nats.url("admin")) as admin:
        await wait_for_platform(admin, len(NODES), timeout=120)
        async with (
            OnePlusClient.connect(platform.nats.url("nlp-ci")) as nlp,
            OnePlusClient.connect(platform.nats.url("vision-ci")) as vision,
        ):
            ids = []
            for spec in (gang("one", 1, 1), gang("two", 1, 2), gang("node", 1, 8), gang("pair", 2, 8)):
                reply = await nlp.submit(spec, msg_id=uuid.uuid4().hex)
                assert reply.ok, reply.error
                ids.append(reply.job_id)
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                jobs = {r.job_id: r for r in await admin.list_jobs()}
                if all(i in jobs and jobs[i].terminal for i in ids):
                    break
                await asyncio.sleep(0.5)
            assert await vision.list_jobs() == [], "another team sees none of them"
    assert {jobs[i].state for i in ids} == {"SUCCEEDED"}, {i: (jobs[i].state, jobs[i].reason) for i in ids}
    assert {(jobs[i].spec.team, jobs[i].spec.user) for i in ids} == {("nlp", "nlp-ci")}
    assert platform.dead() == {}
    refused = [line for line in (platform.workdir / "nats-server.log").read_text().splitlines() if "Violation" in line]
    assert refused == [], "a service needed a subject its NATS user may not use:\n" + "\n".join(refused[:10])


async def test_reservations_and_scancel_signal_work_on_the_services_own_permissions(platform: SecuredPlatform) -> None:
    """The intake writes the reservation bucket and sends a team's signal to its job's node; a team lists the
    reservations and signals its own job only (another team's is 404); no service needs a subject it may not use."""
    from oneplus_contracts import subjects
    from oneplus_contracts.advance import AdvanceReservationRequest

    node = NODES[1].name
    async with (
        OnePlusClient.connect(platform.nats.url("admin")) as admin,
        OnePlusClient.connect(platform.nats.url("nlp-ci")) as nlp,
        OnePlusClient.connect(platform.nats.url("vision-ci")) as vision,
    ):
        await wait_for_platform(admin, len(NODES), timeout=120)
        start = time.time() + 7200
        made = await admin.create_reservation(
            AdvanceReservationRequest(name="secured", nodes=[node], start_ts=start, end_ts=start + 3600, teams=["nlp"])
        )
        assert made.nodes == [node]
        assert [(r["name"], r["state"]) for r in await nlp.reservations()] == [("secured", "WAITING")]

        reply = await nlp.submit(
            JobSpec.model_validate({"name": "sig", "resources": {"gpus": 1}, "simulate": {"duration_s": 60}}),
            msg_id=uuid.uuid4().hex,
        )
        assert reply.ok and reply.job_id, reply.error
        deadline = time.monotonic() + 60
        while (rec := await nlp.get_job(reply.job_id)).state != "RUNNING":
            assert time.monotonic() < deadline and not rec.terminal, rec
            await asyncio.sleep(0.3)
        with pytest.raises(Exception, match=f"^no job '{reply.job_id}'$"):
            await vision.signal(reply.job_id, "USR1")
        sent = await nlp.signal(reply.job_id, "USR1")
        assert sent["signal"] == "SIGUSR1" and rec.allocation is not None and sent["nodes"] == rec.allocation.nodes
        logs = f"{subjects.PREFIX}.ops.node.{sent['nodes'][0]}.logs"
        while "received SIGUSR1" not in (await admin.ops(logs, {"job_id": reply.job_id}))["lines"]:
            assert time.monotonic() < deadline, "the executor never delivered the signal"
            await asyncio.sleep(0.3)
        await nlp.cancel(reply.job_id)
        assert await admin.delete_advance_reservation("secured")
    refused = [line for line in (platform.workdir / "nats-server.log").read_text().splitlines() if "Violation" in line]
    assert refused == [], "a service needed a subject its NATS user may not use:\n" + "\n".join(refused[:10])
