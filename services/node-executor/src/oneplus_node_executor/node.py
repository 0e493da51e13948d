"""What one node's executor does with its commands: launch, watch, cancel, preempt, reconcile, heartbeat.

The service wiring (subjects, consumers, ops endpoints) is in app.py; this is the behaviour behind it. Every handler
checks the fencing token first: a command of a superseded attempt is ignored, a redelivered launch starts nothing.

Whatever fails, nothing is lost, used twice or wedged:
- every fact goes through the outbox (outbox.py): on disk before `record` returns, delivered until it is stored;
- a lease is renewed only for ranks that are alive; a renewal that finds another attempt's token or no reservation
  stops the ranks (their end is reported once they have stopped, fault "infrastructure"); one that finds the store
  reset keeps them (the solver rebuilds every running job's reservation under the token its ranks hold);
- the node never starts a rank on a GPU where it still runs another attempt's rank (the last line of defence);
- a reconcile against a reset store adopts what runs, removes nothing, and runs again once the store is rebuilt.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from oneplus_bus.service import OneplusService, OpsError
from oneplus_contracts import (
    Allocation,
    CancelRanks,
    JobCheckpointed,
    JobEvent,
    JobNodeFinished,
    JobRunning,
    JobStarting,
    LaunchBatch,
    LaunchRanks,
    NodeHeartbeat,
    NodeLease,
    NodeTopology,
    PreemptRanks,
    RankPlacement,
    RankReport,
    SignalRanks,
    subjects,
)
from oneplus_contracts.events import Fault
from oneplus_reservations import ReservationStore
from oneplus_reservations.connect import RedisSettings
from oneplus_reservations.store import RenewStatus

from .gpu_health import GpuProbe, fold_probe, health_changes, heartbeat_gpus, probe_failed
from .outbox import Outbox, fact_sender
from .retention import FinishedRanks
from .runtime import slurm
from .runtime.base import EngineUnavailable, LauncherRuntime, LaunchFailed, RunningRanks, Runtime, StaleToken
from .runtime.docker import DockerRuntime
from .runtime.environment import launcher_environment, rank_environment
from .runtime.preemption import PreemptOutcome, preempt_with_checkpoint
from .runtime.reconcile import ReconcilePlan, plan_reconcile, reconcile_node

log = logging.getLogger("oneplus.executor")

LAUNCH_FAILED_EXIT = 127
LOST_EXIT = 137
LEASE_S = 30.0
TIME_LIMIT_EXIT = 143  # a job stopped at its time limit has failed (Slurm's TIMEOUT), whatever its ranks then exit
STOP_GRACE_S = 10.0  # SIGTERM → SIGKILL, for cancel and after a preemption's checkpoint wait
KEEP_FINISHED = 16  # ended jobs whose ranks (and logs) stay on the node for `oneplus logs`
WATCH_TRIES = 5  # unexpected errors while following a job's ranks before the executor gives up on them
GPU_CHECK_S = 30.0  # how often a GPU node re-reads its GPUs' health through NVML
# An unchanged full report is repeated at least this often; the heartbeats in between are leases (Kubernetes sends
# its NodeStatus on change and every 5 min). A solver that starts asks for reports at once (NODE_REPORT_REQUEST).
REPORT_EVERY_S = 30.0
PING_FAILURES = 2  # failed engine checks in a row before a heartbeat calls the node unhealthy (a slow ping is not down)
FENCE_GRACE_S = 5.0  # SIGTERM → SIGKILL for ranks whose reservation is gone
GPU_FREE_WAIT_S = STOP_GRACE_S + 5.0  # how long a launch waits for a fenced-out holder of its GPUs to exit
STORE_RESET_WAIT_S = 20.0  # how long a launch waits for the solver to rebuild a reset reservation store
REMEMBER_ENDS = 4096  # (job, token) attempts whose end this node recorded: a late launch of one starts nothing
LAUNCHER_POLL_S = 0.5  # how often an MPIJob's first node asks whether every worker runs, before its launcher starts
FENCED_OUT = "reservation lost (fenced out)"
INFRA: Fault = "infrastructure"


class StoreResetPending(RuntimeError):
    """The reservation store lost its state and is not rebuilt yet: the command is retried later (NAK)."""


class NodeExecutor:
    def __init__(
        self,
        svc: OneplusService,
        topology: NodeTopology,
        runtime: Runtime,
        *,
        heartbeat_s: float = 2.0,
        keep_finished: int = KEEP_FINISHED,
        remember_ends: int = REMEMBER_ENDS,
        gpu_probe: GpuProbe | None = None,
        gpu_check_s: float = GPU_CHECK_S,
        report_every_s: float = REPORT_EVERY_S,
        outbox: Outbox | None = None,
        state_dir: Path | None = None,
    ) -> None:
        """`outbox`: a shared one (a fleet's); otherwise the executor's own, in `state_dir` (memory only if None)."""
        self.svc = svc
        self.topology = topology
        self.node = topology.node
        self.runtime = runtime
        self.heartbeat_s = heartbeat_s
        self.gpu_probe = gpu_probe
        self.gpu_check_s = gpu_check_s
        self.report_every_s = report_every_s
        self.reported: tuple[Any, ...] | None = None  # what the last full report said, but its time (None: send one)
        self.report_ts = 0.0  # that report's `ts`
        self.tokens: dict[str, int] = {}  # job → token of the ranks this executor watches (until their end is kept)
        self.alive: dict[str, tuple[int, dict[int, int]]] = {}  # job → (token, GPU → milli) of ranks alive here
        self.watchers: dict[str, asyncio.Task[None]] = {}
        self.stop_reasons: dict[str, tuple[str, Fault]] = {}
        self.stopping: dict[str, asyncio.Task[None]] = {}  # job → the stop of its fenced-out ranks, under way
        self.preempting: dict[str, asyncio.Event] = {}  # job → set when its checkpoint handshake is over
        self.ended: dict[str, asyncio.Event] = {}  # job → set when all its local ranks have exited
        self.handshakes: set[asyncio.Task[None]] = set()
        # job → (token, its time limit's end here): Slurm's TIMEOUT
        self.deadlines: dict[str, tuple[int, asyncio.TimerHandle]] = {}
        self.timed_out: set[tuple[str, int]] = set()  # attempts stopped at their time limit
        self.finished = FinishedRanks(keep_finished)
        self.remember_ends = remember_ends
        self.engine_ok = True
        self.engine_reason: str | None = None
        self.reconciled = False
        self.failed_pings = 0
        self.store: ReservationStore | None = None
        self.ends: OrderedDict[tuple[str, int], None] = OrderedDict()  # attempts whose end on this node is kept
        self.gpu_free_wait_s = GPU_FREE_WAIT_S
        self.store_reset_wait_s = STORE_RESET_WAIT_S
        self.store_reset = False  # the last renewal found the reservation store reset (logged once)
        self.closing = False
        self.own_outbox = outbox is None
        if outbox is None:
            path = None if state_dir is None else Path(state_dir) / f"outbox-{self.node}.jsonl"
            outbox = Outbox(fact_sender(lambda: self.svc.ledger), path)
        self.outbox = outbox

    def rstore(self) -> ReservationStore:
        assert self.store is not None, "the executor's reservation store is opened on start"
        return self.store

    async def record(self, event: JobEvent) -> None:
        """Report what happened to the job's ranks here; the job's owner folds it (or refuses a stale one).

        Kept in the outbox (on disk) before this returns; its sender delivers it whenever the bus takes it."""
        self.outbox.put(event)

    async def node_finished(self, job_id: str, token: int, exit_code: int, reason: str, fault: Fault = "job") -> None:
        await self.record(
            JobNodeFinished(
                event_id=f"nodefin-{job_id}-{token}-{self.node}",
                job_id=job_id,
                node=self.node,
                token=token,
                exit_code=exit_code,
                reason=reason,
                fault=fault,
            )
        )
        self.ends[(job_id, token)] = None
        while len(self.ends) > self.remember_ends:
            self.ends.popitem(last=False)

    async def engine_down(self, exc: EngineUnavailable) -> None:
        """Say so at once: the registry marks the node unhealthy and the solver stops placing here."""
        was_ok = self.engine_ok
        self.engine_ok, self.engine_reason = False, str(exc)
        if was_ok:
            log.warning("%s: %s", self.node, exc)
            with contextlib.suppress(Exception):
                await self.publish_heartbeat()

    # -- launch and watch --------------------------------------------------------------------------------------

    async def launch_batch(
        self,
        batch: LaunchBatch,
        span: Callable[[LaunchRanks], AbstractContextManager[object]] = lambda _: contextlib.nullcontext(),
    ) -> None:
        """Each launch of the batch as a `launch` alone (its own token check, its own facts), in the batch's order.
        One that fails leaves the others launched and its error is raised once all were tried: the message is
        redelivered (or dead-lettered as any command), and a launch that went ahead starts nothing the second time."""
        failed: list[tuple[LaunchRanks, Exception]] = []
        for cmd in batch.launches:
            try:
                with span(cmd):
                    await self.launch(cmd)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failed.append((cmd, exc))
        if not failed:
            return
        for cmd, error in failed[1:]:
            log.warning("%s: launch of %s in %s failed too: %s", self.node, cmd.job_id, batch.command_id, error)
        raise failed[0][1]

    async def launch(self, cmd: LaunchRanks) -> None:
        if self.tokens.get(cmd.job_id, -1) >= cmd.token or (cmd.job_id, cmd.token) in self.ends:
            return  # redelivered: the ranks already run (or ran) under this token
        # The renewal is the fencing check: "ok" only while the reservation holds this token (one round trip).
        leased = await self.lease_for_launch(cmd.job_id, cmd.token)
        if leased != "ok":
            log.warning(
                "%s: refused launch of %s with stale token %s (its reservation: %s)",
                self.node,
                cmd.job_id,
                cmd.token,
                "another attempt's" if leased == "stale" else "none",
            )
            return
        leased_at = asyncio.get_running_loop().time()
        gpus = self.local_gpus(cmd.ranks)
        busy = self.gpu_conflicts(cmd.job_id, cmd.token, gpus)
        if busy:
            busy = await self.free_gpus(cmd.job_id, cmd.token, gpus, busy)
        if busy:
            job, token, gpu = busy[0]
            where = f"GPU {gpu} of {self.node}" if gpu is not None else f"{self.node}"
            reason = f"not started: {where} still runs {job} (token {token})"
            log.warning("%s: launch of %s (token %s) refused: %s", self.node, cmd.job_id, cmd.token, reason)
            await self.node_finished(cmd.job_id, cmd.token, LAUNCH_FAILED_EXIT, reason, fault=INFRA)
            return
        await self.record(
            JobStarting(
                event_id=f"starting-{cmd.job_id}-{cmd.token}-{self.node}",
                job_id=cmd.job_id,
                node=self.node,
                token=cmd.token,
            )
        )
        try:
            await self.runtime.launch(cmd, rank_environment(cmd, self.topology))
        except StaleToken as exc:
            log.warning("%s: %s", self.node, exc)  # a newer attempt holds the node: this command is history
            return
        except EngineUnavailable as exc:
            await self.engine_down(exc)  # the platform's fault, not the job's: it is requeued
            await self.node_finished(cmd.job_id, cmd.token, LAUNCH_FAILED_EXIT, f"launch failed: {exc}", fault=INFRA)
            return
        except LaunchFailed as exc:
            await self.node_finished(cmd.job_id, cmd.token, LAUNCH_FAILED_EXIT, f"launch failed: {exc}")
            return
        self.start_watch(cmd.job_id, cmd.token, gpus)
        self.limit_time(cmd)
        self.serve_slurm_steps(slurm.start_step_server(self.runtime, cmd, lambda: self.svc.nc))
        if asyncio.get_running_loop().time() - leased_at > LEASE_S / 4:  # a slow start (an image pull): renew now
            try:
                status = await self.rstore().renew_status(cmd.job_id, cmd.token, LEASE_S)
            except Exception as exc:  # the heartbeat renews it; the ranks run either way
                log.warning("%s: renewing the lease of %s failed: %s", self.node, cmd.job_id, exc)
            else:
                self.apply_renewals({(cmd.job_id, cmd.token): status})
        await self.record(
            JobRunning(
                event_id=f"running-{cmd.job_id}-{cmd.token}-{self.node}",
                job_id=cmd.job_id,
                node=self.node,
                token=cmd.token,
            )
        )
        if cmd.spec.launcher is not None and cmd.node_rank == 0:
            task = asyncio.create_task(self.run_launcher(cmd), name=f"launcher:{cmd.job_id}")
            self.handshakes.add(task)
            task.add_done_callback(self.handshakes.discard)

    # -- an MPIJob's launcher ------------------------------------------------------------------------------------

    async def workers_running(self, cmd: LaunchRanks) -> bool | None:
        """Whether every node of the attempt has reported its ranks running; None: the attempt is over."""
        rec, _ = await self.svc.ledger.get(cmd.job_id)
        if rec is None:
            return False
        if rec.token != cmd.token or rec.terminal:
            return None
        return set(cmd.nodes) <= set(rec.nodes_running)

    async def resume_launcher(self, job_id: str, token: int) -> None:
        """After a restart on an MPIJob's first node: its launcher, if it never started, starts once the workers run.
        The command is rebuilt from the job's record (no node addresses: those names are left to DNS)."""
        try:
            rec, _ = await self.svc.ledger.get(job_id)
        except Exception as exc:
            log.warning("%s: reading %s to resume its launcher failed: %s", self.node, job_id, exc)
            return
        if rec is None or rec.spec.launcher is None or rec.allocation is None or rec.token != token:
            return
        nodes = rec.allocation.nodes
        if not nodes or nodes[0] != self.node:
            return
        cmd = LaunchRanks(
            command_id=f"launcher-{job_id}-{token}",
            job_id=job_id,
            node=self.node,
            token=token,
            spec=rec.spec,
            ranks=[r for r in rec.allocation.ranks if r.node == self.node],
            world_size=len(rec.allocation.ranks),
            node_rank=0,
            nodes=nodes,
            master_addr=nodes[0],
            ranks_per_node=[sum(1 for r in rec.allocation.ranks if r.node == n) for n in nodes],
        )
        task = asyncio.create_task(self.run_launcher(cmd), name=f"launcher:{job_id}")
        self.handshakes.add(task)
        task.add_done_callback(self.handshakes.discard)

    async def run_launcher(self, cmd: LaunchRanks) -> None:
        """mpi-operator v2: the launcher starts once every worker runs; the job then ends with it (runtime.wait)."""
        runtime = self.runtime
        if not isinstance(runtime, LauncherRuntime):
            log.warning(
                "%s: runtime %s cannot start launchers; %s runs without one", self.node, runtime.name, cmd.job_id
            )
            return
        while True:
            if self.closing or self.tokens.get(cmd.job_id) != cmd.token or cmd.job_id not in self.alive:
                return  # the ranks here ended (or were stopped) before every worker ran
            try:
                ready = await self.workers_running(cmd)
            except Exception as exc:
                log.warning("%s: asking whether the workers of %s run failed: %s", self.node, cmd.job_id, exc)
                ready = False
            if ready is None:
                return
            if ready:
                break
            await asyncio.sleep(LAUNCHER_POLL_S)
        try:
            await runtime.launch_launcher(cmd, launcher_environment(cmd))
        except (EngineUnavailable, LaunchFailed) as exc:
            infra = isinstance(exc, EngineUnavailable)
            if isinstance(exc, EngineUnavailable):
                await self.engine_down(exc)
            self.stop_reasons[cmd.job_id] = (f"launch failed: launcher: {exc}", INFRA if infra else "job")
            with contextlib.suppress(Exception):
                await self.runtime.stop(cmd.job_id, grace_s=STOP_GRACE_S)

    async def lease_for_launch(self, job_id: str, token: int) -> RenewStatus:
        """Renew the attempt's lease before its ranks start: "ok" while its reservation holds `token`. A store found
        reset is given time to be rebuilt (then StoreResetPending)."""
        store = self.rstore()
        status = await store.renew_status(job_id, token, LEASE_S)
        if status != "reset":
            return status
        log.warning("%s: the reservation store is reset: waiting for the solver to rebuild it", self.node)
        deadline = asyncio.get_running_loop().time() + self.store_reset_wait_s
        while asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.25)
            if await store.epoch() is not None:
                return await store.renew_status(job_id, token, LEASE_S)
        raise StoreResetPending(f"the reservation store is reset and not rebuilt yet (launch of {job_id})")

    def local_gpus(self, ranks: Iterable[RankPlacement]) -> dict[int, int]:
        """GPU → milli (0: the whole GPU) of the ranks that are on this node."""
        return {g: r.gpu_milli for r in ranks if r.node == self.node for g in r.gpus}

    def gpu_conflicts(self, job_id: str, token: int, gpus: Mapping[int, int]) -> list[tuple[str, int, int | None]]:
        """(job, token, GPU) of the ranks alive here that a launch of `gpus` would share a GPU with. Another attempt
        of the same job counts wherever its GPUs are (one job's attempts never run side by side on a node)."""
        out: list[tuple[str, int, int | None]] = []
        for other, (tok, held) in sorted(self.alive.items()):
            if other == job_id and tok == token:
                continue
            if other == job_id:
                out.append((other, tok, min(set(held) & set(gpus), default=None)))
                continue
            for g in sorted(set(held) & set(gpus)):
                if held[g] == 0 or gpus[g] == 0 or self.shares_on(g, job_id) + gpus[g] > 1000:
                    out.append((other, tok, g))
                    break
        return out

    def shares_on(self, gpu: int, but: str) -> int:
        """Milli-GPUs of `gpu` that ranks alive here (other than job `but`'s) hold."""
        return sum(held.get(gpu, 0) for job, (_, held) in self.alive.items() if job != but)

    async def free_gpus(
        self, job_id: str, token: int, gpus: Mapping[int, int], busy: list[tuple[str, int, int | None]]
    ) -> list[tuple[str, int, int | None]]:
        """Stop the holders whose reservation is no longer current and wait (bounded) for them to exit; returns what
        still holds the GPUs. A holder whose reservation is current (or unknown: a reset store) is left alone."""
        current = False
        for holder, tok in sorted({(j, t) for j, t, _ in busy}):
            try:
                status: RenewStatus = await self.rstore().renew_status(holder, tok, LEASE_S)
            except Exception as exc:
                log.warning("%s: could not ask the reservation of %s: %s", self.node, holder, exc)
                status = "ok"
            if status in ("stale", "gone"):
                self.fence_out(holder, tok)
            else:
                current = True
        if current:
            return self.gpu_conflicts(job_id, token, gpus)
        ends = [self.ended[j] for j in sorted({j for j, _, _ in busy}) if j in self.ended]
        with contextlib.suppress(TimeoutError):  # set by each holder's watcher once its ranks have exited
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in ends)), self.gpu_free_wait_s)
        return self.gpu_conflicts(job_id, token, gpus)

    def start_watch(self, job_id: str, token: int, gpus: Mapping[int, int] | None = None, alive: bool = True) -> None:
        self.tokens[job_id] = token
        if alive:
            self.alive[job_id] = (token, dict(gpus or {}))
        self.ended[job_id] = asyncio.Event()
        self.spawn_watcher(job_id, token, delay_s=0.0)
        # A Slurm batch job's srun service on its batch node, again after a restart (runtime/slurm.py).
        self.serve_slurm_steps(slurm.resume_step_server(self.runtime, job_id, token, lambda: self.svc.nc))

    def limit_time(self, cmd: LaunchRanks) -> None:
        """The job's time limit (`--time`, `time_limit_s`) counts from its ranks' start here; at its end they are
        stopped as a cancel stops them: its running srun steps' tasks get SIGTERM, SIGKILL after the stop grace."""
        if cmd.spec.time_limit_s is not None:
            self.set_deadline(cmd.job_id, cmd.token, cmd.spec.time_limit_s, cmd.spec.time_limit_s)

    def set_deadline(self, job_id: str, token: int, limit_s: float, after_s: float) -> None:
        old = self.deadlines.pop(job_id, None)
        if old is not None:
            old[1].cancel()
        handle = asyncio.get_running_loop().call_later(max(0.0, after_s), self.time_up, job_id, token, limit_s)
        self.deadlines[job_id] = (token, handle)

    async def limit_adopted_time(self, job_id: str, token: int) -> None:
        """Ranks adopted after a restart keep their time limit, counted from the job's start in its record."""
        try:
            rec, _ = await self.svc.ledger.get(job_id)
        except Exception as exc:
            log.warning("%s: reading the record of %s failed, its time limit is not kept: %s", self.node, job_id, exc)
            return
        if rec is None or rec.token != token or rec.spec.time_limit_s is None or self.tokens.get(job_id) != token:
            return
        limit = rec.spec.time_limit_s
        started = rec.started_ts or rec.placed_ts or time.time()
        self.set_deadline(job_id, token, limit, started + limit - time.time())

    def time_up(self, job_id: str, token: int, limit_s: float) -> None:
        if self.deadlines.get(job_id, (None,))[0] == token:
            del self.deadlines[job_id]
        if self.closing or self.tokens.get(job_id) != token or job_id in self.stopping:
            return  # ended, another attempt's, or being stopped already
        log.info("%s: %s reached its time limit (%g s): stopping it", self.node, job_id, limit_s)
        self.stop_reasons.setdefault(job_id, (f"time limit reached: stopped after {limit_s:g} s (--time)", "job"))
        self.timed_out.add((job_id, token))
        task = asyncio.create_task(self.stop_ranks(job_id, STOP_GRACE_S), name=f"time-limit:{job_id}")
        self.stopping[job_id] = task
        task.add_done_callback(lambda t: self.stopping.pop(job_id, None) if self.stopping.get(job_id) is t else None)

    def serve_slurm_steps(self, task: asyncio.Task[None] | None) -> None:
        if task is not None:
            self.handshakes.add(task)
            task.add_done_callback(self.handshakes.discard)

    def spawn_watcher(self, job_id: str, token: int, delay_s: float) -> None:
        task = asyncio.create_task(self.watch(job_id, token, delay_s), name=f"watch:{job_id}")
        self.watchers[job_id] = task
        task.add_done_callback(lambda t: self.watcher_done(job_id, token, t))

    def watcher_done(self, job_id: str, token: int, task: asyncio.Task[None]) -> None:
        """A watcher that died of an unexpected error is logged and started again: its ranks are never forgotten."""
        if task.cancelled() or task.exception() is None:
            return
        exc = task.exception()
        log.error(
            "%s: following the ranks of %s (token %s) died: %r; following them again",
            self.node,
            job_id,
            token,
            exc,
            exc_info=exc,
        )
        if self.closing or self.tokens.get(job_id) != token or self.watchers.get(job_id) is not task:
            return
        self.spawn_watcher(job_id, token, delay_s=self.heartbeat_s)

    async def watch(self, job_id: str, token: int, delay_s: float = 0.0) -> None:
        if delay_s:
            await asyncio.sleep(delay_s)
        failures = 0
        fault: Fault = "job"
        while True:
            try:
                ex = await self.runtime.wait(job_id)
                code, reason = ex.exit_code, ex.reason
                break
            except EngineUnavailable as exc:
                # Containers outlive an API outage: wait for the engine rather than fail the job.
                await self.engine_down(exc)
                await asyncio.sleep(self.heartbeat_s)
            except LookupError:
                code, reason, fault = LOST_EXIT, f"ranks of {job_id} vanished from {self.node}", INFRA
                break
            except Exception as exc:
                failures += 1
                log.exception("%s: following the ranks of %s failed (%d/%d)", self.node, job_id, failures, WATCH_TRIES)
                if failures >= WATCH_TRIES:
                    # Stop them before saying so: a reservation released while ranks still run would double-book.
                    with contextlib.suppress(Exception):
                        await self.runtime.stop(job_id, grace_s=STOP_GRACE_S)
                    code, reason = LOST_EXIT, f"the executor on {self.node} could not follow the ranks: {exc}"
                    fault = INFRA
                    break
                await asyncio.sleep(self.heartbeat_s)
        if self.alive.get(job_id, (None,))[0] == token:
            del self.alive[job_id]  # no lease renewed, no GPU reported for ranks that have exited
        if self.deadlines.get(job_id, (None,))[0] == token:
            self.deadlines.pop(job_id)[1].cancel()  # ended before its time limit
        if (job_id, token) in self.timed_out:
            self.timed_out.discard((job_id, token))
            code = code or TIME_LIMIT_EXIT  # its ranks may exit 0 on SIGTERM: the job still did not finish in time
        ended = self.ended.pop(job_id, None)
        if ended is not None:
            ended.set()  # a preemption handshake under way stops waiting for an acknowledgement
        handshake = self.preempting.get(job_id)
        if handshake is not None:
            await handshake.wait()  # job.checkpointed goes first in the job's history
        stopped_for = self.stop_reasons.pop(job_id, None)
        if stopped_for is not None:
            reason, fault = stopped_for
        if self.tokens.get(job_id) != token:
            return
        await self.node_finished(job_id, token, code, reason, fault)
        self.tokens.pop(job_id, None)
        self.watchers.pop(job_id, None)
        for old_job, old_token in self.finished.ended(job_id, token):
            await self.remove(old_job, old_token)

    async def remove(self, job_id: str, token: int) -> None:
        try:
            await self.runtime.remove(job_id, token)
        except EngineUnavailable as exc:
            await self.engine_down(exc)  # the next restart's reconcile removes them: no reservation holds them
        except Exception:
            log.exception("%s: removing the ended ranks of %s failed", self.node, job_id)

    # -- cancel and preempt ------------------------------------------------------------------------------------

    async def cancel(self, cmd: CancelRanks) -> None:
        if self.tokens.get(cmd.job_id) != cmd.token:
            return
        self.stop_reasons[cmd.job_id] = (f"cancelled: {cmd.reason}", "job")
        try:
            await self.runtime.stop(cmd.job_id, grace_s=STOP_GRACE_S)
        except EngineUnavailable as exc:
            await self.engine_down(exc)
            raise  # not acknowledged: the command comes back once the engine may answer

    async def signal(self, cmd: SignalRanks) -> None:
        """`scancel --signal`: the signal reaches the job's ranks here (a batch job's script) and the tasks of its
        running srun steps here; the job goes on (its end is the processes' own)."""
        if self.tokens.get(cmd.job_id) != cmd.token:
            return  # stale: the ranks of that token are gone
        log.info("%s: %s to %s (by %s)", self.node, cmd.signal, cmd.job_id, cmd.by or "unknown")
        try:
            await self.runtime.signal(cmd.job_id, cmd.signal)
        except LookupError:
            log.info("%s: %s has no ranks left to signal", self.node, cmd.job_id)
        except EngineUnavailable as exc:
            await self.engine_down(exc)
            raise  # not acknowledged: the command comes back once the engine may answer

    def start_preempt(self, cmd: PreemptRanks) -> None:
        """The handshake can take the whole grace period: it runs beside the consumer, not in it."""
        if self.tokens.get(cmd.job_id) != cmd.token or cmd.job_id in self.preempting:
            return  # stale, or a redelivery of a handshake already under way
        self.preempting[cmd.job_id] = asyncio.Event()
        task = asyncio.create_task(self.preempt(cmd), name=f"preempt:{cmd.job_id}")
        self.handshakes.add(task)
        task.add_done_callback(self.handshakes.discard)

    async def preempt(self, cmd: PreemptRanks) -> None:
        """Signal, wait for the checkpoint up to the grace period, record job.checkpointed, stop (then kill)."""
        self.stop_reasons[cmd.job_id] = (f"preempted: {cmd.reason}", "job")

        async def checkpointed(out: PreemptOutcome) -> None:
            await self.record(
                JobCheckpointed(
                    event_id=f"checkpointed-{cmd.job_id}-{cmd.token}-{self.node}",
                    job_id=cmd.job_id,
                    node=self.node,
                    token=cmd.token,
                    checkpoint_ts=out.checkpoint_ts if out.checkpoint_ts is not None else time.time(),
                    acknowledged=out.acknowledged,
                )
            )
            log.info(
                "%s: %s %s its checkpoint after %.1f s",
                self.node,
                cmd.job_id,
                "acknowledged" if out.acknowledged else "did not acknowledge",
                out.waited_s,
            )

        try:
            await preempt_with_checkpoint(
                self.runtime,
                cmd.job_id,
                signal=cmd.signal,
                grace_s=cmd.grace_s,
                stop_grace_s=STOP_GRACE_S,
                before_stop=checkpointed,
                ended=self.ended.get(cmd.job_id),
            )
        except LookupError:
            log.info("%s: %s has no ranks left to preempt", self.node, cmd.job_id)
        except EngineUnavailable as exc:
            await self.engine_down(exc)
        except Exception:
            log.exception("%s: preempting %s failed", self.node, cmd.job_id)
        finally:
            self.preempting.pop(cmd.job_id).set()

    # -- restart, heartbeat, logs ------------------------------------------------------------------------------

    async def reconcile(self) -> None:
        """After a restart: adopt ranks whose token is current, remove the fenced-out, report the vanished.

        Against a reset store (no epoch marker) nothing is known to be fenced out: everything found is adopted,
        nothing removed, and the reconcile runs again (health loop) once the solver has rebuilt the store."""
        store = self.rstore()
        if await store.epoch() is None:
            await self.adopt_all()
            return
        mine = [r for r in await store.all() if self.node in r.allocation.nodes]
        reserved = {r.job_id: r.token for r in mine}
        allocations = {(r.job_id, r.token): r.allocation for r in mine}
        # Ranks this executor already follows stay for the lease renewals to judge: a stale one is fenced out there,
        # stopped gracefully and reported, rather than killed here.
        keep = dict(reserved)
        for job_id, token in self.tokens.items():
            keep.setdefault(job_id, token)
        plan: ReconcilePlan
        if isinstance(self.runtime, DockerRuntime):
            plan = await reconcile_node(self.runtime, keep)
        else:
            plan = plan_reconcile(await self.runtime.list_running(), keep)
            for orphan in plan.orphans:
                await self.runtime.remove(orphan.job_id, orphan.token)
        for ranks in plan.adopt:
            if ranks.job_id not in self.tokens:
                log.info("%s: adopting %s (token %s)", self.node, ranks.job_id, ranks.token)
                alloc = allocations.get((ranks.job_id, ranks.token))
                gpus = self.local_gpus(alloc.ranks) if alloc is not None else {}
                self.start_watch(ranks.job_id, ranks.token, gpus, alive=not ranks.exited)
                if not ranks.exited:
                    await self.limit_adopted_time(ranks.job_id, ranks.token)
                    await self.resume_launcher(ranks.job_id, ranks.token)
        for orphan in plan.orphans:
            log.warning("%s: removed orphan ranks of %s (token %s)", self.node, orphan.job_id, orphan.token)
        for job_id, token in plan.leaked.items():
            if self.tokens.get(job_id) == token or (job_id, token) in self.ends:
                continue  # followed here, or its end is already kept
            rec, _ = await self.svc.ledger.get(job_id)
            # A PLACED/STARTING job's launch may still be on its way: only a running job has lost its ranks.
            if rec is not None and rec.state == "RUNNING" and rec.token == token and self.node not in rec.nodes_done:
                await self.node_finished(
                    job_id,
                    token,
                    LOST_EXIT,
                    f"ranks lost: none found on {self.node} after its executor restarted",
                    fault=INFRA,
                )
        self.reconciled = True

    async def adopt_all(self) -> None:
        """The store lost its state: follow every attempt found here (the newest per job), remove nothing."""
        found: list[RunningRanks]
        if isinstance(self.runtime, DockerRuntime):
            found = await self.runtime.list_managed()
        else:
            found = await self.runtime.list_running()
        newest: dict[str, RunningRanks] = {}
        for ranks in found:
            if ranks.job_id not in newest or ranks.token > newest[ranks.job_id].token:
                newest[ranks.job_id] = ranks
        adopted = 0
        for job_id, ranks in sorted(newest.items()):
            if job_id in self.tokens:
                continue
            gpus = await self.recorded_gpus(job_id, ranks.token)
            log.info("%s: adopting %s (token %s) while the reservation store is reset", self.node, job_id, ranks.token)
            self.start_watch(job_id, ranks.token, gpus, alive=not ranks.exited)
            if not ranks.exited:
                await self.limit_adopted_time(job_id, ranks.token)
            adopted += 1
        if not self.store_reset and adopted:
            log.warning(
                "%s: the reservation store lost its state: %d ranks adopted, none removed; reconciling again once "
                "the solver has rebuilt it",
                self.node,
                adopted,
            )
        self.store_reset = True
        self.reconciled = False

    async def recorded_gpus(self, job_id: str, token: int) -> dict[int, int]:
        """The GPUs the job's record places on this node for `token` (the reservation is gone: a reset store)."""
        try:
            rec, _ = await self.svc.ledger.get(job_id)
        except Exception as exc:
            log.warning("%s: reading the record of %s failed: %s", self.node, job_id, exc)
            return {}
        alloc: Allocation | None = rec.allocation if rec is not None and rec.token == token else None
        return self.local_gpus(alloc.ranks) if alloc is not None else {}

    def report_content(self) -> tuple[Any, ...]:
        """What a full report says, but its time: GPU and engine health, the jobs watched, the ranks alive."""
        return (
            tuple((g.healthy, g.health_reason, g.nvlinks_active) for g in self.topology.gpus),
            self.engine_ok,
            self.engine_reason,
            tuple(sorted(self.tokens)),
            tuple((job_id, token, tuple(sorted(gpus))) for job_id, (token, gpus) in sorted(self.alive.items())),
        )

    def ask_for_report(self) -> None:
        """The next heartbeat is a full report (a solver started and knows no node's ranks yet)."""
        self.reported = None

    async def publish_heartbeat(self) -> None:
        """The node's full report when it changed since the last one, when that one is `report_every_s` old or
        when a solver asked; a lease (alive, the last report holds) otherwise: 4,096 nodes' unchanged reports cost
        the solver, which reads only reports, as much as all its other idle work."""
        now = time.time()
        content = self.report_content()
        if content == self.reported and now - self.report_ts < self.report_every_s:
            lease = NodeLease(node=self.node, ts=now, report_ts=self.report_ts)
            await self.svc.nc.publish(subjects.node_lease(self.node), lease.model_dump_json().encode())
            return
        hb = NodeHeartbeat(
            node=self.node,
            ts=now,
            gpus=heartbeat_gpus(self.topology),
            engine_ok=self.engine_ok,
            engine_reason=self.engine_reason,
            running=sorted(self.tokens),
            ranks=[
                RankReport(job_id=job_id, token=token, gpus=sorted(gpus))
                for job_id, (token, gpus) in sorted(self.alive.items())
            ],
        )
        await self.svc.nc.publish(subjects.node_heartbeat(self.node), hb.model_dump_json().encode())
        self.reported, self.report_ts = content, now

    async def check_engine(self) -> None:
        """Ask the engine; a deferred reconcile runs once it answers."""
        ok, reason = await self.runtime.healthy()
        self.failed_pings = 0 if ok else self.failed_pings + 1
        if ok and not self.engine_ok:
            log.info("%s: the container engine answers again", self.node)
            self.engine_ok, self.engine_reason = True, None
            await self.publish_heartbeat()
        elif not ok and self.engine_ok and self.failed_pings >= PING_FAILURES:
            await self.engine_down(EngineUnavailable(reason or "the container engine does not answer"))
        if ok and not self.reconciled:
            try:
                await self.reconcile()
            except EngineUnavailable:
                raise
            except Exception as exc:
                log.warning("%s: reconcile failed (tried again in %g s): %s", self.node, self.heartbeat_s, exc)

    async def health_loop(self) -> None:
        # Apart from the heartbeat: a slow engine must not delay heartbeats until the node looks lost.
        while True:
            await self.check_engine()
            await asyncio.sleep(self.heartbeat_s)

    async def check_gpus(self) -> None:
        """Re-read the GPUs' health; a change goes out in a heartbeat at once."""
        if self.gpu_probe is None:
            return
        try:
            probed = fold_probe(self.topology, await asyncio.to_thread(self.gpu_probe))
        except Exception as exc:
            probed = probe_failed(self.topology, exc)
        changes = health_changes(self.topology, probed)
        self.topology = probed
        if changes:
            log.warning("%s: %s", self.node, "; ".join(changes))
            await self.publish_heartbeat()

    async def gpu_health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.gpu_check_s)
            await self.check_gpus()

    async def heartbeat_once(self) -> None:
        """A heartbeat with the last known engine health, and the leases of the ranks alive here renewed.

        Either may fail on its own: a bus outage must not let the leases run out, nor a Redis outage the heartbeats."""
        try:
            await self.publish_heartbeat()
        except Exception as exc:
            log.warning("%s: heartbeat not sent: %s", self.node, exc)
        held = self.held()
        if held:
            self.apply_renewals(await self.rstore().renew_many(held, LEASE_S))

    def held(self) -> list[tuple[str, int]]:
        """(job, token) of the ranks alive here: only their leases are renewed."""
        return [(job_id, token) for job_id, (token, _) in self.alive.items()]

    def apply_renewals(self, statuses: Mapping[tuple[str, int], RenewStatus], *, log_reset: bool = True) -> bool:
        """Act on what the renewals found: "reset" keeps the ranks (the solver rebuilds the reservation under their
        token), "stale"/"gone" fences them out. Returns whether the store was found reset."""
        reset = any(status == "reset" for status in statuses.values())
        for (job_id, token), status in statuses.items():
            if status in ("stale", "gone") and self.alive.get(job_id, (None,))[0] == token:
                self.fence_out(job_id, token, status)
        if reset and not self.store_reset and log_reset:
            log.warning(
                "%s: the reservation store lost its state: the ranks keep running until the solver rebuilds it",
                self.node,
            )
        elif not reset and self.store_reset and log_reset and statuses:
            log.info("%s: the reservation store is rebuilt: leases renewed again", self.node)
        if statuses:
            self.store_reset = reset
        return reset

    def fence_out(self, job_id: str, token: int, why: str = "stale") -> None:
        """Stop ranks whose reservation is gone or another attempt's; their end is reported once they have stopped
        (the watcher reports it), blamed on the platform."""
        if job_id in self.stopping:
            return
        log.warning("%s: %s lost its reservation (token %s, %s): stopping it", self.node, job_id, token, why)
        self.stop_reasons[job_id] = (FENCED_OUT, INFRA)
        task = asyncio.create_task(self.stop_ranks(job_id, FENCE_GRACE_S), name=f"fence:{job_id}")
        self.stopping[job_id] = task
        task.add_done_callback(lambda t: self.stopping.pop(job_id, None) if self.stopping.get(job_id) is t else None)

    async def stop_ranks(self, job_id: str, grace_s: float) -> None:
        """Beside the heartbeat (a stop can take its whole grace); a failed stop is tried again by the next renewal."""
        try:
            await self.runtime.stop(job_id, grace_s=grace_s)
        except EngineUnavailable as exc:
            await self.engine_down(exc)
        except Exception:
            log.exception("%s: stopping the ranks of %s failed", self.node, job_id)

    async def heartbeat_loop(self) -> None:
        while True:
            try:
                await self.heartbeat_once()
            except Exception as exc:
                log.warning("%s: lease renewal failed: %s", self.node, exc)
            await asyncio.sleep(self.heartbeat_s)

    async def logs(self, payload: dict[str, Any]) -> dict[str, Any]:
        """`oneplus logs`: the job's lines on this node from `since` on, and whether its ranks still run."""
        job_id = payload.get("job_id")
        if not isinstance(job_id, str) or not job_id:
            raise OpsError("job_id is required (a string)")
        try:
            rank = None if payload.get("rank") is None else int(payload["rank"])
            since = int(payload.get("since") or 0)
        except (TypeError, ValueError) as exc:
            raise OpsError(f"rank and since must be whole numbers: {exc}") from exc
        if since < 0 or (rank is not None and rank < 0):
            raise OpsError(f"rank and since cannot be negative (rank={rank}, since={since})")
        try:
            lines = await self.runtime.logs(job_id, rank, follow=False)
        except LookupError as exc:
            raise OpsError(f"no ranks of {job_id!r} on {self.node}: {exc}", 404) from exc
        except EngineUnavailable as exc:
            raise OpsError(f"cannot read the logs of {job_id} on {self.node}: {exc}", 503) from exc
        return {"node": self.node, "lines": lines[since:], "next": len(lines), "running": job_id in self.tokens}

    # -- start and stop ----------------------------------------------------------------------------------------

    async def start(self) -> None:
        self.outbox.start()  # facts left from before a crash go out first
        self.store = ReservationStore.connect(RedisSettings.of_bus(self.svc.settings), self.svc.settings.cluster)
        await self.svc.js.publish(
            subjects.node_topology(self.node),
            self.topology.model_dump_json().encode(),
            headers={"Nats-Msg-Id": f"topology-{self.node}-{int(time.time())}"},
            stream=subjects.NODES_STREAM,
        )
        try:
            await self.reconcile()
        except EngineUnavailable as exc:
            # Start anyway and report the node unhealthy; the heartbeat reconciles once the engine answers.
            self.engine_ok, self.engine_reason = False, str(exc)
            log.warning("%s: reconcile deferred: %s", self.node, exc)
        except Exception as exc:
            self.reconciled = False  # the health loop tries again
            log.warning("%s: reconcile deferred: %s", self.node, exc)

    async def stop(self) -> None:
        self.closing = True
        for t in [*self.watchers.values(), *self.handshakes, *self.stopping.values()]:
            t.cancel()
        for _, deadline in self.deadlines.values():
            deadline.cancel()
        # Running ranks stay for the next executor to adopt; ended ones were only kept for their logs.
        for job_id, token in self.finished.drain():
            with contextlib.suppress(Exception):
                await self.runtime.remove(job_id, token)
        await self.runtime.close()
        if self.own_outbox:
            await self.outbox.close()
        if self.store is not None:
            await self.store.close()
