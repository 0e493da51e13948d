"""node-executor: runs one node's ranks, reports the node's topology and heartbeats.

One executor per node. Commands arrive on `oneplus.cmd.node.<node>.*`; a command whose fencing token
is not the reservation's current one is refused, and a redelivered launch never starts a second copy.
The behaviour is in node.py (NodeExecutor); this module wires it to the bus and the command line.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
from pathlib import Path
from typing import Any

from faststream.nats import NatsMessage
from nats.aio.msg import Msg
from oneplus_bus.metrics import add_metrics_port_argument
from oneplus_bus.service import OneplusService
from oneplus_bus.settings import BusSettings
from oneplus_bus.telemetry import job_span
from oneplus_contracts import (
    NODE_COMMAND_ADAPTER,
    CancelRanks,
    LaunchBatch,
    LaunchRanks,
    MpsDaemon,
    NodeReportRequest,
    NodeTopology,
    SignalRanks,
    subjects,
)
from oneplus_contracts.features import node_features
from oneplus_reservations.connect import RedisSettings

from .gpu_health import GpuProbe, nvml_probe
from .node import KEEP_FINISHED, REPORT_EVERY_S, NodeExecutor
from .outbox import state_dir_from_env
from .runtime import slurm
from .runtime.base import Runtime
from .runtime.docker import DockerRuntime
from .runtime.slurm_tasks import StepProgress
from .settings import ExecutorSettings

log = logging.getLogger("oneplus.executor")


DEFAULT_INBOX = "_INBOX"


def executor_consumer(node: str) -> str:
    return f"executor-{node}"


def executor_inbox(node: str) -> str:
    return f"{DEFAULT_INBOX}.executor-{node}"


def launch_attrs(cmd: LaunchRanks) -> dict[str, str]:
    return {"oneplus.job_id": cmd.job_id, "oneplus.node": cmd.node}


def create_executor(
    topology: NodeTopology,
    runtime: Runtime,
    settings: BusSettings | None = None,
    heartbeat_s: float = 2.0,
    keep_finished: int = KEEP_FINISHED,
    gpu_probe: GpuProbe | None = None,
    state_dir: Path | None = None,
    report_every_s: float = REPORT_EVERY_S,
) -> tuple[OneplusService, NodeExecutor]:
    """The service of one node: its command consumer, its logs endpoint, its heartbeat, around a NodeExecutor.

    `gpu_probe` re-reads the GPUs (NVML on a GPU node) so the heartbeat's per-GPU health is current. `state_dir`
    holds the outbox of facts not yet recorded (default: ONEPLUS_STATE_DIR, else
    ~/.local/state/oneplus/executor-<node>); a restarted executor sends what is left there first.
    """
    node = topology.node
    settings = settings or BusSettings.from_env()
    if settings.inbox_prefix == DEFAULT_INBOX:
        # The node's own inbox space: deploy/nats lets executor-<node> subscribe to nothing else.
        settings = dataclasses.replace(settings, inbox_prefix=executor_inbox(node))
    RedisSettings.of_bus(settings)  # a bad REDIS_* value is refused here, at bootstrap, not at the first lease
    svc = OneplusService("node-executor", f"Runs ranks on node {node}", settings)
    ex = NodeExecutor(
        svc,
        topology,
        runtime,
        heartbeat_s=heartbeat_s,
        keep_finished=keep_finished,
        gpu_probe=gpu_probe,
        report_every_s=report_every_s,
        state_dir=state_dir if state_dir is not None else state_dir_from_env(f"executor-{node}"),
    )

    # Named per node: deploy/nats grants executor-<node> the create subject of this consumer only.
    @svc.durable_subscriber(
        subjects.node_commands_of(node),
        stream=subjects.COMMANDS_STREAM,
        consumer=executor_consumer(node),
        title=f"node-executor {node} commands",
    )
    async def on_command(msg: NatsMessage) -> None:
        cmd = NODE_COMMAND_ADAPTER.validate_json(msg.body)
        if cmd.node != node:
            raise ValueError(f"command for node {cmd.node} delivered to {node}")
        if isinstance(cmd, LaunchBatch):
            attrs: dict[str, str | int] = {"oneplus.node": node, "oneplus.launches": len(cmd.launches)}
            with svc.tracer.start_as_current_span("node-executor launch_batch", attributes=attrs):
                # Each launch continues its own job's trace (carried in the batch's body, not its one header).
                await ex.launch_batch(
                    cmd, lambda c: job_span(svc.tracer, "node-executor launch", c.traceparent, launch_attrs(c))
                )
            return
        with svc.tracer.start_as_current_span(f"node-executor {cmd.kind}", attributes={"oneplus.job_id": cmd.job_id}):
            if isinstance(cmd, LaunchRanks):
                await ex.launch(cmd)
            elif isinstance(cmd, CancelRanks):
                await ex.cancel(cmd)
            elif isinstance(cmd, SignalRanks):
                await ex.signal(cmd)
            else:
                ex.start_preempt(cmd)

    @svc.ops("node-logs", f"{subjects.PREFIX}.ops.node.{node}.logs")
    async def node_logs(payload: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
        return await ex.logs(payload)

    # A Slurm batch job's steps: the batch node asks the others to run their tasks, then to release their holders.
    @svc.ops("slurm-step", subjects.slurm_step(node))
    async def slurm_step(payload: dict[str, Any], headers: dict[str, str]) -> StepProgress:
        return await slurm.serve_node_step(ex.runtime, payload)

    @svc.ops("slurm-release", subjects.slurm_release(node))
    async def slurm_release(payload: dict[str, Any], headers: dict[str, str]) -> dict[str, int]:
        return await slurm.serve_release(ex.runtime, payload)

    async def on_report_request(msg: Msg) -> None:
        nodes = nodes_asked(msg)
        if nodes is None or node in nodes:
            ex.ask_for_report()

    async def subscribe_report_requests() -> None:
        await svc.nc.subscribe(subjects.NODE_REPORT_REQUEST, cb=on_report_request)

    svc.on_start(ex.start)
    svc.on_start(subscribe_report_requests)
    svc.background(ex.heartbeat_loop)
    svc.background(ex.health_loop)
    if gpu_probe is not None:
        svc.background(ex.gpu_health_loop)
    svc.on_stop(ex.stop)
    return svc, ex


def nodes_asked(msg: Msg) -> set[str] | None:
    """The nodes a `NodeReportRequest` names, None for every node; an unreadable one asks everyone (a full report
    too many costs one message)."""
    try:
        nodes = NodeReportRequest.model_validate_json(msg.data or b"{}").nodes
    except ValueError as exc:
        log.warning("unreadable report request on %s (answered as one for every node): %s", msg.subject, exc)
        return None
    return None if nodes is None else set(nodes)


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


def make_runtime(kind: str, topology: NodeTopology, settings: ExecutorSettings | None = None) -> Runtime:
    settings = settings if settings is not None else ExecutorSettings.load()
    if kind == "simulated":
        from .runtime.simulated import SimulatedRuntime

        return SimulatedRuntime(time_scale=settings.time_scale)
    if kind == "docker":
        # GPU device requests only where GPUs were really discovered (or the operator says so).
        gpu_node = topology.source == "nvml" or settings.gpu_node
        # A busy engine can take seconds to answer a ping; an engine that is gone refuses at once.
        return DockerRuntime(
            settings.docker_url,
            node_topology=topology,
            node=topology.node,
            gpu_node=gpu_node,
            ping_timeout_s=5.0,
            imex_channel=settings.imex,
        )
    raise SystemExit(f"unknown runtime {kind!r}: use 'simulated' or 'docker'")


SIMULATION_TOPOLOGY = "h100_sxm_8gpu_nvswitch_nv18"


def parse_args(argv: list[str] | None = None, settings: ExecutorSettings | None = None) -> argparse.Namespace:
    """The command line, its defaults from the settings (the environment); a node that is not declared a simulation
    must name its topology and runtime."""
    env = settings if settings is not None else ExecutorSettings.load()
    p = argparse.ArgumentParser(prog="oneplus-node-executor")
    p.add_argument("--node", default=env.node, required=env.node is None)
    p.add_argument(
        "--topology",
        default=env.topology,
        help="nvml (discover this host), an `nvidia-smi topo -m` file or a preset name; required unless --simulate",
    )
    p.add_argument(
        "--gpu-list",
        default=env.gpu_list,
        help="an `nvidia-smi -L` file: the GPUs' UUIDs and MIG instances (a --topology file or preset has neither)",
    )
    p.add_argument(
        "--mps-pipe-dir",
        default=env.mps_pipe_directory,
        help="this node runs the MPS control daemon with this CUDA_MPS_PIPE_DIRECTORY: GPU shares run isolated here",
    )
    p.add_argument(
        "--mps-log-dir",
        default=env.mps_log_directory,
        help="the MPS daemon's CUDA_MPS_LOG_DIRECTORY (default /var/log/nvidia-mps; only with --mps-pipe-dir)",
    )
    p.add_argument("--leaf", default=env.leaf)
    p.add_argument("--spine", default=env.spine)
    p.add_argument(
        "--features",
        default=env.node_features,
        help="comma-separated node features for --constraint (the GPU model's, e.g. h100, is always added)",
    )
    p.add_argument(
        "--runtime",
        default=env.runtime,
        help="docker (run ranks in containers) or simulated; required unless --simulate",
    )
    p.add_argument(
        "--simulate",
        action="store_true",
        default=env.simulation,
        help=f"a simulated node (ONEPLUS_SIMULATION=1): defaults --topology {SIMULATION_TOPOLOGY} --runtime simulated",
    )
    p.add_argument(
        "--address",
        default=env.node_address,
        help="where other nodes reach this one (IP): jobs' containers resolve this node's name to it",
    )
    p.add_argument("--heartbeat", type=float, default=env.heartbeat_s)
    p.add_argument(
        "--keep-finished",
        type=int,
        default=env.keep_finished,
        help="ended jobs whose containers (and logs) stay on the node; older ones are removed",
    )
    p.add_argument(
        "--state-dir",
        default=env.state_dir,
        help="where the executor keeps the facts it has yet to send (default ~/.local/state/oneplus/executor-<node>)",
    )
    add_metrics_port_argument(p)
    a = p.parse_args(argv)
    if a.keep_finished < 0:
        p.error(f"--keep-finished {a.keep_finished}: the number of ended jobs to keep cannot be negative")
    if a.mps_log_dir and not a.mps_pipe_dir:
        p.error(f"--mps-log-dir {a.mps_log_dir}: a node runs MPS when --mps-pipe-dir names the daemon's pipe directory")
    missing = [flag for flag, value in (("--topology", a.topology), ("--runtime", a.runtime)) if value is None]
    if missing and not a.simulate:
        # Without this, a node deployed without flags would register a preset H100 whose jobs 'succeed'.
        p.error(
            f"no {' and no '.join(missing)} given (nor ONEPLUS_TOPOLOGY/ONEPLUS_RUNTIME): a GPU node runs with "
            "--topology nvml --runtime docker; a simulated node says so with --simulate or ONEPLUS_SIMULATION=1"
        )
    a.topology = a.topology or SIMULATION_TOPOLOGY
    a.runtime = a.runtime or "simulated"
    return a


def simulated_node(topo: NodeTopology) -> NodeTopology:
    """A simulated node simulates an MPS daemon as it simulates its ranks, so GPU shares go to it as to whole GPUs (no
    process runs; `jobs show` still says the job was simulated). A node whose runtime runs containers runs MPS only
    when --mps-pipe-dir says so."""
    return topo if topo.mps is not None else topo.model_copy(update={"mps": MpsDaemon()})


def main() -> None:
    settings = ExecutorSettings.load_or_exit()
    a = parse_args(settings=settings)
    topo = load_topology(a.topology, a.node)
    if a.gpu_list:
        from oneplus_topology.mig import apply_gpu_listing, parse_gpu_listing

        with open(a.gpu_list, encoding="utf-8") as f:
            topo = apply_gpu_listing(topo, parse_gpu_listing(f.read()))
    if a.mps_pipe_dir:
        mps = MpsDaemon(pipe_directory=a.mps_pipe_dir, **({"log_directory": a.mps_log_dir} if a.mps_log_dir else {}))
        topo = topo.model_copy(update={"mps": mps})
    elif a.runtime == "simulated":
        topo = simulated_node(topo)
    topo = topo.model_copy(
        update={"leaf": a.leaf or topo.leaf, "spine": a.spine or topo.spine, "address": a.address or topo.address}
    )
    extra = [f.strip() for f in a.features.split(",") if f.strip()]
    topo = topo.model_copy(update={"features": sorted(node_features(topo.gpu_model, [*topo.features, *extra]))})
    svc, _ = create_executor(
        topo,
        make_runtime(a.runtime, topo, settings),
        heartbeat_s=a.heartbeat,
        keep_finished=a.keep_finished,
        gpu_probe=nvml_probe(a.node) if a.topology == "nvml" else None,
        state_dir=Path(a.state_dir) if a.state_dir else None,
        report_every_s=settings.report_every_s,
    )
    if a.metrics_port is not None:
        svc.metrics_port = a.metrics_port
    with contextlib.suppress(KeyboardInterrupt):
        svc.run()
