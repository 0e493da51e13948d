"""node-executor: runs one node's ranks, reports the node's topology and heartbeats.

One executor per node. Commands arrive on `oneplus.cmd.node.<node>.*`; a command whose fencing token
is not the reservation's current one is refused, and a redelivered launch never starts a second copy.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

from faststream import AckPolicy
from faststream.nats import NatsMessage
from nats.js.api import ConsumerConfig
from oneplus_bus.service import OneplusService, OpsError, jstream
from oneplus_bus.settings import BusSettings
from oneplus_contracts import (
    NODE_COMMAND_ADAPTER,
    CancelRanks,
    GpuHealth,
    IllegalTransition,
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

from .runtime.base import EngineUnavailable, LaunchFailed, Runtime
from .runtime.docker import DockerRuntime
from .runtime.environment import rank_environment
from .runtime.reconcile import plan_reconcile, reconcile_node

log = logging.getLogger("oneplus.executor")

LAUNCH_FAILED_EXIT = 127
LOST_EXIT = 137
LEASE_S = 30.0


@dataclass
class ExecutorState:
    topology: NodeTopology
    runtime: Runtime
    heartbeat_s: float = 2.0
    tokens: dict[str, int] = field(default_factory=dict)
    watchers: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    stop_reasons: dict[str, str] = field(default_factory=dict)
    engine_ok: bool = True
    engine_reason: str | None = None
    store: ReservationStore | None = None
    handshakes: set[asyncio.Task[None]] = field(default_factory=set)


def create_executor(
    topology: NodeTopology,
    runtime: Runtime,
    settings: BusSettings | None = None,
    heartbeat_s: float = 2.0,
) -> tuple[OneplusService, ExecutorState]:
    node = topology.node
    svc = OneplusService("node-executor", f"Runs ranks on node {node}", settings)
    st = ExecutorState(topology=topology, runtime=runtime, heartbeat_s=heartbeat_s)

    def rstore() -> ReservationStore:
        assert st.store is not None
        return st.store

    async def record(event: JobEvent) -> None:
        try:
            await svc.ledger.record(event)
        except IllegalTransition as exc:
            log.info("%s: ignored %s for %s: %s", node, event.type, event.job_id, exc)

    async def watch(job_id: str, token: int) -> None:
        while True:
            try:
                ex = await st.runtime.wait(job_id)
                ex_code, reason = ex.exit_code, st.stop_reasons.pop(job_id, None) or ex.reason
                break
            except EngineUnavailable as exc:
                # Containers outlive an API outage: wait for the engine rather than fail the job.
                st.engine_ok, st.engine_reason = False, str(exc)
                await asyncio.sleep(st.heartbeat_s)
            except LookupError:
                ex_code, reason = LOST_EXIT, f"ranks of {job_id} vanished from {node}"
                break
        if st.tokens.get(job_id) != token:
            return
        await record(
            JobNodeFinished(
                event_id=f"nodefin-{job_id}-{token}-{node}",
                job_id=job_id,
                node=node,
                token=token,
                exit_code=ex_code,
                reason=reason,
            )
        )
        st.tokens.pop(job_id, None)
        st.watchers.pop(job_id, None)

    def start_watch(job_id: str, token: int) -> None:
        st.tokens[job_id] = token
        st.watchers[job_id] = asyncio.create_task(watch(job_id, token), name=f"watch:{job_id}")

    async def launch(cmd: LaunchRanks) -> None:
        if st.tokens.get(cmd.job_id, -1) >= cmd.token:
            return  # redelivered: the ranks already run under this token
        current = await rstore().current_token(cmd.job_id)
        if current != cmd.token:
            log.warning(
                "%s: refused launch of %s with stale token %s (current %s)", node, cmd.job_id, cmd.token, current
            )
            return
        await record(
            JobStarting(
                event_id=f"starting-{cmd.job_id}-{cmd.token}-{node}", job_id=cmd.job_id, node=node, token=cmd.token
            )
        )
        try:
            await st.runtime.launch(cmd, rank_environment(cmd, st.topology))
        except (LaunchFailed, EngineUnavailable) as exc:
            if isinstance(exc, EngineUnavailable):
                st.engine_ok, st.engine_reason = False, str(exc)
            await record(
                JobNodeFinished(
                    event_id=f"nodefin-{cmd.job_id}-{cmd.token}-{node}",
                    job_id=cmd.job_id,
                    node=node,
                    token=cmd.token,
                    exit_code=LAUNCH_FAILED_EXIT,
                    reason=f"launch failed: {exc}",
                )
            )
            return
        await rstore().renew(cmd.job_id, cmd.token, LEASE_S)
        start_watch(cmd.job_id, cmd.token)
        await record(
            JobRunning(
                event_id=f"running-{cmd.job_id}-{cmd.token}-{node}", job_id=cmd.job_id, node=node, token=cmd.token
            )
        )

    async def cancel(cmd: CancelRanks) -> None:
        if st.tokens.get(cmd.job_id) != cmd.token:
            return
        st.stop_reasons[cmd.job_id] = f"cancelled: {cmd.reason}"
        await st.runtime.stop(cmd.job_id, grace_s=10.0)

    async def preempt(cmd: PreemptRanks) -> None:
        if st.tokens.get(cmd.job_id) != cmd.token:
            return
        st.stop_reasons[cmd.job_id] = f"preempted: {cmd.reason}"
        await st.runtime.signal(cmd.job_id, cmd.signal)
        deadline = time.monotonic() + cmd.grace_s
        ack: float | None = None
        while time.monotonic() < deadline:
            ack = await st.runtime.checkpoint_acknowledged(cmd.job_id)
            if ack is not None:
                break
            await asyncio.sleep(0.1)
        await record(
            JobCheckpointed(
                event_id=f"checkpointed-{cmd.job_id}-{cmd.token}-{node}",
                job_id=cmd.job_id,
                node=node,
                token=cmd.token,
                checkpoint_ts=ack if ack is not None else time.time(),
                acknowledged=ack is not None,
            )
        )
        await st.runtime.stop(cmd.job_id, grace_s=10.0)

    @svc.broker.subscriber(
        subjects.node_commands_of(node),
        stream=jstream(subjects.COMMANDS_STREAM),
        durable=f"executor-{node}",
        queue=f"executor-{node}",
        config=ConsumerConfig(max_deliver=svc.settings.max_deliver, ack_wait=30),
        ack_policy=AckPolicy.NACK_ON_ERROR,
        title=f"node-executor {node} commands",
    )
    async def on_command(msg: NatsMessage) -> None:
        cmd = NODE_COMMAND_ADAPTER.validate_json(msg.body)
        if cmd.node != node:
            raise ValueError(f"command for node {cmd.node} delivered to {node}")
        with svc.tracer.start_as_current_span(f"node-executor {cmd.kind}", attributes={"oneplus.job_id": cmd.job_id}):
            if isinstance(cmd, LaunchRanks):
                await launch(cmd)
            elif isinstance(cmd, CancelRanks):
                await cancel(cmd)
            else:
                # The handshake can take the whole grace period: do not hold the consumer meanwhile.
                task = asyncio.create_task(preempt(cmd), name=f"preempt:{cmd.job_id}")
                st.handshakes.add(task)
                task.add_done_callback(st.handshakes.discard)

    @svc.on_start
    async def start() -> None:
        st.store = ReservationStore.from_url(svc.settings.redis_url, svc.settings.cluster)
        await svc.js.publish(
            subjects.node_topology(node),
            st.topology.model_dump_json().encode(),
            headers={"Nats-Msg-Id": f"topology-{node}-{int(time.time())}"},
            stream=subjects.NODES_STREAM,
        )
        await reconcile_runtime()

    async def reconcile_runtime() -> None:
        """After a restart: adopt ranks whose token is current, remove the fenced-out, report the vanished."""
        reserved = {r.job_id: r.token for r in await rstore().all() if node in r.allocation.nodes}
        if isinstance(st.runtime, DockerRuntime):
            plan = await reconcile_node(st.runtime, reserved)
        else:
            plan = plan_reconcile(await st.runtime.list_running(), reserved)
            for orphan in plan.orphans:
                await st.runtime.stop(orphan.job_id, grace_s=5.0)
        for ranks in plan.adopt:
            log.info("%s: adopting %s (token %s)", node, ranks.job_id, ranks.token)
            start_watch(ranks.job_id, ranks.token)
        for orphan in plan.orphans:
            log.warning("%s: removed orphan ranks of %s (token %s)", node, orphan.job_id, orphan.token)
        for job_id, token in plan.leaked.items():
            rec, _ = await svc.ledger.get(job_id)
            # A PLACED/STARTING job's launch may still be on its way: only a running job has lost its ranks.
            if rec is not None and rec.state == "RUNNING" and rec.token == token and node not in rec.nodes_done:
                await record(
                    JobNodeFinished(
                        event_id=f"nodefin-{job_id}-{token}-{node}",
                        job_id=job_id,
                        node=node,
                        token=token,
                        exit_code=LOST_EXIT,
                        reason=f"ranks lost: none found on {node} after its executor restarted",
                    )
                )

    @svc.ops("node-logs", f"{subjects.PREFIX}.ops.node.{node}.logs")
    async def node_logs(payload: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
        job_id = str(payload.get("job_id") or "")
        rank = payload.get("rank")
        since = int(payload.get("since") or 0)
        try:
            lines = await st.runtime.logs(job_id, int(rank) if rank is not None else None, follow=False)
        except LookupError as exc:
            raise OpsError(f"no ranks of {job_id!r} on {node}: {exc}", 404) from exc
        return {"node": node, "lines": lines[since:], "next": len(lines), "running": job_id in st.tokens}

    @svc.background
    async def heartbeat() -> None:
        while True:
            ok, reason = await st.runtime.healthy()
            st.engine_ok, st.engine_reason = ok, reason
            hb = NodeHeartbeat(
                node=node,
                ts=time.time(),
                gpus=[
                    GpuHealth(index=g.index, healthy=g.healthy, reason=g.health_reason, nvlinks_active=g.nvlinks_active)
                    for g in st.topology.gpus
                ],
                engine_ok=ok,
                engine_reason=reason,
                running=sorted(st.tokens),
            )
            await svc.nc.publish(subjects.node_heartbeat(node), hb.model_dump_json().encode())
            for job_id, token in list(st.tokens.items()):
                if not await rstore().renew(job_id, token, LEASE_S):
                    log.warning("%s: %s lost its reservation (token %s): stopping it", node, job_id, token)
                    st.stop_reasons[job_id] = "reservation lost (fenced out)"
                    await st.runtime.stop(job_id, grace_s=5.0)
            await asyncio.sleep(st.heartbeat_s)

    @svc.on_stop
    async def stop() -> None:
        for t in st.watchers.values():
            t.cancel()
        await st.runtime.close()
        if st.store is not None:
            await st.store.close()

    return svc, st


def load_topology(ref: str, node: str) -> NodeTopology:
    """A topology file (`nvidia-smi topo -m` text), a preset name, or `nvml` for discovery on this host."""
    if ref == "nvml":
        from oneplus_topology.nvml import discover_node

        return discover_node(node)
    if os.path.exists(ref):
        from oneplus_topology.smi import parse_topo_matrix

        with open(ref, encoding="utf-8") as f:
            return parse_topo_matrix(f.read(), node=node)
    from oneplus_topology.presets import load_preset

    return load_preset(ref, node)


def make_runtime(kind: str, topology: NodeTopology) -> Runtime:
    if kind == "simulated":
        from .runtime.simulated import SimulatedRuntime

        return SimulatedRuntime(time_scale=float(os.environ.get("ONEPLUS_TIME_SCALE", "1.0")))
    if kind == "docker":
        url = os.environ.get("ONEPLUS_DOCKER_URL", "unix:///var/run/docker.sock")
        # GPU device requests only where GPUs were really discovered (or the operator says so).
        gpu_node = topology.source == "nvml" or os.environ.get("ONEPLUS_GPU_NODE", "") == "1"
        return DockerRuntime(url, node_topology=topology, node=topology.node, gpu_node=gpu_node)
    raise SystemExit(f"unknown runtime {kind!r}: use 'simulated' or 'docker'")


def main() -> None:
    p = argparse.ArgumentParser(prog="oneplus-node-executor")
    p.add_argument("--node", default=os.environ.get("ONEPLUS_NODE"), required="ONEPLUS_NODE" not in os.environ)
    p.add_argument("--topology", default=os.environ.get("ONEPLUS_TOPOLOGY", "h100_sxm_8gpu_nvswitch_nv18"))
    p.add_argument("--leaf", default=os.environ.get("ONEPLUS_LEAF"))
    p.add_argument("--spine", default=os.environ.get("ONEPLUS_SPINE"))
    p.add_argument("--runtime", default=os.environ.get("ONEPLUS_RUNTIME", "simulated"))
    p.add_argument("--heartbeat", type=float, default=float(os.environ.get("ONEPLUS_HEARTBEAT_S", "2")))
    a = p.parse_args()
    topo = load_topology(a.topology, a.node)
    topo = topo.model_copy(update={"leaf": a.leaf or topo.leaf, "spine": a.spine or topo.spine})
    svc, _ = create_executor(topo, make_runtime(a.runtime, topo), heartbeat_s=a.heartbeat)
    with contextlib.suppress(KeyboardInterrupt):
        svc.run()
