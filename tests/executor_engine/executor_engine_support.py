"""Shared by the executor-engine tests: building launch commands, reading real topologies, finding the engine."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
from oneplus_contracts import JobSpec, LaunchRanks, NodeTopology, RankPlacement, RankResources
from oneplus_topology.smi import parse_topo_matrix

REPO = Path(__file__).resolve().parents[2]
TOPOLOGIES = REPO / "data" / "topologies"
BUSYBOX = "localhost/busybox:latest"


def real_topology(name: str, node: str = "node-a") -> NodeTopology:
    return parse_topo_matrix((TOPOLOGIES / name).read_text(), node=node)


def new_job_id() -> str:
    return "job-" + uuid.uuid4().hex[:10]


def launch(
    job_id: str,
    node: str,
    ranks: list[tuple[int, list[int]]],
    *,
    command: list[str] | None = None,
    token: int = 1,
    world_size: int | None = None,
    memory_mb: int = 64,
    cpus: float = 0.5,
    image: str = BUSYBOX,
    **spec: object,
) -> LaunchRanks:
    """A launch of the given (global rank, GPUs) on one node of a job."""
    world = world_size or len(ranks)
    job = JobSpec.model_validate(
        {
            "name": "engine-test",
            "ranks": world,
            # Request = limit, as Slurm's --cpus-per-task/--mem and a Kubernetes limit give (a limit caps).
            "resources": RankResources(
                gpus=1, cpus=cpus, memory_mb=memory_mb, cpu_limit=cpus, memory_limit_mb=memory_mb
            ),
            "image": image,
            "command": command or ["sh", "-c", "sleep 30"],
            **spec,
        }
    )
    return LaunchRanks(
        job_id=job_id,
        node=node,
        token=token,
        spec=job,
        ranks=[RankPlacement(rank=r, node=node, gpus=g, cpus=cpus, memory_mb=memory_mb) for r, g in ranks],
        world_size=world,
        node_rank=0,
        nodes=[node],
        master_addr="10.0.0.1",
        master_port=29511,
    )


def engine_unreachable_reason(url: str | None, path: str = "/_ping", timeout_s: float = 3.0) -> str | None:
    """Why the engine tests cannot run, or None when the engine answers `path` (a ping unless told)."""
    if not url:
        return 'ONEPLUS_DOCKER_URL is not set (run `eval "$(.ci/container-engine.sh)"` to start Podman\'s Docker API)'
    parsed = urlparse(url)
    try:
        if parsed.scheme == "unix":
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(timeout_s)
            sock.connect(parsed.path)
        else:
            sock = socket.create_connection((parsed.hostname or "localhost", parsed.port or 2375), timeout=timeout_s)
        with sock:
            sock.sendall(f"GET {path} HTTP/1.0\r\nHost: engine\r\n\r\n".encode())
            answer = sock.recv(4096)
    except OSError as e:
        return f"container engine at {url} is unreachable: {e}"
    if b" 200 " not in answer.split(b"\r\n", 1)[0]:
        return f"container engine at {url} answered {path} with {answer[:80]!r}"
    return None


ENGINE_URL = os.environ.get("ONEPLUS_DOCKER_URL")


@pytest.fixture(scope="session")
def engine_url() -> str:
    """The engine's API URL; every test that asks for it is skipped, with the reason, when no engine answers."""
    reason = engine_unreachable_reason(ENGINE_URL)
    if reason is not None:
        pytest.skip(reason)
    assert ENGINE_URL is not None
    return ENGINE_URL


EngineControl = Callable[[], Coroutine[Any, Any, None]]


@asynccontextmanager
async def private_podman(folder: Path, wait_s: float = 15.0) -> AsyncIterator[tuple[str, EngineControl, EngineControl]]:
    """A Podman API service of the test's own on a socket in `folder`, with stop and start controls."""
    if shutil.which("podman") is None:
        pytest.skip("the engine answers, but this machine has no podman binary to run a private engine to stop")
    url = f"unix://{folder}/podman.sock"
    procs: list[asyncio.subprocess.Process] = []

    async def start() -> None:
        procs.append(
            await asyncio.create_subprocess_exec(
                "podman", "system", "service", "--time=0", url,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            )
        )  # fmt: skip
        # Ready means /version answers, not /_ping: a fresh service's first /version (the runtime's health
        # check) can take seconds on a loaded host while /_ping already answers.
        deadline = asyncio.get_running_loop().time() + wait_s
        while asyncio.get_running_loop().time() < deadline:
            if await asyncio.to_thread(engine_unreachable_reason, url, "/version", wait_s) is None:
                return
            await asyncio.sleep(0.1)
        raise AssertionError(f"the private podman service at {url} did not answer within {wait_s:g} s")

    async def stop() -> None:
        p = procs.pop()
        p.send_signal(signal.SIGTERM)
        await asyncio.wait_for(p.wait(), wait_s)

    await start()
    try:
        yield url, stop, start
    finally:
        while procs:
            await stop()
