"""`oneplus dev status` / `dev down` read the state file a running `oneplus dev up` writes; `Platform.urls()`."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from oneplus.cli.app import app
from oneplus.devstack import DEMO_NODES, Platform, dev_state_path


@pytest.fixture
def state_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ONEPLUS_STATE_HOME", str(tmp_path))
    return tmp_path


def test_status_and_down_say_so_when_no_dev_up_runs(state_home: Path):
    for cmd in ("status", "down"):
        result = CliRunner().invoke(app, ["dev", cmd])
        assert result.exit_code == 1
        assert "no `oneplus dev up` runs" in result.stderr
    assert json.loads(CliRunner().invoke(app, ["dev", "status", "--json"]).stdout)["running"] is False


def test_a_stale_state_file_is_reported_and_removed(state_home: Path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    dev_state_path().write_text(json.dumps({"pid": dead.pid, "urls": {"nats": "nats://127.0.0.1:1"}}))
    result = CliRunner().invoke(app, ["dev", "down"])
    assert result.exit_code == 1 and "is gone" in result.stderr
    assert not dev_state_path().exists()
    dev_state_path().write_text("{not json")
    result = CliRunner().invoke(app, ["dev", "status"])
    assert result.exit_code == 2 and "unreadable" in result.stderr


def test_status_checks_the_urls_and_down_stops_the_process(state_home: Path):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        urls = {"nats": f"nats://127.0.0.1:{port}", "redis": "redis://127.0.0.1:1/0"}
        dev_state_path().write_text(json.dumps({"pid": proc.pid, "urls": urls, "logdir": "/tmp/x"}))
        status = CliRunner().invoke(app, ["dev", "status"])
        assert status.exit_code == 1  # redis is down
        assert "up   nats" in status.stdout and "DOWN redis" in status.stdout
        urls["redis"] = f"redis://127.0.0.1:{port}/0"
        dev_state_path().write_text(json.dumps({"pid": proc.pid, "urls": urls, "logdir": "/tmp/x"}))
        assert CliRunner().invoke(app, ["dev", "status"]).exit_code == 0
        down = CliRunner().invoke(app, ["dev", "down", "--timeout", "10"])
        assert down.exit_code == 0, down.output
        assert proc.wait(5) is not None
        assert not dev_state_path().exists()
    finally:
        proc.kill()
        listener.close()


def test_platform_urls_name_every_service(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("ONEPLUS_HTTP_PORT", raising=False)
    monkeypatch.delenv("ONEPLUS_METRICS_PORT", raising=False)
    p = Platform("nats://127.0.0.1:4222", "redis://127.0.0.1:6379/0", nodes=DEMO_NODES[:1])
    for name in ("intake", "placement-solver", "executor-h100-0"):
        env = p.process_env(name)
        assert env["ONEPLUS_METRICS_PORT"] == "0"  # the system's pick at bind time: no port race
        assert env["ONEPLUS_HTTP_PORT"] == str(p.http_port)
    # What each process logs when it binds is what `urls()` reports.
    p.logdir.mkdir(parents=True, exist_ok=True)
    for name, port in (("intake", 41001), ("placement-solver", 41002), ("executor-h100-0", 41003)):
        (p.logdir / f"{name}.log").write_text(f"x INFO metrics on http://127.0.0.1:{port}/metrics\n")
    urls = p.urls()
    assert urls["metrics placement-solver"] == "http://127.0.0.1:41002/metrics"
    assert urls["nats"] == "nats://127.0.0.1:4222" and urls["redis"].startswith("redis://")
    assert urls["http"] == f"http://127.0.0.1:{p.http_port}"
    assert urls["dashboard"] == f"http://127.0.0.1:{p.http_port}/ui/"
    assert urls["metrics intake"].endswith("/metrics") and "metrics executor-h100-0" in urls
    off = Platform("nats://x:1", "redis://x:2", extra_env={"ONEPLUS_HTTP_PORT": "off"}, metrics=False)
    assert "ONEPLUS_METRICS_PORT" not in off.process_env("intake") or off.metrics_ports == {}
    assert "http" not in off.urls()


def test_the_cli_finds_a_running_dev_up_and_names_where_its_url_came_from(state_home: Path):
    """Without NATS_URL the CLI connects to the running `dev up` (its state file), and a connection error names the
    URL tried and its source; NATS_URL, when set, wins."""
    from oneplus.devstate import DEFAULT_NATS_URL, locate_nats

    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there: the connection is refused at once
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        url = f"nats://127.0.0.1:{port}"
        dev_state_path().write_text(json.dumps({"pid": proc.pid, "urls": {"nats": url}}))
        env = {"ONEPLUS_STATE_HOME": str(state_home)}
        target = locate_nats(None, env)
        assert target.url == url and f"pid {proc.pid}" in target.source and "dev up" in target.source
        result = CliRunner().invoke(app, ["queue"], env={"NATS_URL": None})
        assert result.exit_code == 2
        line = result.stderr.strip()
        assert len(line.splitlines()) == 1
        assert f"cannot reach NATS at {url} (from the running `oneplus dev up` (pid {proc.pid}" in line
        assert locate_nats(None, {**env, "NATS_URL": "nats://10.0.0.1:4222"}).source == "NATS_URL"
        assert locate_nats("nats://h:1", {**env, "NATS_URL": "nats://h:1"}).source == "NATS_URL"
        assert locate_nats("nats://h:2", {**env, "NATS_URL": "nats://h:1"}).source == "--nats"
        result = CliRunner().invoke(app, ["queue", "--nats", url], env={"NATS_URL": None})
        assert f"cannot reach NATS at {url} (from --nats)" in result.stderr
    finally:
        proc.kill()
        proc.wait()
    stale = locate_nats(None, {"ONEPLUS_STATE_HOME": str(state_home)})
    assert stale.url == DEFAULT_NATS_URL
    assert "NATS_URL is unset and no `oneplus dev up` runs (a stale" in stale.source
    dev_state_path().unlink()
    assert f"(no {dev_state_path()})" in locate_nats(None, {"ONEPLUS_STATE_HOME": str(state_home)}).source


def test_no_responders_names_the_server_and_its_source():
    import asyncio

    from nats.errors import NoRespondersError

    from oneplus.client import OnePlusClient, PlatformError

    class NoOne:
        async def request(self, *_: object, **__: object) -> None:
            raise NoRespondersError

    c = OnePlusClient(NoOne(), where="nats://127.0.0.1:4222 (from the default: NATS_URL is unset)")  # type: ignore[arg-type]
    with pytest.raises(PlatformError) as exc:
        asyncio.run(c.ops("oneplus.ops.queue.list", {}))
    assert str(exc.value) == (
        "no service answers on oneplus.ops.queue.list at nats://127.0.0.1:4222 (from the default: NATS_URL is unset); "
        "is the platform up?"
    )


def test_dev_up_with_a_bad_queue_file_starts_nothing_and_says_why(state_home: Path, tmp_path: Path):
    bad = tmp_path / "q.yaml"
    bad.write_text("queues: [{name: a, guarantee: 3}]\n")
    result = CliRunner().invoke(app, ["dev", "up", "--queues", str(bad)])
    assert result.exit_code == 2
    assert (
        result.stderr.strip()
        == f"error: {bad}: invalid queue config: queues.0.guarantee: Extra inputs are not permitted"
    )
    assert not dev_state_path().exists()


def test_dev_up_says_what_its_runtime_does_and_status_repeats_the_runtime(state_home: Path):
    from oneplus.cli.app import runtime_note

    note = runtime_note("simulated")
    assert note.startswith("jobs are simulated: no process runs")
    for form in ("--simulate-s", "#ONEPLUS --simulate-s=N", "oneplus.io/simulate-s", "--runtime docker"):
        assert form in note
    assert "containers" in runtime_note("docker")
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        doc = {"pid": proc.pid, "urls": {}, "logdir": "/tmp/x", "runtime": "simulated"}
        dev_state_path().write_text(json.dumps(doc))
        status = CliRunner().invoke(app, ["dev", "status"])
        assert "runtime simulated" in status.stdout
    finally:
        proc.kill()
        proc.wait()
