"""Stand-ins for the bus and Redis around one NodeExecutor: the job ledger folds events with the real lifecycle."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from nats.aio.client import Client
from oneplus_contracts import (
    Allocation,
    IllegalTransition,
    JobAccepted,
    JobEvent,
    JobPlaced,
    JobRecord,
    JobSpec,
    LaunchBatch,
    LaunchRanks,
    NodeHeartbeat,
    RankPlacement,
    RankResources,
    apply_event,
    subjects,
)
from oneplus_node_executor.node import NodeExecutor
from oneplus_node_executor.runtime.base import Runtime
from oneplus_reservations import Reservation
from oneplus_topology.presets import load_preset

NODE = "unit-0"


class Ledger:
    """Keeps records as the real ledger does (apply_event), and the order events were recorded in."""

    def __init__(self) -> None:
        self.records: dict[str, JobRecord] = {}
        self.events: list[JobEvent] = []
        self.refused: list[JobEvent] = []

    async def record(self, event: JobEvent) -> JobRecord:
        new = apply_event(self.records.get(event.job_id), event)  # raises IllegalTransition as the real one does
        self.records[event.job_id] = new
        self.events.append(event)
        return new

    async def report(self, event: JobEvent, traceparent: str | None = None) -> int:
        """A fact for the job's owner, folded as the owner folds it: one that does not apply is refused, not kept."""
        try:
            await self.record(event)
        except IllegalTransition:
            self.refused.append(event)
        return len(self.events)

    async def deliver(self, event: JobEvent, traceparent: str | None = None) -> int:
        """A fact sent straight to the owner (the executor's default): folded as `report` folds it."""
        return await self.report(event, traceparent)

    async def get(self, job_id: str) -> tuple[JobRecord | None, int]:
        return self.records.get(job_id), 0

    def types(self, job_id: str) -> list[str]:
        return [e.type for e in self.events if e.job_id == job_id]


class Bus:
    def __init__(self) -> None:
        self.published: list[tuple[str, bytes]] = []

    async def publish(self, subject: str, body: bytes, **_: Any) -> None:
        self.published.append((subject, body))

    def heartbeats(self) -> list[NodeHeartbeat]:
        return [NodeHeartbeat.model_validate_json(b) for s, b in self.published if s.endswith(".heartbeat")]


@dataclass
class Store:
    """The reservation calls the executor makes; `tokens` is what Redis would hold."""

    tokens: dict[str, int] = field(default_factory=dict)
    allocations: dict[str, Allocation] = field(default_factory=dict)
    renewals: list[tuple[str, int]] = field(default_factory=list)

    epoch_marker: int | None = 1  # None: the store lost its state

    async def renew(self, job_id: str, token: int, lease_s: float) -> bool:
        return await self.renew_status(job_id, token, lease_s) == "ok"

    async def renew_status(self, job_id: str, token: int, lease_s: float) -> str:
        self.renewals.append((job_id, token))
        if self.epoch_marker is None:
            return "reset"
        held = self.tokens.get(job_id)
        return "ok" if held == token else "gone" if held is None else "stale"

    async def renew_many(self, held: list[tuple[str, int]], lease_s: float) -> dict[tuple[str, int], str]:
        return {pair: await self.renew_status(*pair, lease_s) for pair in sorted(set(held))}

    async def epoch(self) -> int | None:
        return self.epoch_marker

    async def all(self) -> list[Reservation]:
        return [Reservation(j, t, self.allocations[j]) for j, t in self.tokens.items()]

    async def close(self) -> None:
        return None


@dataclass
class Service:
    ledger: Ledger = field(default_factory=Ledger)
    nc: Bus = field(default_factory=Bus)
    js: Bus = field(default_factory=Bus)


CREATED: list[NodeExecutor] = []  # closed after each test (conftest): no outbox sender outlives its test


def executor(runtime: Runtime, keep_finished: int = 16) -> tuple[NodeExecutor, Service, Store]:
    svc, store = Service(), Store()
    ex = NodeExecutor(
        svc,  # type: ignore[arg-type]
        load_preset("l40s_8gpu_pcie_node_sys", NODE),
        runtime,
        heartbeat_s=0.05,
        keep_finished=keep_finished,
    )
    ex.store = store  # type: ignore[assignment]
    CREATED.append(ex)
    return ex, svc, store


def spec(**extra: Any) -> JobSpec:
    body: dict[str, Any] = {"name": "unit", "resources": RankResources(gpus=1, cpus=1, memory_mb=64)}
    body.update(extra)
    return JobSpec.model_validate(body)


async def placed(svc: Service, store: Store, job_id: str, job: JobSpec, token: int = 1) -> LaunchRanks:
    """Accept and place the job on NODE (as intake and the solver would) and return its launch command."""
    alloc = Allocation(ranks=[RankPlacement(rank=0, node=NODE, gpus=[0], cpus=1, memory_mb=64)])
    store.tokens[job_id] = token
    store.allocations[job_id] = alloc
    if job_id not in svc.ledger.records:
        await svc.ledger.record(JobAccepted(job_id=job_id, spec=job))
    await svc.ledger.record(JobPlaced(job_id=job_id, allocation=alloc, token=token, attempt=token))
    return LaunchRanks(
        job_id=job_id,
        node=NODE,
        token=token,
        spec=job,
        ranks=alloc.ranks,
        world_size=1,
        node_rank=0,
        nodes=[NODE],
        master_addr="127.0.0.1",
    )


def dumps(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True)


async def send_launch_batch(nc: Client, node: str, cmds: list[LaunchRanks]) -> LaunchBatch:
    """The node's launches as one `LaunchBatch` on its `launch` subject, as the solver's binder sends them: one
    append, deduplicated by the batch's id."""
    batch = LaunchBatch.of(cmds)
    await nc.jetstream().publish(
        subjects.node_command(node, "launch"),
        batch.model_dump_json().encode(),
        headers={"Nats-Msg-Id": batch.command_id},
        stream=subjects.COMMANDS_STREAM,
    )
    return batch
