"""deploy/nats/cluster on three real nats-servers: the platform's streams and buckets kept on all three, and a
service connected with every server's URL that keeps publishing and reading after its stream's leader is killed."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import secrets
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import pytest
from faststream.nats import NatsMessage
from nats.aio.client import Client
from nats.js.errors import APIError
from oneplus_bus.fencing import FENCE_LANES, FENCED_STREAMS
from oneplus_bus.service import OneplusService
from oneplus_bus.settings import BusSettings
from oneplus_bus.streams import KV_HISTORY, ensure_kv, ensure_streams
from oneplus_contracts import JobAccepted, JobFinished, JobSpec, subjects
from oneplus_placement_solver.owner import JobOwner, NotOwner
from oneplus_stores.archive import JobArchive

from oneplus.devstack import find_nats_server, free_port, spawn, wait_port

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "nats"
CLUSTER_CONFIG = DEPLOY / "cluster" / "nats-server.conf"
PASSWORD_VARS = sorted(set(re.findall(r"\$(NATS_\w+_PASSWORD)", (DEPLOY / "accounts.conf").read_text())))


@dataclass
class Server:
    name: str
    client_port: int
    cluster_port: int
    http_port: int
    proc: subprocess.Popen[bytes] | None = None


@dataclass
class Cluster:
    workdir: Path
    servers: list[Server] = field(default_factory=list)
    # nats-server parses an environment value as a config token: start it with a letter, keep it alphanumeric
    passwords: dict[str, str] = field(default_factory=lambda: {v: "pw" + secrets.token_hex(12) for v in PASSWORD_VARS})

    def env(self, server: Server) -> dict[str, str]:
        routes = {f"NATS_ROUTE_{i}": f"nats://127.0.0.1:{s.cluster_port}" for i, s in enumerate(self.servers)}
        store = self.workdir / server.name / "store"
        return {**os.environ, **self.passwords, **routes, "NATS_SERVER_NAME": server.name, "NATS_STORE_DIR": str(store)}

    def config(self, server: Server) -> Path:
        """The shipped file with this server's ports (three servers share one loopback), beside accounts.conf."""
        text = CLUSTER_CONFIG.read_text()
        for port, mine in (("4222", server.client_port), ("6222", server.cluster_port), ("8222", server.http_port)):
            assert f"0.0.0.0:{port}" in text
            text = text.replace(f"0.0.0.0:{port}", f"127.0.0.1:{mine}")
        root = self.workdir / server.name
        (root / "cluster").mkdir(parents=True, exist_ok=True)
        (root / "accounts.conf").write_text((DEPLOY / "accounts.conf").read_text())
        path = root / "cluster" / "nats-server.conf"
        path.write_text(text)
        return path

    def start(self, server: Server) -> None:
        argv = [find_nats_server(), "-c", str(self.config(server))]
        server.proc = spawn(argv, self.workdir / f"{server.name}.log", self.env(server))

    def url(self, user: str = "admin") -> str:
        password = self.passwords[f"NATS_{user.upper().replace('-', '_')}_PASSWORD"]
        return ",".join(f"nats://{user}:{password}@127.0.0.1:{s.client_port}" for s in self.servers)

    def by_name(self, name: str) -> Server:
        return next(s for s in self.servers if s.name == name)

    def stop(self) -> None:
        for s in self.servers:
            if s.proc is not None and s.proc.poll() is None:
                s.proc.kill()
                s.proc.wait()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(Path(tmp_path_factory.mktemp("nats-cluster")))
    c.servers = [Server(f"oneplus-nats-{i}", free_port(), free_port(), free_port()) for i in range(3)]
    try:
        for s in c.servers:
            c.start(s)
        for s in c.servers:
            assert s.proc is not None
            wait_port(s.client_port, proc=s.proc)
        yield c
    finally:
        c.stop()


async def connect(url: str) -> Client:
    async def quiet(exc: Exception) -> None:
        return None

    return await nats.connect(
        servers=url.split(","), error_cb=quiet, max_reconnect_attempts=-1, reconnect_time_wait=0.2
    )


async def until(check: Any, timeout: float = 30.0) -> Any:
    """check() until it returns something true without raising; its last error if it never does."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = await check()
            if result:
                return result
        except (APIError, nats.errors.Error, TimeoutError) as exc:
            if time.monotonic() > deadline:
                raise AssertionError(f"not within {timeout}s: {exc!r}") from exc
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s")
        await asyncio.sleep(0.2)


@pytest.fixture(scope="module")
async def admin(cluster: Cluster) -> AsyncIterator[Client]:
    nc = await connect(cluster.url("admin"))
    js = nc.jetstream()

    async def meta_leader() -> bool:
        await js.account_info()  # answers once the three servers have elected a JetStream meta leader
        return True

    await until(meta_leader, 60)
    try:
        yield nc
    finally:
        await nc.close()


def test_the_shipped_cluster_config_is_valid_for_this_nats_server(cluster: Cluster) -> None:
    server = cluster.servers[0]
    out = subprocess.run(
        [find_nats_server(), "-c", str(CLUSTER_CONFIG), "-t"],
        env=cluster.env(server),
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    text = CLUSTER_CONFIG.read_text()
    assert "domain: oneplus" in text and "include ../accounts.conf" in text


async def test_streams_and_buckets_are_kept_on_all_three_servers(admin: Client) -> None:
    js = admin.jetstream()
    # Made with one copy first (a platform that ran before the cluster setting), then re-replicated to three.
    await until(lambda: _declare(js, 1))
    assert (await js.stream_info(subjects.JOBS_STREAM)).config.num_replicas == 1
    await until(lambda: _declare(js, 3))
    for name in [*subjects.STREAMS, *(f"KV_{bucket}" for bucket in KV_HISTORY)]:
        info = await js.stream_info(name)
        assert info.config.num_replicas == 3, name
        await until(lambda name=name: all_current(js, name))  # the new copies catch up within moments


async def all_current(js: Any, name: str) -> bool:
    """A leader and two followers that hold everything: the stream survives the loss of any one server."""
    cluster = (await js.stream_info(name)).cluster
    replicas = (cluster.replicas or []) if cluster is not None else []
    return bool(cluster and cluster.leader) and len(replicas) == 2 and all(r.current for r in replicas)


async def _declare(js: Any, replicas: int) -> bool:
    await ensure_streams(js, replicas=replicas)
    await ensure_kv(js, replicas=replicas)
    return True


async def test_the_owner_fence_holds_on_replicated_streams(admin: Client) -> None:
    """On R3 streams a leader lets one expected-sequence check per subject be in flight (err 10164 for the next): the
    owner's pipelined writes, spread over the fence lanes, all land; a deposed owner's are refused and none lands."""
    js = admin.jetstream()
    await until(lambda: _declare(js, 3))
    state_kv = await js.key_value(subjects.SOLVER_STATE_KV)
    old = JobOwner(js, JobArchive(js), min_age_s=0, state_kv=state_kv, nc=admin, me="old")
    await old.bootstrap(epoch=100)
    n = 3 * FENCE_LANES  # more writes in one batch than there are lanes: some wait for their lane's previous ack
    spec = JobSpec(name="fenced", resources={"gpus": 1}, simulate={"duration_s": 60})  # type: ignore[arg-type]
    recs = await old.commit(*[JobAccepted(event_id=f"r3-a-{i}", job_id=f"r3-{i}", spec=spec) for i in range(n)])
    assert all(r is not None for r in recs) and len(old.index.pending) == n

    new = JobOwner(js, JobArchive(js), min_age_s=0, state_kv=state_kv, nc=admin, me="new")
    await new.bootstrap(epoch=101)
    assert sorted(new.index.pending) == sorted(f"r3-{i}" for i in range(n)), "all the old owner landed is read"
    before = {s: int((await js.stream_info(s)).state.last_seq or 0) for s in FENCED_STREAMS}
    with pytest.raises(NotOwner):
        await old.commit(
            *[JobFinished(event_id=f"r3-f-{i}", job_id=f"r3-{i}", state="SUCCEEDED", reason="done") for i in range(n)]
        )
    assert {s: int((await js.stream_info(s)).state.last_seq or 0) for s in FENCED_STREAMS} == before
    done = await new.commit(
        *[JobFinished(event_id=f"r3-g-{i}", job_id=f"r3-{i}", state="SUCCEEDED", reason="done") for i in range(n)]
    )
    assert all(r is not None and r.state == "SUCCEEDED" for r in done)


async def test_a_service_rides_out_the_loss_of_its_stream_leader(
    cluster: Cluster, admin: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    js = admin.jetstream()
    monkeypatch.setenv("ONEPLUS_STREAM_REPLICAS", "3")
    settings = BusSettings(nats_url=cluster.url("admin"), redis_url="redis://unused")
    assert len(settings.nats_servers) == 3
    svc = OneplusService("cluster-probe", "reads its own facts across a leader loss", settings)
    seen: list[str] = []

    @svc.durable_subscriber(
        "oneplus.fact.job.*.cluster_probe", stream=subjects.FACTS_STREAM, consumer="cluster-probe", title="probe"
    )
    async def on_fact(msg: NatsMessage) -> None:
        seen.append(msg.body.decode())

    await svc.app.start()
    try:
        # The case that matters most: the server the service is connected to leads the stream it uses.
        connected = f"127.0.0.1:{svc.nc.connected_url.port}" if svc.nc.connected_url else ""
        mine = next(s for s in cluster.servers if f"127.0.0.1:{s.client_port}" == connected)
        for _ in range(20):
            leader = (await js.stream_info(subjects.FACTS_STREAM)).cluster.leader  # type: ignore[union-attr]
            if leader == mine.name:
                break
            # NATS >= 2.11 hands leadership to a preferred server; an answer may be lost to the election itself.
            with contextlib.suppress(nats.errors.TimeoutError):
                body = json.dumps({"placement": {"preferred": mine.name}}).encode()
                await admin.request(f"$JS.API.STREAM.LEADER.STEPDOWN.{subjects.FACTS_STREAM}", body, timeout=5)
            await asyncio.sleep(0.5)
        assert leader == mine.name, "the stream's leadership never came to the service's server"

        async def publish(i: int) -> bool:
            await svc.broker.publish(f"m{i}", f"oneplus.fact.job.j-{i}.cluster_probe", stream=subjects.FACTS_STREAM)
            return True

        for i in range(5):
            await publish(i)
        await until(lambda: _has(seen, 5))
        await svc.kv[subjects.JOBS_KV].put("cluster-probe", b"before")

        for name in (subjects.FACTS_STREAM, f"KV_{subjects.JOBS_KV}"):
            await until(lambda name=name: all_current(js, name))
        assert mine.proc is not None
        mine.proc.kill()  # no goodbye: the leader and the service's connection are gone at once
        mine.proc.wait()

        for i in range(5, 10):
            await until(lambda i=i: publish(i))
        await until(lambda: _has(seen, 10))
        assert sorted(seen, key=lambda m: int(m[1:])) == [f"m{i}" for i in range(10)]
        new_leader = (await js.stream_info(subjects.FACTS_STREAM)).cluster.leader  # type: ignore[union-attr]
        assert new_leader and new_leader != mine.name
        assert svc.nc.is_connected and svc.nc.connected_url is not None
        assert svc.nc.connected_url.port != mine.client_port
        # Its buckets answer too: what was written before the loss is read back, a new write is kept.
        kv = svc.kv[subjects.JOBS_KV]
        assert (await until(lambda: kv.get("cluster-probe"))).value == b"before"
        await until(lambda: kv.put("cluster-probe", b"after"))
        assert (await kv.get("cluster-probe")).value == b"after"
    finally:
        await svc.app.stop()


async def _has(seen: list[str], n: int) -> bool:
    return len(set(seen)) >= n
