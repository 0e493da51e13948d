"""Chaos run: the platform on its embedded default, gangs submitted, faults injected on a seeded schedule, invariants
checked from the job event stream and from the nodes' own heartbeats (not from Redis, which is one of the victims).

    uv run python -m oneplus.chaos --gangs 300 --seed 1 --out bench/results/chaos.json   # issue's run (~5 min)
    uv run python -m oneplus.chaos --profile ci --gangs 60                              # what tests/e2e runs

It starts its own NATS and Redis (`EmbeddedServers`; NATS_URL/REDIS_URL are ignored: the run kills them) and the
five services with one simulated executor per demo node (`Platform`, DEMO_NODES: 4 nodes, 32 GPUs). Gangs of 1-16
GPUs are submitted at a steady pace through the whole fault schedule, each retried with its submission id until the
intake answers (a retry is the same job, never a second one): priority 100 (not preemptible) against priority 0
(preemptible, with a checkpoint signal); a few long gangs are cancelled a few seconds after their submission.

Faults, one at a time, each after a seeded gap: SIGKILL of a service then its restart, SIGKILL of one executor then
its restart, NATS SIGKILLed and restarted on its store (an outage of >= 10 s), the solver SIGSTOPped then SIGCONTed,
and last Redis SIGKILLed and restarted empty. After each: the time from the fault's end until the platform answers
a `jobs list` again, and until the next `placed` event.

Invariants (each a list of violations, empty when it held): see `check_*` below and docs/reliability.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import re
import signal
import tempfile
import time
import urllib.request
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any

import nats
import typer
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, StorageType, StreamConfig, StreamSource
from nats.js.errors import NotFoundError
from oneplus_bus.fencing import EPOCH_HEADER, FENCED_STREAMS, SOLVER_STATE_STREAM, is_fence
from oneplus_bus.settings import nats_servers
from oneplus_contracts import (
    IllegalTransition,
    JobEvent,
    JobRecord,
    JobRejected,
    JobSpec,
    NodeHeartbeat,
    NodeLease,
    RankResources,
    SimulatedRun,
    TopologyConstraint,
    apply_event,
    parse_job_event,
    subjects,
)
from oneplus_reservations import ReservationStore
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.table import Table

from ..client import OnePlusClient, PlatformError
from ..demo import wait_for_platform
from ..devstack import DEMO_NODES, PREEMPT_AT_ONCE, EmbeddedServers, Platform, queue_config_env
from ..workload import DEMO_SHAPES

console = Console(width=None if Console().is_terminal else 160)

JOB_ID = re.compile(r"\bj-[0-9a-f]{12}\b")  # the intake's job ids (a hash of the submission id)
SUBMIT_GIVE_UP_S = 120.0  # a submission unanswered this long (retried all along) counts as refused
TELLING = ("WARNING", "ERROR", "refused", "lost", "fenced", "requeu")  # log lines worth showing as evidence
OUTCOMES = "every job ends as it should (none lost, none stuck)"
FENCED_WRITES = "no write of a deposed owner landed (fenced streams, witnessed by mirrors)"
FENCED_PAUSE_S = 18.0  # past the 10 s owner lease, with time for the other replica to take the lead and place
SOLVERS = ("placement-solver", "placement-solver-2")
STARTED = " started ("  # the line every service logs once it is up (oneplus_bus.service)


# -- the workload ------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Gang:
    index: int
    spec: JobSpec
    cancel_after_s: float | None = None  # cancel this many seconds after its submission was answered


def chaos_workload(n: int, seed: int, duration_s: tuple[float, float] = (1.0, 4.0), cancels: int = 3) -> list[Gang]:
    """`n` gangs of 1-16 GPUs (the demo's shapes): about half priority 100 and not preemptible, the rest priority 0,
    preemptible, with a checkpoint signal. `cancels` of them (1-GPU, long) are cancelled a few seconds in."""
    rng = random.Random(seed)
    cancel_at = set(rng.sample(range(n), min(cancels, n)))
    gangs = []
    for i in range(n):
        ranks, gpus = DEMO_SHAPES[i % len(DEMO_SHAPES)]
        urgent = rng.random() < 0.5
        cancelled = i in cancel_at
        if cancelled:
            ranks, gpus = 1, 1
        duration = 600.0 if cancelled else round(rng.uniform(*duration_s) * (1.5 if ranks * gpus >= 8 else 1.0), 2)
        spec = JobSpec(
            name=f"chaos-{i:03d}-{ranks * gpus}gpu" + ("-cancel" if cancelled else ""),
            team="chaos",
            user="sre",
            priority=100 if urgent else 0,
            preemptible=not urgent,
            ranks=ranks,
            resources=RankResources(gpus=gpus, cpus=4, memory_mb=8192),
            topology=TopologyConstraint(domain="leaf" if ranks > 1 else "node", mode="preferred"),
            checkpoint={"signal": "SIGUSR1", "grace_s": 10},
            command=["python", "train.py"],
            time_limit_s=3600,
            simulate=SimulatedRun(duration_s=duration, checkpoint_after_s=None if urgent else 0.3),
        )
        gangs.append(Gang(i, spec, round(rng.uniform(2.0, 6.0), 2) if cancelled else None))
    return gangs


# -- the fault schedule ------------------------------------------------------------------------------------------------
@dataclass
class Fault:
    kind: str  # kill | nats-outage | pause | redis-reset (and oneplus.multihost's)
    target: str  # a Platform process name, "nats" or "redis"
    down_s: float  # how long it stays down (killed) or stopped (paused)
    gap_s: float  # quiet time before it, after the previous fault's recovery
    # Measured:
    at_s: float | None = None  # since the run started
    lasted_s: float | None = None
    recovery_list_s: float | None = None  # fault end → the platform answers `jobs list`
    recovery_placed_s: float | None = None  # fault end → the next `placed` event
    note: str = ""

    @property
    def label(self) -> str:
        return {
            "kill": f"SIGKILL {self.target}",
            "nats-outage": "NATS killed",
            "pause": f"SIGSTOP {self.target}",
            "pause-leader": f"SIGSTOP {self.target} (the owner, past its lease)",
            "redis-reset": "Redis killed, empty",
            # oneplus.multihost's faults
            "nats-leader-kill": f"SIGKILL {self.target} (NATS, jobs stream leader)",
            "nats-partition": f"{self.target} (NATS) cut off the network",
            "redis-failover": f"SIGKILL Redis primary {self.target} (Sentinel failover)",
            "rolling-restart": "every service and executor restarted once",
        }[self.kind]


def schedule(profile: str, seed: int, nodes: tuple[str, ...]) -> list[Fault]:
    """The faults of `profile`, in a seeded order; Redis's reset is always last."""
    rng = random.Random(seed * 7919 + 1)
    executor = f"executor-{rng.choice(nodes)}"
    if profile == "full":
        faults = [Fault("kill", "placement-solver", 2.0, 0) for _ in range(3)]
        faults += [Fault("kill", name, 2.0, 0) for name in ("intake", "preemption", "topology-registry", executor)]
        faults += [Fault("nats-outage", "nats", round(rng.uniform(10.0, 15.0), 1), 0)]
        faults += [Fault("pause", "placement-solver", 20.0, 0)]
        gaps = (6.0, 12.0)
    elif profile == "ci":
        faults = [
            Fault("kill", "placement-solver", 1.0, 0),
            Fault("kill", executor, 1.0, 0),
            Fault("kill", rng.choice(["intake", "preemption"]), 1.0, 0),
            Fault("nats-outage", "nats", 10.0, 0),
            Fault("pause", "placement-solver", 5.0, 0),
        ]
        gaps = (3.0, 5.0)
    elif profile == "fenced":
        # The owner paused past its lease (ONEPLUS_SOLVER_LEASE_S, 10 s) while jobs flow, twice: the other replica
        # takes the lead and fences the streams; the paused one, resumed, must land nothing (FENCED_WRITES).
        faults = [Fault("pause-leader", "placement-solver", FENCED_PAUSE_S, 0) for _ in range(2)]
        for f in faults:
            f.gap_s = round(rng.uniform(6.0, 10.0), 1)
        return faults
    else:
        raise ValueError(f"profile must be 'full', 'ci' or 'fenced', not {profile!r}")
    rng.shuffle(faults)
    faults.append(Fault("redis-reset", "redis", 2.0 if profile == "full" else 1.0, 0))
    for f in faults:
        f.gap_s = round(rng.uniform(*gaps), 1)
    return faults


# -- what the harness sees during the run ------------------------------------------------------------------------------
@dataclass
class Observed:
    heartbeats: list[NodeHeartbeat] = field(default_factory=list)
    placed_ts: list[float] = field(default_factory=list)  # event ts of every `placed` seen live
    bad_heartbeats: int = 0

    # (node, report ts) → the full report: a lease repeats the one it names, at the lease's time
    reports: dict[tuple[str, float], NodeHeartbeat] = field(default_factory=dict)
    leases_unmatched: int = 0  # leases naming a report sent before the harness listened

    async def on_heartbeat(self, msg: Any) -> None:
        try:
            hb = NodeHeartbeat.model_validate_json(msg.data)
        except Exception:
            self.bad_heartbeats += 1
            return
        self.heartbeats.append(hb)
        self.reports[(hb.node, hb.ts)] = hb

    async def on_lease(self, msg: Any) -> None:
        """A node's lease says its last report still holds: counted as that report sent again, so the checks on the
        nodes' own account see every heartbeat as before leases (and a process beside the node's executor, whose
        reports differ, is still told apart by the report its leases name)."""
        try:
            lease = NodeLease.model_validate_json(msg.data)
        except Exception:
            self.bad_heartbeats += 1
            return
        report = self.reports.get((lease.node, lease.report_ts))
        if report is None:
            self.leases_unmatched += 1
            return
        self.heartbeats.append(report.model_copy(update={"ts": lease.ts}))

    async def on_placed(self, msg: Any) -> None:
        with contextlib.suppress(Exception):
            self.placed_ts.append(float(json.loads(msg.data)["ts"]))


async def connect(url: str) -> Client:
    """A connection that rides out a NATS outage: reconnects for ever, quickly, and keeps its subscriptions."""

    async def quiet(exc: Exception) -> None:
        return None

    return await nats.connect(
        servers=nats_servers(url),
        allow_reconnect=True,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.2,
        connect_timeout=2,
        error_cb=quiet,
    )


async def answers_list(c: OnePlusClient) -> bool:
    try:
        await asyncio.wait_for(c.list_jobs(limit=1), 3.0)
        return True
    except (PlatformError, TimeoutError, nats.errors.Error, OSError):
        return False


# -- the run -----------------------------------------------------------------------------------------------------------
@dataclass
class ChaosConfig:
    gangs: int = 300
    seed: int = 1
    profile: str = "full"
    duration_s: tuple[float, float] = (1.0, 4.0)
    cancels: int = 4
    warmup_s: float = 5.0  # before the first fault
    recovery_wait_s: float = 30.0  # wait this long for a `placed` after a fault before going on
    drain_timeout_s: float = 600.0  # for every job to end after the last fault
    stall_s: float = 90.0  # ... unless nothing at all changes for this long (wedged)
    heartbeat_s: float = 0.5
    node_lost_after_s: float = 6.0
    workdir: Path | None = None


@dataclass
class ChaosResult:
    config: dict[str, Any]
    jobs: dict[str, Any]
    faults: list[dict[str, Any]]
    invariants: dict[str, list[str]]
    notes: list[str]
    wall_s: float
    workdir: str
    evidence: dict[str, list[str]] = field(default_factory=dict)  # job id → service log lines that name it

    @property
    def ok(self) -> bool:
        return not any(self.invariants.values())


class ChaosRun:
    def __init__(self, cfg: ChaosConfig) -> None:
        self.cfg = cfg
        self.workdir = cfg.workdir or Path(tempfile.mkdtemp(prefix="oneplus-chaos-"))
        self.servers = EmbeddedServers(workdir=self.workdir / "servers")
        self.platform: Platform | None = None
        self.gangs = chaos_workload(cfg.gangs, cfg.seed, cfg.duration_s, cfg.cancels)
        self.faults = self.fault_schedule()
        self.obs = Observed()
        self.submitted: dict[int, str] = {}  # gang index → job id
        self.refused: dict[int, str] = {}  # gang index → why the intake refused it for good
        self.cancelled: set[str] = set()  # job ids whose cancel the platform accepted
        self.cancel_refused: dict[str, str] = {}
        self.notes: list[str] = []
        self.t0 = 0.0
        self.paused: int | None = None

    def fault_schedule(self) -> list[Fault]:
        return schedule(self.cfg.profile, self.cfg.seed, tuple(n.name for n in DEMO_NODES))

    def log(self, text: str) -> None:
        console.print(f"[dim]{time.monotonic() - self.t0:7.1f}s[/] {text}")

    # -- driving -------------------------------------------------------------------------------------------------------
    async def submit_all(self, c: OnePlusClient, pace_s: float) -> None:
        cancels: list[asyncio.Task[None]] = []
        start = time.monotonic()
        for gang in self.gangs:
            await asyncio.sleep(max(0.0, start + gang.index * pace_s - time.monotonic()))
            msg_id = f"chaos-{self.cfg.seed}-{gang.index}"
            tries = 0
            first = time.monotonic()
            while True:
                tries += 1
                try:
                    reply = await c.submit(gang.spec, msg_id=msg_id, source="chaos")
                except (PlatformError, nats.errors.Error, OSError) as exc:
                    if time.monotonic() - first > SUBMIT_GIVE_UP_S:
                        self.refused[gang.index] = f"no answer for {SUBMIT_GIVE_UP_S:g} s: {exc}"
                        break
                    await asyncio.sleep(0.3)  # down or unreachable: the same submission id again
                    continue
                if reply.ok and reply.job_id:
                    self.submitted[gang.index] = reply.job_id
                    break
                if tries >= 20:
                    self.refused[gang.index] = str(reply.error)
                    break
                await asyncio.sleep(0.5)
            if gang.cancel_after_s is not None and gang.index in self.submitted:
                job_id = self.submitted[gang.index]
                cancels.append(asyncio.create_task(self.cancel_later(c, job_id, gang.cancel_after_s)))
        await asyncio.gather(*cancels)

    async def cancel_later(self, c: OnePlusClient, job_id: str, after_s: float) -> None:
        await asyncio.sleep(after_s)
        for _ in range(200):
            try:
                await c.cancel(job_id)
                self.cancelled.add(job_id)
                return
            except PlatformError as exc:
                if "already" in str(exc):
                    self.cancel_refused[job_id] = str(exc)
                    return
            except (nats.errors.Error, OSError):
                pass
            await asyncio.sleep(0.5)
        self.cancel_refused[job_id] = "no answer to the cancel request"

    async def aim(self, f: Fault) -> None:
        """Settle what a fault hits when it depends on the moment (a stream's leader, the current primary)."""
        if f.kind == "pause-leader":
            assert self.platform is not None
            leading = [
                await asyncio.to_thread(solver_metric, self.platform, n, "oneplus_solver_leading") for n in SOLVERS
            ]
            leaders = [n for n, v in zip(SOLVERS, leading, strict=True) if v == 1]
            if len(leaders) == 1:
                f.target = leaders[0]
            else:
                f.note = f"no single leader when the fault came ({leaders or 'none'}); paused {f.target}"

    async def inject(self, f: Fault, c: OnePlusClient) -> None:
        await self.aim(f)
        f.at_s = round(time.monotonic() - self.t0, 2)
        began = time.monotonic()
        self.log(f"[bold red]fault[/] {f.label} for {f.down_s:g}s")
        starts = self.platform.logs(f.target).count(STARTED) if self.platform is not None else 0
        await self.apply_fault(f)
        f.lasted_s = round(time.monotonic() - began, 2)
        end_wall, end_mono = time.time(), time.monotonic()
        await self.measure_recovery(f, c, end_wall, end_mono)
        if f.kind == "kill":
            await self.wait_started(f, starts)

    async def wait_started(self, f: Fault, starts: int, timeout_s: float = 60.0) -> None:
        """Until the process a kill restarted has started (one more start line in its log): the next fault must not
        come while it is still starting. Recovery is measured before this, from the moment it was restarted (the
        platform places on the other nodes meanwhile), so the figures keep their meaning; seen in CI, an executor
        restarted 0.1 s before the NATS outage exited on its start-up's timed-out request."""
        p = self.platform
        assert p is not None
        deadline = time.monotonic() + timeout_s
        while p.logs(f.target).count(STARTED) <= starts:
            if p.procs[f.target].poll() is not None or time.monotonic() > deadline:
                f.note = (f.note + "; " if f.note else "") + f"{f.target} did not start again"
                return
            await asyncio.sleep(0.1)

    async def apply_fault(self, f: Fault) -> None:
        """Do the fault and undo it (restart, resume) after `f.down_s`."""
        p = self.platform
        assert p is not None
        if f.kind == "kill":
            p.kill(f.target)
            await asyncio.sleep(f.down_s)
            if f.target.startswith("executor-"):
                node = next(n for n in p.nodes if f"executor-{n.name}" == f.target)
                p.start_executor(node)
            else:
                p.start_service(f.target)
        elif f.kind in ("pause", "pause-leader"):
            pid = p.procs[f.target].pid
            os.kill(pid, signal.SIGSTOP)
            self.paused = pid
            try:
                await asyncio.sleep(f.down_s)
            finally:
                os.kill(pid, signal.SIGCONT)
                self.paused = None
        elif f.kind == "nats-outage":
            self.servers.kill_nats()
            await asyncio.sleep(f.down_s)
            await asyncio.to_thread(self.servers.start_nats)
        elif f.kind == "redis-reset":
            self.servers.kill_redis()
            await asyncio.sleep(f.down_s)
            await asyncio.to_thread(self.servers.start_redis)
        else:
            raise ValueError(f"unknown fault kind {f.kind!r}")

    async def measure_recovery(self, f: Fault, c: OnePlusClient, end_wall: float, end_mono: float) -> None:
        # Recovery: the platform answers a job list; the next placement after the fault's end.
        while not await answers_list(c):
            if time.monotonic() - end_mono > 120:
                f.note = "no answer to jobs list within 120 s"
                break
            await asyncio.sleep(0.1)
        else:
            f.recovery_list_s = round(time.monotonic() - end_mono, 2)
        while time.monotonic() - end_mono < self.cfg.recovery_wait_s:
            later = [t for t in self.obs.placed_ts if t >= end_wall]
            if later:
                f.recovery_placed_s = round(max(0.0, min(later) - end_wall), 2)
                break
            await asyncio.sleep(0.1)
        else:
            waiting = await self.waiting(c)
            f.note = (f.note + "; " if f.note else "") + (
                f"no placement within {self.cfg.recovery_wait_s:g} s ({waiting} jobs waiting)"
            )
        self.log(
            f"  recovered: jobs list after {fmt_s(f.recovery_list_s)}, next placement after "
            f"{fmt_s(f.recovery_placed_s)} {f.note}"
        )

    async def waiting(self, c: OnePlusClient) -> int | str:
        try:
            return len(await asyncio.wait_for(c.list_jobs(state="ACCEPTED"), 5))
        except Exception:
            return "?"

    async def wait_terminal(self, c: OnePlusClient, timeout: float) -> dict[str, JobRecord]:
        """Until every submitted job is listed and terminal, `timeout` passes, or nothing at all changed (no job's
        state, no placement) for `stall_s`: then the platform is wedged and waiting longer shows nothing more."""
        deadline = time.monotonic() + timeout
        wanted = set(self.submitted.values())
        jobs: dict[str, JobRecord] = {}
        last = ""
        changed = time.monotonic()
        view: tuple[Any, ...] = ()
        while time.monotonic() < deadline:
            with contextlib.suppress(PlatformError, TimeoutError, nats.errors.Error, OSError):
                jobs = {r.job_id: r for r in await asyncio.wait_for(c.list_jobs(), 30) if r.job_id in wanted}
            if len(jobs) == len(wanted) and all(r.terminal for r in jobs.values()):
                return jobs
            now_view = (tuple(sorted((r.job_id, r.state, r.attempt) for r in jobs.values())), len(self.obs.placed_ts))
            if now_view != view:
                view, changed = now_view, time.monotonic()
            elif time.monotonic() - changed > self.cfg.stall_s:
                self.notes.append(f"nothing changed for {self.cfg.stall_s:g} s: stopped waiting for the jobs to end")
                self.log(f"[red]wedged:[/] nothing changed for {self.cfg.stall_s:g} s")
                return jobs
            head = " ".join(f"{k}={v}" for k, v in sorted(Counter(r.state for r in jobs.values()).items()))
            head += f" (listed {len(jobs)} of {len(wanted)})"
            if head != last:
                self.log(f"jobs: {head}")
                last = head
            await asyncio.sleep(1.0)
        self.notes.append(f"not every job ended within {timeout:g} s")
        return jobs

    @property
    def witnesses_fence(self) -> bool:
        """Whether the fenced streams are mirrored from the start, to count the writes of deposed owners at the end."""
        return self.cfg.profile == "fenced"

    def platform_env(self) -> dict[str, str]:
        return {
            "ONEPLUS_HEARTBEAT_S": str(self.cfg.heartbeat_s),
            "ONEPLUS_NODE_LOST_AFTER_S": str(self.cfg.node_lost_after_s),
            **queue_config_env(self.workdir, PREEMPT_AT_ONCE),  # gangs run for seconds: preempt them at once
        }

    def start_world(self) -> str:
        """Start the servers and the platform; the NATS URL the harness connects to."""
        self.servers.start()
        self.platform = Platform(
            self.servers.nats_url, self.servers.redis_url, nodes=DEMO_NODES, logdir=self.workdir / "logs",
            extra_env=self.platform_env(), solver_replicas=2 if self.cfg.profile == "fenced" else 1,
        ).start()  # fmt: skip
        return self.servers.nats_url

    def stop_world(self) -> None:
        if self.platform is not None:
            self.platform.stop()
        self.servers.stop()

    def reservation_store(self) -> ReservationStore:
        """A store on the run's Redis, for the end-of-run check (the check closes it)."""
        return ReservationStore.from_url(self.servers.redis_url)

    async def reservations_left(self) -> list[str]:
        return await check_reservations(self.reservation_store())

    async def run(self) -> ChaosResult:
        cfg = self.cfg
        self.t0 = time.monotonic()
        nats_url = self.start_world()
        self.log(f"servers and services started; logs in {self.workdir}")
        nc = await connect(nats_url)
        try:
            c = OnePlusClient(nc, timeout=5.0)
            await wait_for_platform(c, len(DEMO_NODES), timeout=180)
            await nc.subscribe(subjects.node_heartbeat("*"), cb=self.obs.on_heartbeat)
            await nc.subscribe(subjects.node_lease("*"), cb=self.obs.on_lease)
            await nc.subscribe(subjects.all_job_events("placed"), cb=self.obs.on_placed)
            if self.witnesses_fence:
                await start_witness(nc.jetstream())
            self.log(f"platform up: {len(DEMO_NODES)} nodes; {len(self.gangs)} gangs, {len(self.faults)} faults")
            planned = cfg.warmup_s + sum(f.gap_s + f.down_s + 3.0 for f in self.faults)
            pace = planned / max(1, len(self.gangs))
            submitter = asyncio.create_task(self.submit_all(c, pace))
            await asyncio.sleep(cfg.warmup_s)
            for f in self.faults:
                await asyncio.sleep(f.gap_s)
                await self.inject(f, c)
            await submitter
            self.log(f"faults done; {len(self.submitted)} jobs submitted; waiting for every job to end")
            jobs = await self.wait_terminal(c, cfg.drain_timeout_s)
            await asyncio.sleep(2 * cfg.heartbeat_s + 1.0)  # the last heartbeats and releases
            return await self.check(nc, c, jobs)
        finally:
            if self.paused is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.paused, signal.SIGCONT)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(nc.close(), 5)
            self.stop_world()

    # -- checking ------------------------------------------------------------------------------------------------------
    async def check(self, nc: Client, c: OnePlusClient, jobs: dict[str, JobRecord]) -> ChaosResult:
        events = await read_job_stream(nc)
        by_job: dict[str, list[JobEvent]] = defaultdict(list)
        for ev in events:
            by_job[ev.job_id].append(ev)
        inv: dict[str, list[str]] = {}
        inv[OUTCOMES] = check_outcomes(self.submitted, self.refused, jobs, by_job, self.cancelled)
        inv["no job placed twice at once (event stream)"] = check_attempts(by_job)
        holds, gpu_violations = gpu_holds(events)
        inv["no GPU held by two jobs at once (event stream)"] = gpu_violations
        hb_violations, given, hb_notes = check_heartbeats(self.obs.heartbeats, self.cfg.heartbeat_s, holds)
        inv["no GPU used by two ranks at once (nodes' own heartbeats)"] = hb_violations
        inv["no GPU given to a job while its node still ran another's rank on it (heartbeats vs events)"] = given
        self.notes.extend(hb_notes)
        audit, audit_note = await check_audit(nc)
        inv["no GPU held by two reservations at once (JetStream reservation audit)"] = audit
        if audit_note:
            self.notes.append(audit_note)
        inv["no dead letters"] = await check_dead_letters(nc)
        inv["every service alive at the end"] = await self.check_alive(c)
        inv["job records equal a replay of the event stream"] = check_replay(by_job, jobs)
        inv["no reservation left in Redis once every job ended"] = await self.reservations_left()
        if self.witnesses_fence:
            landed, fence_notes = await check_fenced_writes(nc.jetstream())
            inv[FENCED_WRITES] = landed
            self.notes.extend(fence_notes)
        if self.cfg.profile == "fenced":
            assert self.platform is not None
            for name in SOLVERS:
                refused = await asyncio.to_thread(
                    solver_metric, self.platform, name, "oneplus_owner_writes_refused_total"
                )
                self.notes.append(f"{name}: {refused:g} write(s) refused by the NATS server (deposed owner)")
        self.notes.extend(await consumer_lag(nc))
        if self.cancel_refused:
            self.notes.append(f"cancels refused (the job had already ended): {self.cancel_refused}")
        states = Counter(r.state for r in jobs.values())
        placed = sum(1 for e in events if e.type == "placed")
        summary = {
            "submitted": len(self.submitted),
            "refused": len(self.refused),
            "states": dict(sorted(states.items())),
            "cancel_requested": len(self.cancelled),
            "placements": placed,
            "preemptions": sum(r.preemptions for r in jobs.values()),
            "infra_requeues": sum(r.infra_requeues for r in jobs.values()),
            "events": len(events),
            "heartbeats": len(self.obs.heartbeats),
            "heartbeats_with_ranks": sum(1 for h in self.obs.heartbeats if h.ranks),
            # Of the heartbeats, those sent as full reports (the rest are leases, counted as the report they repeat).
            "full_reports": len(self.obs.reports),
            "leases_unmatched": self.obs.leases_unmatched,
        }
        evidence = self.evidence(inv)
        return ChaosResult(
            evidence=evidence,
            config={k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(self.cfg).items()},
            jobs=summary,
            faults=[{**asdict(f), "label": f.label} for f in self.faults],
            invariants=inv,
            notes=self.notes,
            wall_s=round(time.monotonic() - self.t0, 1),
            workdir=str(self.workdir),
        )

    def evidence(self, inv: dict[str, list[str]], jobs: int = 6, lines: int = 6) -> dict[str, list[str]]:
        """For the first jobs named in a violation: the warning/error lines of the service logs that name them."""
        assert self.platform is not None
        named: list[str] = []
        for violations in inv.values():
            for v in violations:
                for word in JOB_ID.findall(v):
                    if word not in named:
                        named.append(word)
        logs = {f.stem: f.read_text(errors="replace").splitlines() for f in sorted(self.platform.logdir.glob("*.log"))}
        out: dict[str, list[str]] = {}
        for job_id in named[:jobs]:
            hits = [
                f"{name}: {line.strip()}"
                for name, text in logs.items()
                for line in text
                if job_id in line and any(w in line for w in TELLING)
            ]
            out[job_id] = hits[:lines]
        if any("stuck" in v or "lost:" in v for v in inv.get(OUTCOMES, [])):
            for name in ("placement-solver", "intake"):  # where a wedged job owner or intake shows
                out[f"{name} (last lines)"] = [line.strip() for line in logs.get(name, [])[-lines:]]
        return out

    async def check_alive(self, c: OnePlusClient) -> list[str]:
        assert self.platform is not None
        out = [f"{name} exited with code {code}" for name, code in self.platform.dead().items()]
        try:
            await wait_for_platform(c, len(DEMO_NODES), timeout=30)
        except PlatformError as exc:
            out.append(str(exc))
        return out


# -- invariants --------------------------------------------------------------------------------------------------------
async def read_job_stream(nc: Client) -> list[JobEvent]:
    """Every job event, in stream order (the owner is the stream's one writer: this is the order it decided in)."""
    js = nc.jetstream()
    info = await js.stream_info(subjects.JOBS_STREAM)
    last = info.state.last_seq
    out: list[JobEvent] = []
    if info.state.messages == 0:
        return out
    sub = await js.subscribe(subjects.JOB_EVENTS_ALL, ordered_consumer=True, deliver_policy=DeliverPolicy.ALL)
    try:
        while True:
            msg = await sub.next_msg(timeout=10.0)
            if not is_fence(msg.subject):  # an owner's epoch (oneplus_bus.fencing), not an event
                out.append(parse_job_event(msg.data))
            if msg.metadata.sequence.stream >= last:
                return out
    finally:
        await sub.unsubscribe()


def check_outcomes(
    submitted: dict[int, str],
    refused: dict[int, str],
    jobs: dict[str, JobRecord],
    by_job: dict[str, list[JobEvent]],
    cancelled: set[str],
) -> list[str]:
    out = [f"gang {i} refused by the intake: {why}" for i, why in sorted(refused.items())]
    for i, job_id in sorted(submitted.items()):
        rec = jobs.get(job_id)
        if rec is None:
            seen = [e.type for e in by_job.get(job_id, [])]
            out.append(f"{job_id} (gang {i}) lost: not listed; its events: {seen}")
            continue
        if not rec.terminal:
            out.append(f"{job_id} (gang {i}) stuck in {rec.state} (reason {rec.reason!r}, token {rec.token})")
            continue
        if job_id in cancelled:
            if rec.state != "CANCELLED":
                out.append(f"{job_id} was cancelled but ended {rec.state}: {rec.reason}")
            continue
        if rec.state == "SUCCEEDED":
            continue
        fin = [e for e in by_job.get(job_id, []) if e.type == "finished"]
        own_exit = (
            rec.state == "FAILED"
            and not rec.infra_nodes
            and bool(fin)
            and getattr(fin[-1], "exit_code", None) not in (None, 0)
            and (rec.spec.simulate is None or rec.spec.simulate.exit_code != 0)
        )
        if not own_exit:
            out.append(f"{job_id} (gang {i}) ended {rec.state}: {rec.reason} (infra nodes {rec.infra_nodes})")
    return out


def check_attempts(by_job: dict[str, list[JobEvent]]) -> list[str]:
    """Per job at most one live attempt: a `placed` only when the previous one ended (finished or requeued), and
    every attempt under a token of its own."""
    out = []
    for job_id, events in by_job.items():
        live: int | None = None
        tokens: list[int] = []
        for ev in events:
            if ev.type == "placed":
                if live is not None:
                    out.append(f"{job_id} placed again (token {ev.token}) while attempt {live} was live")
                if ev.token in tokens:
                    out.append(f"{job_id} placed twice under token {ev.token}")
                tokens.append(ev.token)
                live = ev.token
            elif ev.type in ("finished", "requeued"):
                live = None
    return out


Hold = tuple[float, float, str, int]  # (from ts, until ts, job id, token)


def gpu_holds(events: list[JobEvent]) -> tuple[dict[tuple[str, int], list[Hold]], list[str]]:
    """Walk the stream: a GPU is held from an attempt's `placed` until its `finished` or `requeued`. Returns every
    hold per (node, GPU) and the placements that took a GPU another job still held."""
    holder: dict[tuple[str, int], tuple[str, int, float, int]] = {}  # slot → (job, token, since, milli)
    attempt: dict[str, tuple[int, float, list[tuple[str, int]]]] = {}  # job → (token, since, slots)
    holds: dict[tuple[str, int], list[Hold]] = defaultdict(list)
    out: list[str] = []

    def release(job_id: str, ts: float) -> None:
        if job_id not in attempt:
            return
        token, since, slots = attempt.pop(job_id)
        for slot in slots:
            holds[slot].append((since, ts, job_id, token))
            h = holder.get(slot)
            if h is not None and h[0] == job_id:
                del holder[slot]

    for ev in events:
        if ev.type == "placed":
            release(ev.job_id, ev.ts)  # a second live attempt is check_attempts' finding; count from the new one
            slots = []
            for r in ev.allocation.ranks:
                for g in r.gpus:
                    slot = (r.node, g)
                    h = holder.get(slot)
                    if h is not None and h[0] != ev.job_id and not (r.gpu_milli and h[3]):
                        out.append(
                            f"{r.node} GPU {g}: {ev.job_id} placed (token {ev.token}) while {h[0]} "
                            f"(token {h[1]}) held it since {h[2] - events[0].ts:.2f}s"
                        )
                    holder[slot] = (ev.job_id, ev.token, ev.ts, r.gpu_milli)
                    slots.append(slot)
            attempt[ev.job_id] = (ev.token, ev.ts, slots)
        elif ev.type in ("finished", "requeued"):
            release(ev.job_id, ev.ts)
    for job_id in list(attempt):
        release(job_id, float("inf"))
    return holds, out


def check_heartbeats(
    heartbeats: list[NodeHeartbeat], heartbeat_s: float, holds: dict[tuple[str, int], list[Hold]]
) -> tuple[list[str], list[str], list[str]]:
    """The nodes' own account (`ranks` in their heartbeats), independent of Redis and of the solver:

    - in one heartbeat, no GPU under two ranks;
    - two heartbeats of one node less than half a heartbeat interval apart (two processes speaking for the node:
      a restarted executor beside its old self) never put one GPU under two jobs; consecutive heartbeats of one
      executor are an interval apart, so a legitimate hand-over between them is not flagged;
    - per GPU, once another attempt has been reported on it, an earlier attempt is never reported on it again
      (both were alive over that span).

    Returned apart: a rank the node still reports more than two heartbeats after its attempt ended in the event
    stream, on a GPU the stream had given to another job by then (the solver gave away a GPU its node still used).
    """
    out: list[str] = []
    given: list[str] = []  # the last rule's findings: a control-plane fault, not yet a double use on the node
    notes: list[str] = []
    with_ranks = [h for h in heartbeats if h.ranks]
    running = sum(1 for h in heartbeats if h.running)
    if not with_ranks:
        notes.append(
            f"{len(heartbeats)} heartbeats collected, none carries a rank report (`ranks` empty; {running} list "
            "running jobs): the heartbeat checks had nothing to check"
        )
        return out, given, notes
    notes.append(f"{len(heartbeats)} heartbeats collected, {len(with_ranks)} with a rank report")
    window = heartbeat_s / 2
    slack = 2 * heartbeat_s + 0.5
    per_node: dict[str, list[NodeHeartbeat]] = defaultdict(list)
    for h in heartbeats:
        per_node[h.node].append(h)
    for node, hbs in per_node.items():
        hbs.sort(key=lambda h: h.ts)
        for h in hbs:
            seen: dict[int, str] = {}
            for r in h.ranks:
                for g in r.gpus:
                    if g in seen and seen[g] != f"{r.job_id}/{r.token}":
                        out.append(f"{node} heartbeat at {h.ts:.2f}: GPU {g} under {seen[g]} and {r.job_id}/{r.token}")
                    seen[g] = f"{r.job_id}/{r.token}"
        for i, a in enumerate(hbs):
            for b in hbs[i + 1 :]:
                if b.ts - a.ts >= window:
                    break
                ga = {g: r.job_id for r in a.ranks for g in r.gpus}
                for r in b.ranks:
                    for g in r.gpus:
                        if g in ga and ga[g] != r.job_id:
                            out.append(
                                f"{node}: GPU {g} reported under {ga[g]} at {a.ts:.2f} and {r.job_id} at {b.ts:.2f}"
                            )
        # Interleaving per GPU.
        order: dict[int, list[tuple[str, int]]] = defaultdict(list)
        for h in hbs:
            for r in h.ranks:
                for g in r.gpus:
                    seq = order[g]
                    key = (r.job_id, r.token)
                    if seq and seq[-1] == key:
                        continue
                    if key in seq:
                        others = seq[seq.index(key) + 1 :]
                        out.append(f"{node} GPU {g}: {key[0]}/{key[1]} reported again at {h.ts:.2f} after {others}")
                    seq.append(key)
        # Ranks that outlived their attempt on a GPU given to another job.
        for h in hbs:
            for r in h.ranks:
                for g in r.gpus:
                    mine = [x for x in holds.get((node, g), []) if x[2] == r.job_id and x[3] == r.token]
                    if not mine or mine[-1][1] >= h.ts - slack:
                        continue
                    other = [x for x in holds.get((node, g), []) if x[0] <= h.ts < x[1] and x[2] != r.job_id]
                    if other:
                        given.append(
                            f"{node} GPU {g}: {r.job_id}/{r.token} still running at {h.ts:.2f}, "
                            f"{h.ts - mine[-1][1]:.1f}s after its attempt ended, while {other[0][2]} held the GPU"
                        )
    return dedupe(out), dedupe(given), notes


def dedupe(lines: list[str], keep: int = 50) -> list[str]:
    seen = list(dict.fromkeys(lines))
    return seen if len(seen) <= keep else [*seen[:keep], f"... and {len(seen) - keep} more"]


async def consumer_lag(nc: Client) -> list[str]:
    """Durable consumers with work left at the end (a service that stopped consuming shows here)."""
    js = nc.jetstream()
    out = []
    for stream in subjects.STREAMS:
        with contextlib.suppress(Exception):
            for ci in await js.consumers_info(stream):
                if ci.num_pending or ci.num_ack_pending:
                    out.append(
                        f"consumer {ci.name} on {stream}: {ci.num_pending} pending, {ci.num_ack_pending} delivered "
                        f"and not acknowledged, {ci.num_waiting} pulls waiting"
                    )
    return out


def solver_metric(platform: Platform, name: str, sample: str) -> float:
    """The sum of `sample`'s values on process `name`'s /metrics (NaN when it does not answer)."""
    url = platform.metrics_urls().get(name)
    if url is None:
        return float("nan")
    try:
        with urllib.request.urlopen(url, timeout=3) as resp:
            text = resp.read().decode()
    except OSError:
        return float("nan")
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == sample)


# -- the fenced streams' witness --------------------------------------------------------------------------------------
WITNESS_PREFIX = "CHAOS_WITNESS_"


async def start_witness(js: JetStreamContext) -> None:
    """Mirror every stream the job owner writes, kept whole: the `jobs` bucket purges archived jobs' keys and keeps
    5 revisions a key, `solver_state` one; a mirror keeps every write it copied, with its headers (a write purged
    from the source before the mirror copied it, while the mirror was cut off, is not witnessed). As many copies as
    the stream it mirrors (on a cluster, the loss of one server loses no witness)."""
    for stream in FENCED_STREAMS:
        replicas = (await js.stream_info(stream)).config.num_replicas or 1
        await js.add_stream(
            StreamConfig(
                name=WITNESS_PREFIX + stream,
                mirror=StreamSource(name=stream),
                storage=StorageType.FILE,
                num_replicas=replicas,
            )
        )


@dataclass(frozen=True)
class Witnessed:
    seq: int
    subject: str
    epoch: int | None  # Oneplus-Owner-Epoch: the owner epoch it was written under (None: not an owner write)
    ts: float


async def read_witness(js: JetStreamContext, stream: str, timeout: float = 30.0) -> list[Witnessed]:
    """Every write the mirror of `stream` holds, in order, once it has caught up with `stream`."""
    mirror = WITNESS_PREFIX + stream
    want = await last_held_seq(js, stream)
    deadline = time.monotonic() + timeout
    while (got := int((await js.stream_info(mirror)).state.last_seq or 0)) < want:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the mirror of {stream} did not catch up with it: sequence {got} of {want}")
        await asyncio.sleep(0.2)
    info = await js.add_consumer(
        mirror, config=ConsumerConfig(ack_policy=AckPolicy.NONE, mem_storage=True, inactive_threshold=30.0)
    )
    sub = await js.pull_subscribe_bind(consumer=info.name, stream=mirror)
    out: list[Witnessed] = []
    try:
        todo = info.num_pending or 0
        while todo > 0:
            for msg in await sub.fetch(batch=min(todo, 512), timeout=5.0):
                raw = (msg.headers or {}).get(EPOCH_HEADER)
                ts = msg.metadata.timestamp.timestamp() if msg.metadata.timestamp else 0.0
                out.append(Witnessed(msg.metadata.sequence.stream, msg.subject, int(raw) if raw else None, ts))
                todo -= 1
    finally:
        await sub.unsubscribe()
    return out


async def last_held_seq(js: JetStreamContext, stream: str) -> int:
    """The last sequence `stream` still holds: its last_seq counts writes purged since, which a mirror that was cut
    off when they were purged never receives (the owner purges an archived job's key from the `jobs` bucket)."""
    state = (await js.stream_info(stream)).state
    first, seq = int(state.first_seq or 0), int(state.last_seq or 0)
    while seq >= max(first, 1):
        try:
            await js.get_msg(stream, seq)
            return seq
        except NotFoundError:
            seq -= 1
    return 0


def deposed_writes(by_stream: dict[str, list[Witnessed]], lease_at: dict[int, float]) -> list[str]:
    """Writes of an owner epoch that landed after a newer epoch had been taken: in a stream's own order, after a
    newer epoch's write there; or, by the server's clock, after the lease passed to a newer epoch (`lease_at`:
    epoch → when its owner wrote the lease revision the epoch is). Both must be none."""
    out: list[str] = []
    epochs = sorted(e for e in lease_at)
    for stream, msgs in by_stream.items():
        top = 0
        for m in msgs:
            if m.epoch is None:
                continue
            if m.epoch < top:
                out.append(f"{stream} seq {m.seq} ({m.subject}): written under epoch {m.epoch} after epoch {top}'s")
            top = max(top, m.epoch)
            newer = [e for e in epochs if e > m.epoch]
            if newer and m.ts > lease_at[newer[0]] and not is_fence(m.subject):
                out.append(
                    f"{stream} seq {m.seq} ({m.subject}): written under epoch {m.epoch}, "
                    f"{m.ts - lease_at[newer[0]]:.3f}s after the lease passed to epoch {newer[0]}"
                )
    return dedupe(out)


async def check_fenced_writes(js: JetStreamContext) -> tuple[list[str], list[str]]:
    """The writes of a deposed owner that landed (must be none), from the mirrors; and notes on what was seen."""
    try:
        by_stream = {s: await read_witness(js, s) for s in FENCED_STREAMS}
    except Exception as exc:
        return [f"cannot read the fenced streams' mirrors: {exc}"], []
    lease = f"$KV.{subjects.SOLVER_STATE_KV}.{subjects.SOLVER_OWNER_LEASE_KEY}"
    at = {m.seq: m.ts for m in by_stream[SOLVER_STATE_STREAM] if m.subject == lease}
    taken = sorted({m.epoch for msgs in by_stream.values() for m in msgs if m.epoch is not None})
    lease_at = {e: at[e] for e in taken if e in at}
    owners = {
        m.epoch: m.subject for msgs in by_stream.values() for m in msgs if m.epoch is not None and is_fence(m.subject)
    }
    writes = sum(1 for msgs in by_stream.values() for m in msgs if m.epoch is not None and not is_fence(m.subject))
    notes = [
        f"fenced streams: {writes} owner writes under epochs {taken} (owner lease revisions; {len(owners)} fenced)"
    ]
    missing = [e for e in taken if e not in lease_at]
    if missing:
        notes.append(f"epochs {missing} have no lease write in the solver_state mirror: checked by stream order only")
    return deposed_writes(by_stream, lease_at), notes


async def check_audit(nc: Client) -> tuple[list[str], str]:
    """The solver's reservation audit on JetStream (outlives a Redis reset) replayed for double holds."""
    try:
        from oneplus_reservations import check_history
        from oneplus_stores.audit import audit_history, read_audit
    except ImportError:
        return [], "no reservation audit in this version of the platform: not checked"
    try:
        entries = await read_audit(nc)
    except Exception as exc:
        return [f"cannot read the reservation audit: {exc}"], ""
    if not entries:
        return [], "the reservation audit is empty: nothing to check"
    return dedupe(check_history(audit_history(entries))), f"reservation audit: {len(entries)} entries replayed"


async def check_dead_letters(nc: Client) -> list[str]:
    js = nc.jetstream()
    try:
        info = await js.stream_info(subjects.DEAD_LETTER_STREAM)
    except Exception as exc:
        return [f"cannot read {subjects.DEAD_LETTER_STREAM}: {exc}"]
    if info.state.messages == 0:
        return []
    out = []
    sub = await js.subscribe(subjects.DEAD_LETTER_ALL, ordered_consumer=True, deliver_policy=DeliverPolicy.ALL)
    try:
        for _ in range(min(info.state.messages, 20)):
            msg = await sub.next_msg(timeout=5)
            why = {k: v for k, v in (msg.headers or {}).items() if k.lower().startswith("oneplus")}
            out.append(f"{msg.subject}: {why or msg.data[:200]!r}")
    except Exception as exc:
        out.append(f"reading dead letters: {exc}")
    finally:
        await sub.unsubscribe()
    if info.state.messages > 20:
        out.append(f"... {info.state.messages} dead letters in all")
    return out


def check_replay(by_job: dict[str, list[JobEvent]], jobs: dict[str, JobRecord]) -> list[str]:
    """Every record as listed equals the fold of its job's events (apply_event), sequence and trace context aside."""
    out = []
    ignore = {"seq", "traceparent"}
    for job_id, rec in jobs.items():
        folded: JobRecord | None = None
        for ev in by_job.get(job_id, []):
            if isinstance(ev, JobRejected) and folded is None:
                # The intake's answer to one try, before any record (a retry of the same submission id is judged
                # again, and a node back from lost can make it fit): a refusal makes no record, so none to fold.
                continue
            try:
                folded = apply_event(folded, ev)
            except IllegalTransition as exc:
                out.append(f"{job_id}: the stream holds {ev.type} that does not apply: {exc}")
        if folded is None:
            out.append(f"{job_id}: listed ({rec.state}) but no event in the stream")
            continue
        a, b = rec.model_dump(exclude=ignore), folded.model_dump(exclude=ignore)
        diff = {k: (a[k], b[k]) for k in a if a[k] != b[k]}
        if diff:
            out.append(f"{job_id}: record differs from replay in {sorted(diff)}: {str(diff)[:300]}")
    return out


async def check_reservations(store: ReservationStore) -> list[str]:
    """What `store` still holds once every job ended (waiting up to 15 s for the last releases); closes it."""
    try:
        deadline = time.monotonic() + 15
        while True:
            held = await store.all()
            if not held or time.monotonic() > deadline:
                return [f"{r.job_id} token {r.token} still reserved" for r in held]
            await asyncio.sleep(1.0)
    except Exception as exc:
        return [f"cannot read the reservation store: {exc}"]
    finally:
        await store.close()


# -- reporting ---------------------------------------------------------------------------------------------------------
def fmt_s(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}s"


def render(result: ChaosResult) -> None:
    j = result.jobs
    console.print(
        f"\n[bold]chaos run[/] seed {result.config['seed']}, profile {result.config['profile']}: "
        f"{j['submitted']} jobs submitted ({j['refused']} refused), states {j['states']}, "
        f"{j['placements']} placements, {j['preemptions']} preemptions, {j['infra_requeues']} infra requeues, "
        f"{j['cancel_requested']} cancels; wall {result.wall_s:.0f}s"
    )
    t = Table(title="faults")
    for col in ("#", "fault", "at", "lasted", "jobs list after", "next placed after", "note"):
        t.add_column(col)
    for i, f in enumerate(result.faults, 1):
        t.add_row(
            str(i), f["label"], fmt_s(f["at_s"]), fmt_s(f["lasted_s"]), fmt_s(f["recovery_list_s"]),
            fmt_s(f["recovery_placed_s"]), f["note"],
        )  # fmt: skip
    console.print(t)
    t = Table(title="invariants")
    t.add_column("invariant")
    t.add_column("held")
    t.add_column("violations")
    for name, v in result.invariants.items():
        t.add_row(name, "[green]yes[/]" if not v else "[red]NO[/]", "\n".join(v[:8]) + (" ..." if len(v) > 8 else ""))
    console.print(t)
    for note in result.notes:
        console.print(f"note: {note}")
    for job_id, lines in result.evidence.items():
        console.print(f"[bold]{job_id}[/] in the service logs:")
        for line in lines:
            console.print(f"  {line}", markup=False, highlight=False)
    console.print(f"logs: {result.workdir}")


def markdown(data: dict[str, Any]) -> str:
    """The faults of a result (as written by --out) as a Markdown table, for the README."""
    rows = ["| # | fault | at | lasted | `jobs list` answers after | next `placed` after |", "|---" * 6 + "|"]
    for i, f in enumerate(data["faults"], 1):
        rows.append(
            f"| {i} | {f['label']} | {fmt_s(f['at_s'])} | {fmt_s(f['lasted_s'])} | {fmt_s(f['recovery_list_s'])} | "
            f"{fmt_s(f['recovery_placed_s'])}{' (' + f['note'] + ')' if f['note'] else ''} |"
        )
    broken = [f"{k}: {len(v)}" for k, v in data["invariants"].items() if v]
    rows.append("")
    rows.append(f"jobs: {data['jobs']}; invariants broken: {', '.join(broken) or 'none'}")
    return "\n".join(rows)


def run_chaos(cfg: ChaosConfig) -> ChaosResult:
    return asyncio.run(ChaosRun(cfg).run())


app = typer.Typer(add_completion=False)


@app.command()
def main(
    gangs: Annotated[int, typer.Option(help="Gangs of 1-16 GPUs to submit")] = 300,
    seed: Annotated[int, typer.Option(help="Seeds the workload and the fault schedule")] = 1,
    profile: Annotated[
        str,
        typer.Option(
            help="full: the issue's faults; ci: a shorter set (tests/e2e); fenced: two solver replicas, the owner "
            "SIGSTOPped past its lease twice, no write of a deposed owner may land"
        ),
    ] = "full",
    out: Annotated[Path | None, typer.Option(help="Write the result as JSON here")] = None,
    workdir: Annotated[Path | None, typer.Option(help="Servers' data and service logs (default: a temp dir)")] = None,
    drain_timeout: Annotated[float, typer.Option(help="Seconds for every job to end after the last fault")] = 600.0,
    report: Annotated[Path | None, typer.Option(help="Print a results file's faults as Markdown; run nothing")] = None,
) -> None:
    """A chaos run on the embedded default; exits 1 when an invariant did not hold."""
    if report is not None:
        print(markdown(json.loads(report.read_text())))
        return
    cfg = ChaosConfig(gangs=gangs, seed=seed, profile=profile, workdir=workdir, drain_timeout_s=drain_timeout)
    finish(run_chaos(cfg), out)


def finish(result: ChaosResult, out: Path | None) -> None:
    """Print the result, write it to `out` (JSON) if given, and exit 1 unless every invariant held."""
    render(result)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"ok": result.ok, **asdict(result)}, indent=2) + "\n")
        console.print(f"written: {out}")
    raise typer.Exit(0 if result.ok else 1)


if __name__ == "__main__":
    app()
