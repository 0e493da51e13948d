"""What one node's executor does with its commands: launch, watch, cancel, preempt, reconcile, heartbeat.

The service wiring (subjects, consumers, ops endpoints) is in app.py; this is the behaviour behind it. Every handler
checks the fencing token first: a command of a superseded attempt is ignored, a redelivered launch starts nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from oneplus_bus.service import OneplusService, OpsError
from oneplus_contracts import (
    CancelRanks,
    JobCheckpointed,
    JobEvent,
    JobNodeFinished,
    JobRunning,
    JobStarting,
    LaunchRanks,
    NodeHeartbeat,
    NodeTopology,
    PreemptRanks,
    subjects,
)
from oneplus_reservations import ReservationStore

from .gpu_health import GpuProbe, fold_probe, health_changes, heartbeat_gpus, probe_failed
from .retention import FinishedRanks
from .runtime.base import EngineUnavailable, LaunchFailed, Runtime, StaleToken
from .runtime.docker import DockerRuntime
from .runtime.environment import rank_environment
from .runtime.preemption import PreemptOutcome, preempt_with_checkpoint
from .runtime.reconcile import ReconcilePlan, plan_reconcile, reconcile_node

log = logging.getLogger("oneplus.executor")

LAUNCH_FAILED_EXIT = 127
LOST_EXIT = 137
LEASE_S = 30.0
STOP_GRACE_S = 10.0  # SIGTERM → SIGKILL, for cancel and after a preemption's checkpoint wait
KEEP_FINISHED = 16  # ended jobs whose ranks (and logs) stay on the node for `oneplus logs`
WATCH_TRIES = 5  # unexpected errors while following a job's ranks before the executor gives up on them
GPU_CHECK_S = 30.0  # how often a GPU node re-reads its GPUs' health through NVML
PING_FAILURES = 2  # failed engine checks in a row before a heartbeat calls the node unhealthy (a slow ping is not down)


class NodeExecutor:
    def __init__(
        self,
        svc: OneplusService,
        topology: NodeTopology,
        runtime: Runtime,
        *,
        heartbeat_s: float = 2.0,
        keep_finished: int = KEEP_FINISHED,
        gpu_probe: GpuProbe | None = None,
        gpu_check_s: float = GPU_CHECK_S,
    ) -> None:
        self.svc = svc
        self.topology = topology
        self.node = topology.node
        self.runtime = runtime
        self.heartbeat_s = heartbeat_s
        self.gpu_probe = gpu_probe
        self.gpu_check_s = gpu_check_s
        self.tokens: dict[str, int] = {}  # job → token of the ranks this executor watches
        self.watchers: dict[str, asyncio.Task[None]] = {}
        self.stop_reasons: dict[str, str] = {}
        self.preempting: dict[str, asyncio.Event] = {}  # job → set when its checkpoint handshake is over
        self.ended: dict[str, asyncio.Event] = {}  # job → set when all its local ranks have exited
        self.handshakes: set[asyncio.Task[None]] = set()
        self.finished = FinishedRanks(keep_finished)
        self.engine_ok = True
        self.engine_reason: str | None = None
        self.reconciled = False
        self.failed_pings = 0
        self.store: ReservationStore | None = None

    def rstore(self) -> ReservationStore:
        assert self.store is not None, "the executor's reservation store is opened on start"
        return self.store

    async def record(self, event: JobEvent) -> None:
        """Report what happened to the job's ranks here; the job's owner folds it (or refuses a stale one)."""
        await self.svc.ledger.report(event)

    async def node_finished(self, job_id: str, token: int, exit_code: int, reason: str) -> None:
        await self.record(
            JobNodeFinished(
                event_id=f"nodefin-{job_id}-{token}-{self.node}",
                job_id=job_id,
                node=self.node,
                token=token,
                exit_code=exit_code,
                reason=reason,
            )
        )

    async def engine_down(self, exc: EngineUnavailable) -> None:
        """Say so at once: the registry marks the node unhealthy and the solver stops placing here."""
        was_ok = self.engine_ok
        self.engine_ok, self.engine_reason = False, str(exc)
        if was_ok:
            log.warning("%s: %s", self.node, exc)
            with contextlib.suppress(Exception):
                await self.publish_heartbeat()

    # -- launch and watch --------------------------------------------------------------------------------------

    async def launch(self, cmd: LaunchRanks) -> None:
        if self.tokens.get(cmd.job_id, -1) >= cmd.token:
            return  # redelivered: the ranks already run under this token
        current = await self.rstore().current_token(cmd.job_id)
        if current != cmd.token:
            log.warning(
                "%s: refused launch of %s with stale token %s (current %s)", self.node, cmd.job_id, cmd.token, current
            )
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
        except (LaunchFailed, EngineUnavailable) as exc:
            if isinstance(exc, EngineUnavailable):
                await self.engine_down(exc)
            await self.node_finished(cmd.job_id, cmd.token, LAUNCH_FAILED_EXIT, f"launch failed: {exc}")
            return
        await self.rstore().renew(cmd.job_id, cmd.token, LEASE_S)
        self.start_watch(cmd.job_id, cmd.token)
        await self.record(
            JobRunning(
                event_id=f"running-{cmd.job_id}-{cmd.token}-{self.node}",
                job_id=cmd.job_id,
                node=self.node,
                token=cmd.token,
            )
        )

    def start_watch(self, job_id: str, token: int) -> None:
        self.tokens[job_id] = token
        self.ended[job_id] = asyncio.Event()
        self.watchers[job_id] = asyncio.create_task(self.watch(job_id, token), name=f"watch:{job_id}")

    async def watch(self, job_id: str, token: int) -> None:
        failures = 0
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
                code, reason = LOST_EXIT, f"ranks of {job_id} vanished from {self.node}"
                break
            except Exception as exc:
                failures += 1
                log.exception("%s: following the ranks of %s failed (%d/%d)", self.node, job_id, failures, WATCH_TRIES)
                if failures >= WATCH_TRIES:
                    # Stop them before saying so: a reservation released while ranks still run would double-book.
                    with contextlib.suppress(Exception):
                        await self.runtime.stop(job_id, grace_s=STOP_GRACE_S)
                    code, reason = LOST_EXIT, f"the executor on {self.node} could not follow the ranks: {exc}"
                    break
                await asyncio.sleep(self.heartbeat_s)
        ended = self.ended.pop(job_id, None)
        if ended is not None:
            ended.set()  # a preemption handshake under way stops waiting for an acknowledgement
        handshake = self.preempting.get(job_id)
        if handshake is not None:
            await handshake.wait()  # job.checkpointed goes first in the job's history
        stopped_for = self.stop_reasons.pop(job_id, None)
        reason = stopped_for or reason
        if self.tokens.get(job_id) != token:
            return
        await self.node_finished(job_id, token, code, reason)
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
        self.stop_reasons[cmd.job_id] = f"cancelled: {cmd.reason}"
        try:
            await self.runtime.stop(cmd.job_id, grace_s=STOP_GRACE_S)
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
        self.stop_reasons[cmd.job_id] = f"preempted: {cmd.reason}"

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
        """After a restart: adopt ranks whose token is current, remove the fenced-out, report the vanished."""
        reserved = {r.job_id: r.token for r in await self.rstore().all() if self.node in r.allocation.nodes}
        plan: ReconcilePlan
        if isinstance(self.runtime, DockerRuntime):
            plan = await reconcile_node(self.runtime, reserved)
        else:
            plan = plan_reconcile(await self.runtime.list_running(), reserved)
            for orphan in plan.orphans:
                await self.runtime.remove(orphan.job_id, orphan.token)
        self.reconciled = True
        for ranks in plan.adopt:
            if ranks.job_id not in self.tokens:
                log.info("%s: adopting %s (token %s)", self.node, ranks.job_id, ranks.token)
                self.start_watch(ranks.job_id, ranks.token)
        for orphan in plan.orphans:
            log.warning("%s: removed orphan ranks of %s (token %s)", self.node, orphan.job_id, orphan.token)
        for job_id, token in plan.leaked.items():
            rec, _ = await self.svc.ledger.get(job_id)
            # A PLACED/STARTING job's launch may still be on its way: only a running job has lost its ranks.
            if rec is not None and rec.state == "RUNNING" and rec.token == token and self.node not in rec.nodes_done:
                await self.node_finished(
                    job_id, token, LOST_EXIT, f"ranks lost: none found on {self.node} after its executor restarted"
                )

    async def publish_heartbeat(self) -> None:
        hb = NodeHeartbeat(
            node=self.node,
            ts=time.time(),
            gpus=heartbeat_gpus(self.topology),
            engine_ok=self.engine_ok,
            engine_reason=self.engine_reason,
            running=sorted(self.tokens),
        )
        await self.svc.nc.publish(subjects.node_heartbeat(self.node), hb.model_dump_json().encode())

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
            await self.reconcile()

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
        """A heartbeat with the last known engine health, and the leases of the ranks running here renewed."""
        await self.publish_heartbeat()
        for job_id, token in list(self.tokens.items()):
            if not await self.rstore().renew(job_id, token, LEASE_S):
                log.warning("%s: %s lost its reservation (token %s): stopping it", self.node, job_id, token)
                self.stop_reasons[job_id] = "reservation lost (fenced out)"
                with contextlib.suppress(EngineUnavailable):
                    await self.runtime.stop(job_id, grace_s=5.0)

    async def heartbeat_loop(self) -> None:
        while True:
            await self.heartbeat_once()
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
        self.store = ReservationStore.from_url(self.svc.settings.redis_url, self.svc.settings.cluster)
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

    async def stop(self) -> None:
        for t in [*self.watchers.values(), *self.handshakes]:
            t.cancel()
        # Running ranks stay for the next executor to adopt; ended ones were only kept for their logs.
        for job_id, token in self.finished.drain():
            with contextlib.suppress(Exception):
                await self.runtime.remove(job_id, token)
        await self.runtime.close()
        if self.store is not None:
            await self.store.close()
