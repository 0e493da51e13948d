"""A simulated fleet: many simulated node-executors in one process, as KWOK does for Kubernetes.

Each node is a real `NodeExecutor` (node.py) around its own `SimulatedRuntime`, so a fleet node launches, watches,
cancels, preempts, reconciles and reports job facts exactly as a one-node executor does. What the fleet shares is
the plumbing: one service (one NATS connection, one micro service), one Redis client, and

- one durable push consumer, `fleet-<name>`, on ONEPLUS_COMMANDS whose `filter_subjects` list the command subjects
  of its nodes (`oneplus.cmd.node.<node>.*`, nats-server 2.10+); a node's commands run one at a time, in stream
  order, while different nodes' commands run side by side;
- one heartbeat loop: every node still publishes its own `oneplus.node.<node>.heartbeat`, spread over the interval
  (a slice of the nodes every half second) rather than in one burst;
- one Redis pipeline per interval that renews the leases of every job with ranks alive on the fleet;
- one reservation read at start, which every node's reconcile filters (instead of one read per node), and again
  for the nodes whose reconcile is still to run (a reservation store found reset: they adopt and remove nothing);
- one outbox (outbox.py) for every node's facts, in the fleet's state directory (`--state-dir`,
  ONEPLUS_STATE_DIR, default ~/.local/state/oneplus/fleet-<name>): facts are kept there before they are sent and
  delivered in pipelined rounds until stored, across bus outages and fleet restarts;
- one subscription that answers `oneplus.ops.node.<node>.logs` for the fleet's nodes and stays silent for others.

Start one: `python -m oneplus_node_executor.fleet --nodes 512 --topology h100_sxm_8gpu_nvswitch_nv18
--nodes-per-leaf 16` (nodes sim-0000 … sim-0511), or `--cluster cluster.yaml` (the cluster YAML of
docs/topology.md: node groups with a prefix, a count and a topology, leaf/spine from its fabric). `oneplus dev up
--nodes 512` runs the platform around one.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import os
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.micro.request import Request
from oneplus_bus.deadletter import _is_poison, _publish_dead_letter
from oneplus_bus.metrics import add_metrics_port_argument
from oneplus_bus.service import OneplusService
from oneplus_bus.settings import BusSettings
from oneplus_bus.telemetry import job_span
from oneplus_contracts import (
    NODE_COMMAND_ADAPTER,
    CancelRanks,
    LaunchBatch,
    LaunchRanks,
    NodeTopology,
    SignalRanks,
    subjects,
)
from oneplus_reservations import DEFAULT_LEASE_S, RenewStatus, Reservation, ReservationStore, redis_client
from oneplus_reservations.connect import RedisSettings
from opentelemetry import propagate

from .app import DEFAULT_INBOX, launch_attrs, make_runtime, nodes_asked, simulated_node
from .node import KEEP_FINISHED, LEASE_S, NodeExecutor
from .outbox import Outbox, fact_sender, state_dir_from_env
from .settings import ExecutorSettings

log = logging.getLogger("oneplus.fleet")

CONSUMER_SETUP_S = 30.0  # how long the fleet's consumer (a filter subject per node) may take to create
DEFAULT_HEARTBEAT_S = 5.0  # per node; 512 nodes at 5 s is ~100 heartbeats a second for the registry
DEFAULT_PRESET = "h100_sxm_8gpu_nvswitch_nv18"
DEFAULT_NODES_PER_LEAF = 16
DEFAULT_LEAVES_PER_SPINE = 8
# The heartbeat loop publishes one slice of the nodes per tick. Real nodes heartbeat at independent moments; slices
# of 0.5 s (51 of 512 nodes at once) made a burst that every follower folded together, and paced submissions that
# met it waited: paced p99 60-105 ms against 30-37 ms with 0.1 s slices (bench:scale --paced 400, three runs each).
TICK_S = 0.1
MAX_ACK_PENDING = 4096  # commands in flight at once across the fleet
# Ended attempts remembered per simulated node (a real executor keeps 4,096): 512 nodes in one process held ~350,000
# after 100,000 jobs, and the fleet grew to 188 MB and 1.2 ms of CPU per gang (141 MB and 0.9 ms with 256)
FLEET_REMEMBER_ENDS = 256
_BAD_NAME = re.compile(r"[.*>\s]")


def fleet_consumer(name: str) -> str:
    return f"fleet-{name}"


def fleet_inbox(name: str) -> str:
    return f"{DEFAULT_INBOX}.fleet-{name}"


def synthetic_nodes(
    count: int,
    preset: str = DEFAULT_PRESET,
    *,
    nodes_per_leaf: int = DEFAULT_NODES_PER_LEAF,
    leaves_per_spine: int = DEFAULT_LEAVES_PER_SPINE,
    prefix: str = "sim",
) -> list[NodeTopology]:
    """`count` copies of a preset named `<prefix>-0000`…, `nodes_per_leaf` to a leaf, `leaves_per_spine` to a spine."""
    from oneplus_topology.cluster import synthetic_cluster

    cluster = synthetic_cluster(
        count, preset, nodes_per_leaf=nodes_per_leaf, leaves_per_spine=leaves_per_spine, name=prefix, prefix=prefix
    )
    width = max(4, len(str(count - 1)))
    return [t.model_copy(update={"node": f"{prefix}-{i:0{width}d}"}) for i, t in enumerate(cluster.nodes)]


def cluster_nodes(path: str | Path) -> tuple[str, list[NodeTopology]]:
    """The cluster YAML's name and nodes (docs/topology.md: `name`, `fabric`, `node_groups`, `nodes`)."""
    from oneplus_topology.cluster import load_cluster

    cluster = load_cluster(path)
    return cluster.name, list(cluster.nodes)


class FleetStore(ReservationStore):
    """One Redis client for the whole fleet, with the three things a fleet does in bulk."""

    def __init__(self, client: aioredis.Redis, cluster: str = "default") -> None:
        super().__init__(client, cluster)
        self.snapshot: list[Reservation] | None = None
        self.snapshot_epoch: int | None = None
        self._renewals: dict[tuple[str, int, float], asyncio.Future[RenewStatus]] = {}
        self._renewing: set[asyncio.Task[None]] = set()

    async def renew_status(self, job_id: str, token: int, lease_s: float = DEFAULT_LEASE_S) -> RenewStatus:
        """The lease checks that the fleet's nodes make in one turn of the loop (launches of a burst) share one
        round trip to the store (`renew_many`): a round trip each costs the fleet's one core more than Redis."""
        loop = asyncio.get_running_loop()
        key = (job_id, token, lease_s)
        fut = self._renewals.get(key)
        if fut is None:
            if not self._renewals:
                loop.call_soon(self._send_renewals)
            fut = self._renewals[key] = loop.create_future()
        return await asyncio.shield(fut)  # a caller cancelled leaves the answer to the others asking the same

    def _send_renewals(self) -> None:
        batch, self._renewals = self._renewals, {}
        task = asyncio.create_task(self._renew_batch(batch))
        self._renewing.add(task)
        task.add_done_callback(self._renewing.discard)

    async def _renew_batch(self, batch: dict[tuple[str, int, float], asyncio.Future[RenewStatus]]) -> None:
        leases: dict[float, list[tuple[str, int]]] = {}
        for job_id, token, lease_s in batch:
            leases.setdefault(lease_s, []).append((job_id, token))
        try:
            for lease_s, held in leases.items():
                got = await self.renew_many(held, lease_s)
                for job_id, token in held:
                    batch[(job_id, token, lease_s)].set_result(got[(job_id, token)])
        except Exception as exc:
            for fut in batch.values():
                if not fut.done():
                    fut.set_exception(exc)

    async def all(self) -> list[Reservation]:
        """While `snapshot` is set (a fleet reconcile), every node's reconcile reads that one list."""
        if self.snapshot is not None:
            return list(self.snapshot)
        return await super().all()

    async def epoch(self) -> int | None:
        """While `snapshot` is set, the epoch read with it."""
        if self.snapshot is not None:
            return self.snapshot_epoch
        return await super().epoch()


class SimulatedFleet:
    """N simulated nodes behind one service; `svc.app` starts and stops them (`svc.run()` from a command line)."""

    def __init__(
        self,
        nodes: Sequence[NodeTopology],
        settings: BusSettings | None = None,
        *,
        name: str = "sim",
        heartbeat_s: float = DEFAULT_HEARTBEAT_S,
        keep_finished: int = KEEP_FINISHED,
        state_dir: Path | None = None,
    ) -> None:
        """`state_dir`: where the fleet's outbox lives (default: ONEPLUS_STATE_DIR, or the user's state dir)."""
        if not nodes:
            raise ValueError("a fleet needs at least one node")
        if not name or _BAD_NAME.search(name):
            raise ValueError(f"fleet name {name!r}: no dots, wildcards or spaces (it names a NATS consumer)")
        names = [t.node for t in nodes]
        bad = [n for n in names if not n or _BAD_NAME.search(n)]
        if bad:
            raise ValueError(f"node name {bad[0]!r}: no dots, wildcards or spaces (it is a NATS subject token)")
        nodes = [simulated_node(t) for t in nodes]
        if len(set(names)) != len(names):
            dup = next(n for n in names if names.count(n) > 1)
            raise ValueError(f"node {dup!r} appears twice in the fleet")
        if heartbeat_s <= 0:
            raise ValueError(f"heartbeat_s must be positive, got {heartbeat_s}")
        settings = settings or BusSettings.from_env()
        RedisSettings.of_bus(settings)  # a bad REDIS_* value is refused here, at bootstrap
        if settings.inbox_prefix == DEFAULT_INBOX:
            settings = dataclasses.replace(settings, inbox_prefix=fleet_inbox(name))
        self.name = name
        self.heartbeat_s = heartbeat_s
        gpus = sum(len(t.gpus) for t in nodes)
        self.svc = OneplusService("node-executor", f"Simulated fleet {name}: {len(nodes)} nodes, {gpus} GPUs", settings)
        self.state_dir = state_dir if state_dir is not None else state_dir_from_env(f"fleet-{name}")
        # Simulated ranks: no fsync per fact (hundreds a second); a crash of the process still leaves them on disk.
        self.outbox = Outbox(
            fact_sender(lambda: self.svc.ledger),
            self.state_dir / f"outbox-fleet-{name}.jsonl",
            fsync=False,
        )
        node_settings = ExecutorSettings.load()  # the simulated ranks' time scale, read once for every node
        self.executors: dict[str, NodeExecutor] = {
            t.node: NodeExecutor(
                self.svc,
                t,
                make_runtime("simulated", t, node_settings),
                heartbeat_s=heartbeat_s,
                keep_finished=keep_finished,
                remember_ends=FLEET_REMEMBER_ENDS,
                report_every_s=node_settings.report_every_s,
                outbox=self.outbox,
            )
            for t in nodes
        }
        self._order = list(self.executors.values())
        self._locks: dict[str, asyncio.Lock] = {}
        self._inflight: set[asyncio.Task[None]] = set()
        self._subs: list[Subscription] = []
        self.store: FleetStore | None = None
        self.svc.on_start(self.start)
        self.svc.background(self.heartbeat_loop)
        self.svc.on_stop(self.stop)

    @property
    def app(self) -> Any:
        return self.svc.app

    @property
    def consumer(self) -> str:
        return fleet_consumer(self.name)

    @property
    def nodes(self) -> list[str]:
        return list(self.executors)

    # -- start and stop ----------------------------------------------------------------------------------------

    async def start(self) -> None:
        t0 = time.monotonic()
        self.outbox.start()  # facts left from before a restart go out first
        self.store = FleetStore(redis_client(RedisSettings.of_bus(self.svc.settings)), self.svc.settings.cluster)
        for ex in self._order:
            ex.store = self.store
        await self.publish_topologies()
        await self.reconcile()
        await self.subscribe_commands()
        self._subs.append(await self.svc.nc.subscribe(f"{subjects.PREFIX}.ops.node.*.logs", cb=self.on_logs))
        self._subs.append(await self.svc.nc.subscribe(subjects.NODE_REPORT_REQUEST, cb=self.on_report_request))
        log.info(
            "fleet %s: %d nodes up in %.1f s (consumer %s, heartbeat every %g s)",
            self.name,
            len(self._order),
            time.monotonic() - t0,
            self.consumer,
            self.heartbeat_s,
        )

    async def on_report_request(self, msg: Msg) -> None:
        """The nodes asked (all, when a solver starts) send their full report with their next heartbeat (spread
        over one interval)."""
        nodes = nodes_asked(msg)
        for ex in self._order if nodes is None else [self.executors[n] for n in nodes if n in self.executors]:
            ex.ask_for_report()

    async def publish_topologies(self, chunk: int = 64) -> None:
        """What NodeExecutor.start publishes, for every node, `chunk` acknowledged publishes at a time."""
        stamp = int(time.time())

        async def one(ex: NodeExecutor) -> None:
            await self.svc.js.publish(
                subjects.node_topology(ex.node),
                ex.topology.model_dump_json().encode(),
                headers={"Nats-Msg-Id": f"topology-{ex.node}-{stamp}"},
                stream=subjects.NODES_STREAM,
            )

        for i in range(0, len(self._order), chunk):
            await asyncio.gather(*(one(ex) for ex in self._order[i : i + chunk]))

    async def reconcile(self, executors: Sequence[NodeExecutor] | None = None) -> None:
        """Every node's (or `executors'`) NodeExecutor.reconcile over one reservation read. Simulated ranks do not
        outlive the process: a restarted fleet reports the ranks of its running jobs lost, as a restarted executor
        would (blamed on the platform: the jobs are requeued). Against a reset store nothing is reported or removed;
        the nodes reconcile again, with the lease renewals, once the solver has rebuilt it."""
        store = self.rstore()
        store.snapshot_epoch = await ReservationStore.epoch(store)
        store.snapshot = [] if store.snapshot_epoch is None else await ReservationStore.all(store)
        reset = 0
        try:
            for ex in executors if executors is not None else self._order:
                try:
                    await ex.reconcile()
                except Exception:
                    log.exception("%s: reconcile failed; retried with the heartbeats", ex.node)
                reset += not ex.reconciled
        finally:
            store.snapshot = None
        if store.snapshot_epoch is None and reset:
            log.warning("fleet %s: the reservation store lost its state: %d nodes reconcile later", self.name, reset)

    async def subscribe_commands(self) -> None:
        """Create (or update, when the fleet's nodes changed) the fleet's durable consumer and bind to it."""
        config = ConsumerConfig(
            name=self.consumer,
            durable_name=self.consumer,
            deliver_subject=f"{self.svc.settings.inbox_prefix}.commands",
            deliver_group=self.consumer,
            deliver_policy=DeliverPolicy.ALL,
            filter_subjects=[subjects.node_commands_of(n) for n in self.executors],
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=30,
            max_deliver=self.svc.settings.max_deliver,
            max_ack_pending=MAX_ACK_PENDING,
        )
        # One filter subject a node: at 4,096 nodes the server took over nats-py's 5 s default on a busy 2-core host.
        info = await self.svc.js.add_consumer(subjects.COMMANDS_STREAM, config=config, timeout=CONSUMER_SETUP_S)
        sub = await self.svc.js.subscribe_bind(
            subjects.COMMANDS_STREAM, info.config, info.name, cb=self.on_command, manual_ack=True
        )
        self._subs.append(sub)

    async def stop(self) -> None:
        for sub in self._subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        self._subs.clear()
        for task in list(self._inflight):
            task.cancel()
        for ex in self._order:
            ex.store = None  # shared: closed once below, not by every node
            with contextlib.suppress(Exception):
                await ex.stop()
        await self.outbox.close()  # what is still pending stays on disk for the next start
        if self.store is not None:
            await self.store.close()
            self.store = None

    def rstore(self) -> FleetStore:
        assert self.store is not None, "the fleet's reservation store is opened on start"
        return self.store

    # -- commands ----------------------------------------------------------------------------------------------

    async def on_command(self, msg: Msg) -> None:
        # Called in delivery order; each command runs in a task of its own, behind its node's lock, so one node's
        # commands keep their order (asyncio locks are FIFO) while other nodes' commands proceed.
        task = asyncio.create_task(self.handle(msg))
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)

    async def handle(self, msg: Msg) -> None:
        parts = msg.subject.split(".")  # oneplus.cmd.node.<node>.<kind>
        node = parts[3] if len(parts) == 5 else ""
        async with self._locks.setdefault(node, asyncio.Lock()):
            try:
                await self.dispatch(node, msg)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                await self.failed(msg, exc)
                return
            await msg.ack()

    async def dispatch(self, node: str, msg: Msg) -> None:
        ex = self.executors.get(node)
        if ex is None:
            raise ValueError(f"{msg.subject} delivered to fleet {self.name}, which has no node {node!r}")
        cmd = NODE_COMMAND_ADAPTER.validate_json(msg.data)
        if cmd.node != node:
            raise ValueError(f"command for node {cmd.node} delivered to {node}")
        context = propagate.extract(dict(msg.headers or {}))  # the job's trace goes on through the fleet
        if isinstance(cmd, LaunchBatch):
            tracer = self.svc.tracer
            attrs: dict[str, str | int] = {"oneplus.node": node, "oneplus.launches": len(cmd.launches)}
            with tracer.start_as_current_span("node-executor launch_batch", context=context, attributes=attrs):
                # Each launch continues its own job's trace (carried in the batch's body, not its one header).
                await ex.launch_batch(
                    cmd, lambda c: job_span(tracer, "node-executor launch", c.traceparent, launch_attrs(c))
                )
            return
        with self.svc.tracer.start_as_current_span(
            f"node-executor {cmd.kind}",
            context=context,
            attributes={"oneplus.job_id": cmd.job_id, "oneplus.node": node},
        ):
            if isinstance(cmd, LaunchRanks):
                await ex.launch(cmd)
            elif isinstance(cmd, CancelRanks):
                await ex.cancel(cmd)
            elif isinstance(cmd, SignalRanks):
                await ex.signal(cmd)
            else:
                ex.start_preempt(cmd)

    async def failed(self, msg: Msg, exc: Exception) -> None:
        """The platform's redelivery policy (oneplus_bus.deadletter): NAK with a growing delay, then dead-letter."""
        try:
            delivered = int(msg.metadata.num_delivered or 1)
        except Exception:
            delivered = 1
        if _is_poison(exc) or delivered >= self.svc.settings.max_deliver:
            await _publish_dead_letter({"broker": self.svc.broker}, msg, exc, delivered)
            await msg.ack()
        else:
            log.warning("%s failed (delivery %d): %s", msg.subject, delivered, exc)
            await msg.nak(delay=min(0.2 * 2 ** (delivered - 1), 5.0))

    # -- logs --------------------------------------------------------------------------------------------------

    async def on_logs(self, msg: Msg) -> None:
        """`oneplus logs` for a fleet node; a request for another node is left to that node's executor."""
        ex = self.executors.get(msg.subject.split(".")[3])
        if ex is None or not msg.reply:
            return

        async def logs(payload: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
            return await ex.logs(payload)

        # The same reply envelope (and tenancy check) as every ops endpoint of the platform.
        await self.svc._ops_adapter(logs)(Request(msg))

    # -- heartbeats and leases ---------------------------------------------------------------------------------

    async def heartbeat_loop(self) -> None:
        """Each node heartbeats every `heartbeat_s`, a slice per tick; the leases are renewed once per round."""
        loop = asyncio.get_running_loop()
        tick = min(TICK_S, self.heartbeat_s)
        slices = max(1, round(self.heartbeat_s / tick))
        i = 0
        failing = False
        while True:
            started = loop.time()
            try:  # a bus outage must not stop the lease renewals below
                for ex in self._order[i::slices]:
                    await ex.publish_heartbeat()
                failing = False
            except Exception as exc:
                if not failing:
                    log.warning("fleet %s: heartbeats not sent: %s", self.name, exc)
                failing = True
            i = (i + 1) % slices
            if i == 0:
                try:
                    await self.renew_leases()
                except Exception as exc:
                    log.warning("fleet %s: lease renewal failed: %s", self.name, exc)
            await asyncio.sleep(max(0.0, tick - (loop.time() - started)))

    async def renew_leases(self) -> None:
        """NodeExecutor.heartbeat_once's renewals for the whole fleet in one pipeline, for the ranks alive only:
        "stale"/"gone" fences the job's ranks out (stopped, reported once stopped), "reset" keeps them."""
        waiting = [ex for ex in self._order if not ex.reconciled]
        if waiting:
            await self.reconcile(waiting)  # a reconcile that failed, or found the store reset, runs again
        holders: dict[tuple[str, int], list[NodeExecutor]] = {}
        for ex in self._order:
            for pair in ex.held():
                holders.setdefault(pair, []).append(ex)
        if not holders:
            return
        renewed = await self.rstore().renew_many(list(holders), LEASE_S)
        was_reset = any(ex.store_reset for ex in self._order)
        reset = False
        for pair, status in renewed.items():
            for ex in holders[pair]:
                reset |= ex.apply_renewals({pair: status}, log_reset=False)
        if reset and not was_reset:
            log.warning("fleet %s: the reservation store lost its state: the ranks keep running", self.name)
        elif was_reset and not reset:
            log.info("fleet %s: the reservation store is rebuilt: leases renewed again", self.name)


def build_fleet(args: argparse.Namespace, settings: BusSettings | None = None) -> SimulatedFleet:
    if args.cluster:
        cluster_name, nodes = cluster_nodes(args.cluster)
        name = args.name or re.sub(r"[^A-Za-z0-9_-]", "-", cluster_name)
    else:
        nodes = synthetic_nodes(
            args.nodes,
            args.topology,
            nodes_per_leaf=args.nodes_per_leaf,
            leaves_per_spine=args.leaves_per_spine,
            prefix=args.prefix,
        )
        name = args.name or args.prefix
    return SimulatedFleet(
        nodes,
        settings,
        name=name,
        heartbeat_s=args.heartbeat,
        keep_finished=args.keep_finished,
        state_dir=Path(args.state_dir) if args.state_dir else None,
    )


def parser() -> argparse.ArgumentParser:
    env = os.environ.get
    p = argparse.ArgumentParser(
        prog="python -m oneplus_node_executor.fleet",
        description="Many simulated node-executors in one process, speaking the subjects real executors speak.",
    )
    p.add_argument("--nodes", type=int, default=int(env("ONEPLUS_FLEET_NODES", "64")), help="how many nodes")
    p.add_argument("--topology", default=env("ONEPLUS_TOPOLOGY", DEFAULT_PRESET), help="a topology preset")
    p.add_argument("--nodes-per-leaf", type=int, default=DEFAULT_NODES_PER_LEAF)
    p.add_argument("--leaves-per-spine", type=int, default=DEFAULT_LEAVES_PER_SPINE)
    p.add_argument("--prefix", default="sim", help="node names: <prefix>-0000, <prefix>-0001, …")
    p.add_argument("--cluster", help="a cluster YAML (docs/topology.md) instead of --nodes/--topology")
    p.add_argument("--name", help="the fleet's name (its consumer is fleet-<name>); default the prefix or cluster")
    p.add_argument(
        "--heartbeat",
        type=float,
        default=float(env("ONEPLUS_FLEET_HEARTBEAT_S", str(DEFAULT_HEARTBEAT_S))),
        help="seconds between two heartbeats of one node",
    )
    p.add_argument("--keep-finished", type=int, default=KEEP_FINISHED)
    p.add_argument(
        "--state-dir",
        default=env("ONEPLUS_STATE_DIR"),
        help="where the fleet keeps the facts it has yet to deliver (default ~/.local/state/oneplus/fleet-<name>)",
    )
    add_metrics_port_argument(p)
    return p


def main(argv: Sequence[str] | None = None) -> None:
    p = parser()
    a = p.parse_args(argv)
    if not a.cluster and a.nodes < 1:
        p.error(f"--nodes {a.nodes}: a fleet needs at least one node")
    if a.heartbeat <= 0:
        p.error(f"--heartbeat {a.heartbeat}: must be positive")
    try:
        fleet = build_fleet(a)
    except (ValueError, KeyError) as exc:
        p.error(str(exc))
    if a.metrics_port is not None:
        fleet.svc.metrics_port = a.metrics_port
    with contextlib.suppress(KeyboardInterrupt):
        fleet.svc.run()


if __name__ == "__main__":
    main()
