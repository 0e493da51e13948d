"""python -m oneplus_bus.health: the probe of compose.yaml and deploy/k8s answers for a running service instance
only, and says why not otherwise (not started, gone, NATS unreachable, a broken health file)."""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from oneplus_bus.health import Unhealthy, check, main
from oneplus_bus.service import OneplusService
from oneplus_bus.settings import BusSettings
from oneplus_testing import Servers

from oneplus.devstack import find_nats_server, free_port, spawn, stop, wait_port

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "nats"


async def probe(service: str, env: dict[str, str]) -> tuple[int, str, str]:
    """The probe as a process (the service under test runs on this event loop, so it must not block)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "oneplus_bus.health",
        service,
        "--timeout",
        "2",
        env={**os.environ, **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    return proc.returncode or 0, out.decode(), err.decode()


@pytest.fixture
async def running(
    servers: Servers, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[OneplusService, Path]]:
    monkeypatch.setenv("ONEPLUS_HEALTH_DIR", str(tmp_path))
    svc = OneplusService("health-probe", "answers health checks", BusSettings(servers.nats_url, servers.redis_url))
    await svc.app.start()
    try:
        yield svc, tmp_path
    finally:
        await svc.app.stop()


async def test_a_running_instance_answers_by_its_own_id(running: tuple[OneplusService, Path], servers: Servers) -> None:
    svc, health_dir = running
    assert svc.micro is not None
    assert (health_dir / "health-probe.json").exists()
    assert await check("health-probe", servers.nats_url) == f"oneplus-health-probe {svc.micro.id}"
    rc, out, err = await probe("health-probe", {"NATS_URL": servers.nats_url, "ONEPLUS_HEALTH_DIR": str(health_dir)})
    assert rc == 0, err
    assert out.strip() == f"ok: oneplus-health-probe {svc.micro.id}"


async def test_a_stopped_instance_is_unhealthy(
    servers: Servers, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ONEPLUS_HEALTH_DIR", str(tmp_path))
    svc = OneplusService("health-probe", "answers health checks", BusSettings(servers.nats_url, servers.redis_url))
    await svc.app.start()
    await svc.app.stop()
    assert not (tmp_path / "health-probe.json").exists()
    rc, _, err = await probe("health-probe", {"NATS_URL": servers.nats_url, "ONEPLUS_HEALTH_DIR": str(tmp_path)})
    assert rc == 1
    assert "health-probe has not started" in err


async def test_an_instance_that_is_gone_does_not_pass_for_its_siblings(
    running: tuple[OneplusService, Path], servers: Servers
) -> None:
    _, health_dir = running
    # A hung or restarted instance's file names an id nobody answers for, though another instance is up.
    (health_dir / "health-probe.json").write_text('{"name": "oneplus-health-probe", "id": "GONE", "inbox_prefix": ""}')
    with pytest.raises(Unhealthy, match=r"nothing answers \$SRV.PING.oneplus-health-probe.GONE"):
        await check("health-probe", servers.nats_url, timeout=2)


async def test_without_a_health_dir_any_instance_answers(
    running: tuple[OneplusService, Path], servers: Servers, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ONEPLUS_HEALTH_DIR")
    assert (await check("health-probe", servers.nats_url)).startswith("oneplus-health-probe ")
    with pytest.raises(Unhealthy, match="nothing answers"):
        await check("no-such-service", servers.nats_url, timeout=2)


def test_a_broken_health_file_is_unhealthy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONEPLUS_HEALTH_DIR", str(tmp_path))
    (tmp_path / "intake.json").write_text("{not json")
    monkeypatch.setenv("NATS_URL", "nats://127.0.0.1:1")
    assert main(["intake"]) == 1


def test_unreachable_nats_is_unhealthy(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("ONEPLUS_HEALTH_DIR", raising=False)
    monkeypatch.setenv("NATS_URL", f"nats://127.0.0.1:{free_port()}")
    assert main(["intake", "--timeout", "1"]) == 1
    assert "unhealthy: cannot reach NATS" in capsys.readouterr().err


def test_a_nats_url_without_a_server_is_unhealthy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ONEPLUS_HEALTH_DIR", raising=False)
    monkeypatch.setenv("NATS_URL", " , ")
    assert main(["intake"]) == 1


# --- on deploy/nats: a service user may ping its own service, from its own inbox space -------------------------


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, dict[str, str]]]:
    workdir = Path(tmp_path_factory.mktemp("health-nats"))
    names = sorted(set(re.findall(r"\$(NATS_\w+_PASSWORD)", (DEPLOY / "accounts.conf").read_text())))
    env = {n: "pw" + secrets.token_hex(12) for n in names} | {"NATS_STORE_DIR": str(workdir / "js")}
    port = free_port()
    argv = [find_nats_server(), "-c", str(DEPLOY / "nats-server.conf"), "-a", "127.0.0.1", "-p", str(port)]
    proc = spawn([*argv, "-m", str(free_port())], workdir / "nats.log", {**os.environ, **env})
    try:
        wait_port(port, proc=proc)
        yield port, env
    finally:
        stop([proc])


@pytest.mark.parametrize(
    ("service", "user", "inbox"),
    [("node-executor", "executor-h100-0", "_INBOX.executor-h100-0"), ("preemption", "preemption", "_INBOX")],
)
async def test_a_service_user_may_ping_its_own_service(
    secured: tuple[int, dict[str, str]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    service: str,
    user: str,
    inbox: str,
) -> None:
    port, env = secured
    password = env[f"NATS_{user.upper().replace('-', '_')}_PASSWORD"]
    url = f"nats://{user}:{password}@127.0.0.1:{port}"
    monkeypatch.setenv("ONEPLUS_HEALTH_DIR", str(tmp_path))
    svc = OneplusService(service, "health on deploy/nats", BusSettings(url, "redis://unused", inbox_prefix=inbox))
    await svc.app.start()
    try:
        assert svc.micro is not None
        rc, out, err = await probe(service, {"NATS_URL": url, "ONEPLUS_HEALTH_DIR": str(tmp_path)})
        assert rc == 0, err
        assert svc.micro.id in out
    finally:
        await svc.app.stop()
