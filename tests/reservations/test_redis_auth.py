"""Redis with passwords: deploy/redis/users.acl (default user off, an admin, and the `oneplus` user the services
connect as, limited to `{oneplus:*}` keys and the commands the store and its Lua scripts use) loaded into a real
redis-server, with fresh passwords. REDIS_URL carries the user and password (`redis://oneplus:<pw>@host/0`)."""

from __future__ import annotations

import hashlib
import os
import secrets
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from oneplus_contracts import Allocation, RankPlacement
from oneplus_reservations import ReservationStore, check_history
from oneplus_testing import Servers
from redis.exceptions import AuthenticationError, NoPermissionError, ResponseError

from oneplus.devstack import find_redis_server, free_port, spawn, stop, wait_port

ACL = Path(__file__).resolve().parents[2] / "deploy" / "redis" / "users.acl"
PLACEHOLDERS = {
    "admin": "change-me-admin",
    "oneplus": "change-me-oneplus",
    "replica": "change-me-replica",  # replicas to their primary (masteruser); tests/reservations/test_sentinel_failover
    "sentinel": "change-me-sentinel",  # the sentinels to every Redis (sentinel auth-user)
}


def sha(password: str) -> str:
    return hashlib.sha256(password.encode()).hexdigest()


@dataclass
class SecuredRedis:
    port: int
    passwords: dict[str, str]
    proc: subprocess.Popen[bytes]

    def url(self, user: str, password: str | None = None) -> str:
        return f"redis://{user}:{password or self.passwords[user]}@127.0.0.1:{self.port}/0"


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredRedis]:
    workdir = tmp_path_factory.mktemp("redis-auth")
    passwords = {user: "pw" + secrets.token_hex(12) for user in PLACEHOLDERS}
    acl = ACL.read_text()
    for user, placeholder in PLACEHOLDERS.items():
        assert f"#{sha(placeholder)}" in acl, f"deploy/redis/users.acl: {user}'s placeholder hash changed"
        acl = acl.replace(f"#{sha(placeholder)}", f"#{sha(passwords[user])}")
    (workdir / "users.acl").write_text(acl)
    port = free_port()
    argv = [find_redis_server(), "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    argv += ["--dir", str(workdir), "--aclfile", str(workdir / "users.acl")]
    proc = spawn(argv, workdir / "redis-server.log")
    wait_port(port, proc=proc)
    try:
        yield SecuredRedis(port, passwords, proc)
    finally:
        stop([proc])


@pytest.fixture
async def store(secured: SecuredRedis) -> AsyncIterator[ReservationStore]:
    s = ReservationStore.from_url(secured.url("oneplus"), cluster=f"t{uuid.uuid4().hex[:8]}")
    try:
        yield s
    finally:
        await s.wipe()
        await s.close()


def alloc(*ranks: tuple[str, list[int]], milli: int = 0) -> Allocation:
    return Allocation(ranks=[RankPlacement(rank=i, node=n, gpus=g, gpu_milli=milli) for i, (n, g) in enumerate(ranks)])


async def test_the_reservation_scripts_run_as_the_oneplus_acl_user(store: ReservationStore) -> None:
    await store.load_scripts()
    await store.set_epoch(1)
    assert await store.epoch() == 1
    token = await store.reserve("j1", alloc(("n0", [0, 1]), ("n1", [0])))
    assert isinstance(token, int)
    assert isinstance(await store.reserve("s1", alloc(("n0", [2]), milli=250)), int)
    conflict = await store.reserve("j2", alloc(("n0", [1])))
    assert not isinstance(conflict, int)
    assert await store.renew("j1", token) is True
    assert (await store.renew_many([("j1", token)], 30.0))[("j1", token)] is not None
    assert await store.current_token("j1") == token
    assert await store.r.wait(0, 0) == 0  # WAIT, the commit rule with replicas (REDIS_WAIT_REPLICAS)
    assert {r.job_id for r in await store.all()} == {"j1", "s1"}
    assert len(await store.held_slots()) == 3  # SCAN and GET as that user
    assert await store.release("j1", token) == token
    assert await store.get("j1") is None
    assert await store.restore("r1", token + 100, alloc(("n2", [0]))) is True
    assert check_history(await store.history()) == []


async def test_the_oneplus_user_reaches_no_other_key_and_no_other_command(secured: SecuredRedis) -> None:
    r = aioredis.Redis.from_url(secured.url("oneplus"))
    try:
        assert await r.ping() is True
        assert await r.set("{oneplus:x}:k", "1") is True
        for refused in (
            r.set("someone-else", "1"),
            r.get("session:42"),
            r.flushall(),
            r.config_get("requirepass"),
            r.keys("*"),
            r.acl_list(),
            r.publish("oneplus", "x"),
            r.execute_command("DEBUG", "SLEEP", "0"),  # type: ignore[no-untyped-call]
        ):
            with pytest.raises(NoPermissionError):
                await refused
        # a script reaches no more than its caller: a key outside {oneplus:*} is refused inside Lua too
        with pytest.raises(ResponseError, match=r"(?i)permission|NOPERM"):
            await r.eval("return redis.call('SET', KEYS[1], '1')", 1, "someone-else")
        await r.delete("{oneplus:x}:k")
    finally:
        await r.aclose()
    admin = aioredis.Redis.from_url(secured.url("admin"))
    try:
        assert await admin.set("someone-else", "1") is True  # the admin may
        await admin.delete("someone-else")
    finally:
        await admin.aclose()


async def test_a_wrong_or_missing_password_is_refused_with_a_clear_error(secured: SecuredRedis) -> None:
    for url in (
        secured.url("oneplus", "wrong-password"),
        secured.url("nobody", "whatever"),
        f"redis://:{secured.passwords['oneplus']}@127.0.0.1:{secured.port}/0",  # the default user is off
    ):
        store = ReservationStore.from_url(url)
        try:
            with pytest.raises(AuthenticationError, match="invalid username-password pair"):
                await store.load_scripts()
        finally:
            await store.close()
    store = ReservationStore.from_url(f"redis://127.0.0.1:{secured.port}/0")  # no password at all
    try:
        with pytest.raises(AuthenticationError, match=r"(?i)authenticat"):
            await store.load_scripts()
    finally:
        await store.close()


def assert_solver_refuses_to_start(nats_url: str, redis_env: dict[str, str], tmp_path: Path, said: str) -> None:
    """The placement-solver, started with `redis_env`, exits non-zero saying `said` and never says it started."""
    env = {
        **os.environ,
        "NATS_URL": nats_url,
        **redis_env,
        "ONEPLUS_CLUSTER": f"t{uuid.uuid4().hex[:8]}",
        "PYTHONUNBUFFERED": "1",
    }
    log = tmp_path / "placement-solver.log"
    proc = spawn([sys.executable, "-m", "oneplus_placement_solver"], log, env)
    try:
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        text = log.read_text(errors="replace")
        assert proc.returncode not in (None, 0), text[-3000:]
        assert said in text, text[-3000:]
        assert "placement-solver started" not in text
    finally:
        stop([proc])


def test_the_placement_solver_does_not_start_with_a_wrong_password(
    servers: Servers, secured: SecuredRedis, tmp_path: Path
) -> None:
    redis_env = {"REDIS_URL": secured.url("oneplus", "wrong-password")}
    assert_solver_refuses_to_start(servers.nats_url, redis_env, tmp_path, "invalid username-password pair")


def test_the_requirepass_form_works_too(tmp_path: Path) -> None:
    """Without an ACL file: `requirepass` protects the default user, and REDIS_URL=redis://:<password>@host/0."""
    import redis

    port, password = free_port(), "pw" + secrets.token_hex(12)
    argv = [find_redis_server(), "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    proc = spawn([*argv, "--dir", str(tmp_path), "--requirepass", password], tmp_path / "redis-server.log")
    try:
        wait_port(port, proc=proc)
        ok = redis.Redis.from_url(f"redis://:{password}@127.0.0.1:{port}/0")
        assert ok.ping() is True
        ok.close()
        for url in (f"redis://:wrong@127.0.0.1:{port}/0", f"redis://127.0.0.1:{port}/0"):
            r = redis.Redis.from_url(url)
            with pytest.raises(AuthenticationError):
                r.ping()
            r.close()
    finally:
        stop([proc])
