"""What the solver's parts share: its ports (the bus, the reservation store, the job owner) and its role.

kube-scheduler's framework hands every plugin a `Handle` onto the shared cache and clients; this is the solver's.
The ports are set when the service starts; the role (`leading`, `members`) is written by membership only, and
`store_ok` by the store's epoch guard and by a binding the store refused as reset.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from nats.js.api import PubAck
from oneplus_bus.service import OneplusService
from oneplus_bus.telemetry import inject
from oneplus_contracts import JobEvent, LaunchBatch, LaunchRanks, PreemptRanks, subjects
from oneplus_queueing.shards import replica_for
from oneplus_reservations import ReservationStore
from oneplus_stores.audit import ReservationAuditLog

from .fence import StoreFence
from .memory import SolverMemory
from .metrics import SolverMetrics
from .owner import JobOwner
from .settings import SolverSettings
from .working_set import WorkingSet


def wire(cmd: LaunchRanks | LaunchBatch | PreemptRanks) -> bytes:
    """A command's body; a launch sent alone leaves out its empty `traceparent`, which an executor from before
    `launch_batch` would refuse as an unknown field (its trace is in the header)."""
    if isinstance(cmd, LaunchRanks) and cmd.traceparent is None:
        return cmd.model_dump_json(exclude={"traceparent"}).encode()
    return cmd.model_dump_json().encode()


@dataclass
class SolverContext:
    svc: OneplusService
    settings: SolverSettings
    work: WorkingSet
    metrics: SolverMetrics
    # Held by a scheduling cycle's in-memory part (snapshot → decide → assume), never across a round trip; the store's
    # epoch guard holds it while it rebuilds a reset store, so that no cycle assumes GPUs meanwhile.
    cycle_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    leading: bool = False  # holds the owner lease: folds facts, writes records, reacts, reconciles
    members: tuple[str, ...] = ()
    store_ok: bool = False  # False while the reservation store is being rebuilt: nothing is placed
    store_: ReservationStore | None = None
    owner_: JobOwner | None = None
    memory_: SolverMemory | None = None
    audit_: ReservationAuditLog | None = None
    fence_: StoreFence | None = None

    @property
    def store(self) -> ReservationStore:
        assert self.store_ is not None, "solver not started"
        return self.store_

    @property
    def owner(self) -> JobOwner:
        assert self.owner_ is not None, "solver not started"
        return self.owner_

    @property
    def memory(self) -> SolverMemory:
        assert self.memory_ is not None, "solver not started"
        return self.memory_

    @property
    def audit(self) -> ReservationAuditLog:
        assert self.audit_ is not None, "solver not started"
        return self.audit_

    @property
    def fence(self) -> StoreFence:
        assert self.fence_ is not None, "solver not started"
        return self.fence_

    def mine(self, job_id: str) -> bool:
        """Whether this replica places `job_id` (rendezvous hashing over the live replicas)."""
        return len(self.members) <= 1 or replica_for(job_id, self.members) == self.settings.replica

    async def send_node_command(
        self, cmd: LaunchRanks | LaunchBatch | PreemptRanks, verb: str, traceparent: str | None
    ) -> asyncio.Future[PubAck]:
        """Publish one node's command without waiting for its acknowledgement. Its fixed id lets JetStream drop the
        same command sent again within the duplicate window; it carries its job's own trace (a batch: its first's)."""
        headers = {"Nats-Msg-Id": cmd.command_id}
        if traceparent:
            headers["traceparent"] = traceparent
        inject(headers)
        return await self.svc.js.publish_async(
            subjects.node_command(cmd.node, verb),
            wire(cmd),
            headers=headers,
            stream=subjects.COMMANDS_STREAM,
        )

    async def record(self, *events: JobEvent) -> None:
        """Record decisions: the owner commits them; a follower reports them as facts for the owner to fold."""
        if self.leading:
            await self.owner.commit(*events)
            return
        for event in events:
            await self.svc.ledger.report(event)
