"""An intake service as a separate process against real NATS, with its HTTP port, for the intake tests."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
from nats.aio.client import Client
from nats.js.errors import BucketNotFoundError, NotFoundError
from oneplus_contracts import subjects
from oneplus_testing import wipe_bus

from oneplus.devstack import free_port, spawn, stop


async def wipe_all(nc: Client) -> None:
    """wipe_bus, and the webhook delivery ledger too."""
    await wipe_bus(nc)
    with contextlib.suppress(NotFoundError, BucketNotFoundError):
        await nc.jetstream().delete_key_value(subjects.WEBHOOK_DELIVERIES_KV)


@dataclass
class IntakeProcess:
    """The intake, and (given `redis_url`) the job owner beside it: without an owner no accepted job gets a record.

    `owner_url` is where the owner connects (another NATS user on a secured server); the intake's URL by default.
    """

    nats_url: str
    workdir: Path
    env: dict[str, str] = field(default_factory=dict)
    http_port: int = 0
    proc: Any = None
    redis_url: str | None = None
    owner_url: str | None = None
    owner: Any = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def log(self) -> Path:
        return self.workdir / "intake.log"

    def logs(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    async def start(self, timeout: float = 60.0) -> IntakeProcess:
        import os

        self.workdir.mkdir(parents=True, exist_ok=True)
        self.http_port = self.http_port or free_port()
        env = dict(os.environ)
        env.update(
            {
                "NATS_URL": self.nats_url,
                "PYTHONUNBUFFERED": "1",
                "ONEPLUS_HTTP_PORT": str(self.http_port),
                "ONEPLUS_HTTP_HOST": "127.0.0.1",
            }
        )
        env.update(self.env)
        if self.redis_url is not None:
            owner_env = {
                **env,
                "NATS_URL": self.owner_url or self.nats_url,
                "REDIS_URL": self.redis_url,
                "ONEPLUS_CLUSTER": f"intake{self.http_port}",  # its own reservations: nothing to share with others
            }
            self.owner = spawn([sys.executable, "-m", "oneplus_placement_solver"], self.owner_log, owner_env)
        self.proc = spawn([sys.executable, "-m", "oneplus_intake"], self.log, env)
        try:
            await self._wait_ready(timeout)
        except BaseException:
            # A job owner left running would outlive the test on the session's NATS: it takes over the facts
            # consumer that later tests recreate, and refuses their facts against an index of its own.
            self.stop()
            raise
        return self

    @property
    def owner_log(self) -> Path:
        return self.workdir / "placement-solver.log"

    async def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"intake exited with {self.proc.returncode}:\n{self.logs()[-3000:]}")
            if self.owner is not None and self.owner.poll() is not None:
                log = self.owner_log.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"the job owner exited with {self.owner.returncode}:\n{log}")
            owner_up = self.owner is None or "placement-solver started" in self.owner_log.read_text(errors="replace")
            if owner_up and "intake started" in self.logs():
                status, _ = await asyncio.to_thread(self.get, "/healthz")
                if status == 200:
                    return
            await asyncio.sleep(0.2)
        raise TimeoutError(f"intake not ready within {timeout:.0f}s:\n{self.logs()[-3000:]}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        stop([p for p in (self.proc, self.owner) if p is not None])

    # --- HTTP, blocking (call through asyncio.to_thread from async tests) ---------------------
    def request(
        self, method: str, path: str, body: bytes = b"", headers: Mapping[str, str] | None = None
    ) -> tuple[int, dict[str, Any]]:
        req = urllib.request.Request(
            self.base_url + path, data=body or None, method=method, headers=dict(headers or {})
        )
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as err:
            raw = err.read()
            try:
                return err.code, json.loads(raw or b"{}")
            except json.JSONDecodeError:
                return err.code, {"raw": raw.decode(errors="replace")}

    def get(self, path: str) -> tuple[int, dict[str, Any]]:
        try:
            return self.request("GET", path)
        except (urllib.error.URLError, ConnectionError, OSError):
            return 0, {}

    def post(self, path: str, body: bytes, headers: Mapping[str, str] | None = None) -> tuple[int, dict[str, Any]]:
        hdrs = dict(headers or {})
        if not any(k.lower() == "content-type" for k in hdrs):
            hdrs["Content-Type"] = "application/json"
        return self.request("POST", path, body, hdrs)


async def fresh_bus(nats_url: str) -> None:
    nc = await nats.connect(nats_url)
    try:
        await wipe_all(nc)
    finally:
        await nc.close()


@contextlib.asynccontextmanager
async def webhook_intake(
    nats_url: str, redis_url: str, workdir: Path, templates: str, secret: str
) -> AsyncIterator[IntakeProcess]:
    """An intake on a fresh bus that accepts MLflow webhooks signed with `secret` and turns them by `templates`."""
    await fresh_bus(nats_url)
    (workdir / "templates.yaml").write_text(templates)
    env = {"ONEPLUS_MLFLOW_SECRET": secret, "ONEPLUS_MLFLOW_TEMPLATES": str(workdir / "templates.yaml")}
    proc = await IntakeProcess(nats_url, workdir, env=env, redis_url=redis_url).start()
    try:
        yield proc
    finally:
        proc.stop()
