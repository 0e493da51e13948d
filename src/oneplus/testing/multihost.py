"""The platform across hosts: a three-server NATS JetStream cluster, Redis with a replica and three sentinels, the
services and the simulated fleet, each on a host of its own (network namespaces, `oneplus.netlab`), under a
steady stream of gangs while faults hit the parts that make it more than one machine.

    sudo uv run python -m oneplus.multihost --gangs 150 --out bench/results/multihost.json   # task multihost

Hosts (one namespace each, one bridge between them; the harness runs beside the bridge):
  nats-1, nats-2, nats-3   a NATS server each (deploy/nats/cluster/nats-server.conf) and a Redis sentinel each
  redis-1, redis-2         the Redis primary (append-only file on) and its replica
  ctl                      intake, topology-registry, placement-solver, preemption
  ctl-2                    placement-solver-2 (the solvers run active-active: one holds the owner lease)
  nodes                    one simulated executor per demo node (4 nodes, 32 GPUs)
Every stream and KV bucket is kept on three servers (ONEPLUS_STREAM_REPLICAS=3); every service is given all three
NATS URLs and the three sentinels (REDIS_SENTINELS), and gang commits wait for the Redis replica (WAIT).

Faults, one after another with a seeded gap, each timed to recovery as in `oneplus.chaos` (the platform answers
`jobs list`; the next `placed`): the NATS server leading the jobs stream SIGKILLed and restarted on its store; a
NATS server cut off the network and healed; the Redis primary SIGKILLed (the sentinels promote the replica; the
old primary comes back on its append-only file and is made a replica); the solver replica that holds the owner
lease SIGKILLed, left down past the lease (the other replica takes it over), and restarted; the one that holds
it then SIGSTOPped past its lease and resumed (the other takes over and fences the streams: none of the paused
one's writes may land, `oneplus.chaos.FENCED_WRITES`); every
service and executor restarted once (SIGTERM, then started again). The invariants are `oneplus.chaos`'s, read from
the job stream, the nodes' heartbeats and the JetStream reservation audit.

The lab's NATS servers run the shipped cluster file without its accounts: every process here connects as one
user. The per-service permissions are tested on their own (tests/intake/test_nats_permissions.py).
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import typer
from oneplus_contracts import subjects
from oneplus_reservations import ReservationStore
from oneplus_reservations.connect import RedisSettings, SentinelSettings

from ..devstack import DEMO_NODES, SERVICE_MODULES, Platform, find_nats_server, find_redis_server, spawn
from ..netlab import Host, NetLab
from .chaos import ChaosConfig, ChaosResult, ChaosRun, Fault, console, finish, markdown

REPO = Path(__file__).resolve().parents[3]
CLUSTER_CONFIG = REPO / "deploy" / "nats" / "cluster" / "nats-server.conf"
NATS_HOSTS = ("nats-1", "nats-2", "nats-3")
HOSTS = (*NATS_HOSTS, "redis-1", "redis-2", "ctl", "ctl-2", "nodes")
SOLVERS = ("placement-solver", "placement-solver-2")
INFRA_RETRIES = 10  # the lab's budget of platform-fault requeues per job (the default is 3)
LEASE_S = 4.0  # the lab's owner lease: a killed owner is replaced within a few seconds
SENTINEL_PORT = 26379
SERVICE = "oneplus"
DOWN_AFTER_MS = 2000  # a sentinel calls the primary down after this much silence; failover follows


def cluster_config(store: Path) -> str:
    """The shipped cluster file for the lab: its routes, domain and limits, no accounts (one user here)."""
    text = CLUSTER_CONFIG.read_text()
    assert "include ../accounts.conf" in text, "the shipped cluster file changed: update the lab"
    return text.replace("include ../accounts.conf", f"# lab: no accounts\n# store {store}")


def sentinel_config(primary: str) -> str:
    return (
        f"port {SENTINEL_PORT}\nbind 0.0.0.0\nprotected-mode no\n"
        f"sentinel monitor {SERVICE} {primary} 6379 2\n"
        f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n"
        f"sentinel failover-timeout {SERVICE} 10000\n"
        f"sentinel parallel-syncs {SERVICE} 1\n"
    )


@dataclass
class LabServers:
    """NATS (three servers) and Redis (primary, replica, three sentinels) on the lab's hosts."""

    lab: NetLab
    workdir: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def host(self, name: str) -> Host:
        return self.lab.hosts[name]

    @property
    def nats_url(self) -> str:
        return ",".join(f"nats://{self.host(h).address}:4222" for h in NATS_HOSTS)

    @property
    def sentinels(self) -> str:
        return ",".join(f"{self.host(h).address}:{SENTINEL_PORT}" for h in NATS_HOSTS)

    def redis_settings(self) -> RedisSettings:
        sentinels = tuple((self.host(h).address, SENTINEL_PORT) for h in NATS_HOSTS)
        return RedisSettings(sentinel=SentinelSettings(sentinels=sentinels, service=SERVICE), wait_replicas=1)

    def log(self, name: str) -> Path:
        self.workdir.mkdir(parents=True, exist_ok=True)
        return self.workdir / f"{name}.log"

    # -- NATS ----------------------------------------------------------------------------------------------------------
    def start_nats(self, name: str) -> None:
        store = self.workdir / name / "store"
        store.mkdir(parents=True, exist_ok=True)
        conf = self.workdir / name / "nats-server.conf"
        conf.write_text(cluster_config(store))
        routes = {f"NATS_ROUTE_{i}": f"nats://{self.host(h).address}:6222" for i, h in enumerate(NATS_HOSTS)}
        env = {**routes, "NATS_SERVER_NAME": name, "NATS_STORE_DIR": str(store), "PATH": "/usr/bin:/bin"}
        argv = self.host(name).argv([find_nats_server(), "-c", str(conf)])
        self.procs[name] = spawn(argv, self.log(name), env)

    def kill(self, name: str) -> None:
        proc = self.procs.pop(name, None)
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    # -- Redis ---------------------------------------------------------------------------------------------------------
    def start_redis(self, name: str, replica_of: str | None = None) -> None:
        data = self.workdir / name
        data.mkdir(parents=True, exist_ok=True)
        argv = [
            find_redis_server(), "--port", "6379", "--bind", "0.0.0.0", "--protected-mode", "no",
            "--appendonly", "yes", "--save", "", "--dir", str(data),
        ]  # fmt: skip
        if replica_of is not None:
            argv += ["--replicaof", replica_of, "6379"]
        self.procs[name] = spawn(self.host(name).argv(argv), self.log(name), None)

    def start_sentinel(self, host: str) -> None:
        conf = self.workdir / f"sentinel-{host}.conf"  # the sentinel rewrites it: one file each
        conf.write_text(sentinel_config(self.host("redis-1").address))
        argv = self.host(host).argv([find_redis_server(), str(conf), "--sentinel"])
        self.procs[f"sentinel-{host}"] = spawn(argv, self.log(f"sentinel-{host}"), None)

    def start(self) -> LabServers:
        for h in NATS_HOSTS:
            self.start_nats(h)
        self.start_redis("redis-1")
        self.start_redis("redis-2", replica_of=self.host("redis-1").address)
        for h in NATS_HOSTS:
            self.start_sentinel(h)
        return self

    def stop(self) -> None:
        for name in list(self.procs):
            self.kill(name)


def lab_faults(seed: int, nodes: tuple[str, ...], down_s: float = 10.0) -> list[Fault]:
    """The multi-host faults in a seeded order (gaps seeded too); the rolling restart last."""
    rng = random.Random(seed * 104729 + 3)
    cut = rng.choice(NATS_HOSTS)
    faults = [
        Fault("nats-leader-kill", "nats", down_s, 0),
        Fault("nats-partition", cut, down_s, 0),
        Fault("redis-failover", "redis-1", down_s, 0),
        Fault("kill", "placement-solver", 3 * LEASE_S, 0),  # aimed at the lease holder; down past its lease
        # Aimed at the lease holder too: SIGSTOPped past its lease, then resumed; the server refuses its writes.
        Fault("pause-leader", "placement-solver", 3 * LEASE_S, 0),
    ]
    rng.shuffle(faults)
    faults.append(Fault("rolling-restart", "every service", 16.0, 0))  # down_s: the restarts spread over it
    for f in faults:
        f.gap_s = round(rng.uniform(4.0, 8.0), 1)
    return faults


class MultiHostRun(ChaosRun):
    def __init__(self, cfg: ChaosConfig, solver_replicas: int = len(SOLVERS)) -> None:
        self.solver_replicas = solver_replicas  # 1: a lone solver on ctl, killed and left down past its lease too
        super().__init__(cfg)
        self.lab = NetLab()
        self.lab_servers = LabServers(self.lab, self.workdir / "servers")
        self.primary = "redis-1"  # the Redis host the sentinels last named primary (as far as the harness knows)

    def fault_schedule(self) -> list[Fault]:
        return lab_faults(self.cfg.seed, tuple(n.name for n in DEMO_NODES))

    @property
    def witnesses_fence(self) -> bool:
        return True  # two solver replicas on replicated streams: no write of a deposed owner may land there either

    # -- the world -----------------------------------------------------------------------------------------------------
    def platform_env(self) -> dict[str, str]:
        s = self.lab_servers
        return {
            **super().platform_env(),
            "ONEPLUS_STREAM_REPLICAS": "3",
            "REDIS_SENTINELS": s.sentinels,
            "REDIS_SENTINEL_SERVICE": SERVICE,
            "ONEPLUS_HTTP_PORT": "off",
            "ONEPLUS_SOLVER_LEASE_S": str(LEASE_S),
            # Five faults in two minutes: a long job can be requeued by three of them (a cut-off NATS server leaves
            # its executors silent past ONEPLUS_NODE_LOST_AFTER_S), which the default budget of 3 would end as FAILED.
            # A cluster would need three unrelated platform faults within one job's life for that.
            "ONEPLUS_INFRA_RETRIES": str(INFRA_RETRIES),
        }

    def start_world(self) -> str:
        self.lab.up(list(HOSTS))
        self.lab_servers.start()
        on = {name: self.lab.hosts["ctl"].argv([]) for name in SERVICE_MODULES}
        on[SOLVERS[1]] = self.lab.hosts["ctl-2"].argv([])
        on["*"] = self.lab.hosts["nodes"].argv([])
        self.platform = Platform(
            self.lab_servers.nats_url, "redis://unused-sentinels-are-set", nodes=DEMO_NODES,
            logdir=self.workdir / "logs", extra_env=self.platform_env(), metrics=False, hosts=on,
            solver_replicas=self.solver_replicas,
        ).start()  # fmt: skip
        return self.lab_servers.nats_url

    def stop_world(self) -> None:
        try:
            if self.platform is not None:
                self.platform.stop()
            self.lab_servers.stop()
        finally:
            self.lab.down()

    def reservation_store(self) -> ReservationStore:
        return ReservationStore.connect(self.lab_servers.redis_settings())  # through the sentinels

    # -- faults --------------------------------------------------------------------------------------------------------
    async def aim(self, f: Fault) -> None:
        if f.kind == "nats-leader-kill":
            f.target = await self.jobs_leader()
        elif f.kind == "redis-failover":
            f.target = await self.current_primary()
        elif f.kind in ("kill", "pause-leader") and f.target in SOLVERS:
            f.target = await self.lease_holder() or f.target
            f.note = f"{f.target} held the owner lease"

    async def apply_fault(self, f: Fault) -> None:
        s = self.lab_servers
        if f.kind == "nats-leader-kill":
            s.kill(f.target)
            await asyncio.sleep(f.down_s)
            s.start_nats(f.target)
        elif f.kind == "nats-partition":
            self.lab.cut(f.target)
            await asyncio.sleep(f.down_s)
            self.lab.heal(f.target)
        elif f.kind == "redis-failover":
            old = f.target
            s.kill(old)
            began = time.monotonic()
            new = await self.wait_promotion(old, timeout=max(30.0, f.down_s))
            f.note = f"{new} promoted after {time.monotonic() - began:.1f}s" if new else "no promotion seen"
            await asyncio.sleep(max(0.0, f.down_s - (time.monotonic() - began)))
            # Back on its append-only file, still believing it is the primary: the sentinels make it a replica.
            s.start_redis(old)
        elif f.kind == "rolling-restart":
            await self.rolling_restart(f.down_s)
        else:
            await super().apply_fault(f)

    async def jobs_leader(self) -> str:
        from .chaos import connect

        nc = await connect(self.lab_servers.nats_url)
        try:
            info = await nc.jetstream().stream_info(subjects.JOBS_STREAM)
            if info.cluster is None or not info.cluster.leader:
                raise RuntimeError(f"{subjects.JOBS_STREAM} has no leader")
            return str(info.cluster.leader)
        finally:
            await nc.close()

    async def lease_holder(self) -> str | None:
        """The solver replica holding the owner lease (replicas are named after their processes here)."""
        from oneplus_bus.lease import Lease

        from .chaos import connect

        nc = await connect(self.lab_servers.nats_url)
        try:
            kv = await nc.jetstream().key_value(subjects.SOLVER_STATE_KV)
            holder = (await Lease(kv, subjects.SOLVER_OWNER_LEASE_KEY, "harness").read()).holder
            return holder if holder in SOLVERS else None
        finally:
            await nc.close()

    async def sentinel_primary(self) -> str | None:
        """The host the sentinels name as primary now (None: none answers)."""
        import redis.asyncio as aioredis

        addresses = {self.lab.hosts[h].address: h for h in ("redis-1", "redis-2")}
        for h in NATS_HOSTS:
            r = aioredis.Redis(host=self.lab.hosts[h].address, port=SENTINEL_PORT, socket_timeout=2)
            try:
                got = await r.sentinel_get_master_addr_by_name(SERVICE)
                if isinstance(got, tuple):
                    host = got[0].decode() if isinstance(got[0], bytes) else got[0]
                    return addresses.get(host)
            except Exception:
                continue
            finally:
                await r.aclose()
        return None

    async def current_primary(self) -> str:
        return await self.sentinel_primary() or self.primary

    async def wait_promotion(self, old: str, timeout: float) -> str | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            now = await self.sentinel_primary()
            if now is not None and now != old:
                self.primary = now
                return now
            await asyncio.sleep(0.2)
        return None

    async def rolling_restart(self, spread_s: float) -> None:
        """Every service and executor: SIGTERM, wait for it to exit, start it again; one at a time, `spread_s` over
        all of them."""
        p = self.platform
        assert p is not None
        names = list(p.procs)
        for name in names:
            proc = p.procs[name]
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    await asyncio.to_thread(proc.wait, 20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    await asyncio.to_thread(proc.wait)
            if name.startswith("executor-"):
                p.start_executor(next(n for n in p.nodes if f"executor-{n.name}" == name))
            else:
                p.start_service(name)
            await asyncio.sleep(spread_s / len(names))


def run_multihost(cfg: ChaosConfig) -> ChaosResult:
    return asyncio.run(MultiHostRun(cfg).run())


app = typer.Typer(add_completion=False)


@app.command()
def main(
    gangs: Annotated[int, typer.Option(help="Gangs of 1-16 GPUs to submit")] = 150,
    seed: Annotated[int, typer.Option(help="Seeds the workload and the fault order")] = 1,
    out: Annotated[Path | None, typer.Option(help="Write the result as JSON here")] = None,
    workdir: Annotated[Path | None, typer.Option(help="Servers' data and logs (default: a temp dir)")] = None,
    drain_timeout: Annotated[float, typer.Option(help="Seconds for every job to end after the last fault")] = 600.0,
    report: Annotated[Path | None, typer.Option(help="Print a results file's faults as Markdown; run nothing")] = None,
) -> None:
    """The platform across network namespaces with faults injected; exits 1 when an invariant did not hold."""
    if report is not None:
        print(markdown(json.loads(report.read_text())))
        return
    why = NetLab.available()
    if why is not None:
        console.print(f"error: cannot run the multi-host lab here: {why}")
        raise typer.Exit(2)
    cfg = ChaosConfig(
        gangs=gangs, seed=seed, profile="multihost", workdir=workdir or Path(tempfile.mkdtemp(prefix="oneplus-mh-")),
        drain_timeout_s=drain_timeout,
    )  # fmt: skip
    finish(run_multihost(cfg), out)


if __name__ == "__main__":
    app()
