"""The live cluster as decisions see it: topology KV + Redis reservations → a placement snapshot.

Shared by the placement-solver and the preemption service so both decide on the same view.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue
from oneplus_contracts import ACTIVE_STATES, Allocation, JobRecord, JobSpec, NodeRecord, subjects
from oneplus_placement.explain import explain_pending
from oneplus_placement.greedy import place_gang
from oneplus_placement.snapshot import AllocationConflict, ClusterSnapshot, ClusterState
from oneplus_queueing.config import QueueConfig, default_config, load_queue_config
from oneplus_reservations import ReservationStore

from .ledger import latest_values

log = logging.getLogger("oneplus.solver")


def pending_order(pending: Sequence[JobRecord]) -> list[JobRecord]:
    """Higher priority first, then first come first served."""
    return sorted(pending, key=lambda r: (-r.spec.priority, r.submitted_ts, r.job_id))


@dataclass(frozen=True)
class Decision:
    allocation: Allocation | None
    reason: str
    detail: dict[str, Any]


class LiveSnapshot:
    """The cluster as one scheduling cycle sees it; `hold` keeps it current as the cycle commits gangs."""

    def __init__(
        self, state: ClusterState, records: list[NodeRecord], reservations: dict[str, int] | None = None
    ) -> None:
        self.state = state
        self.records = records
        self.reservations = reservations or {}  # job → fencing token of every gang the state holds

    def place(self, spec: JobSpec, job_id: str) -> Decision:
        res = place_gang(self.state, spec, job_id)
        if res.allocation is not None:
            return Decision(res.allocation, "", {})
        exp = res.explanation
        return Decision(None, exp.message if exp else "cannot be placed", exp.to_dict() if exp else {})

    def hold(self, alloc: Allocation) -> None:
        self.state.apply(alloc)

    def explain(self, rec: JobRecord, jobs: Sequence[JobRecord]) -> dict[str, Any]:
        """Why `rec` is pending: the blocking constraint and level, who is ahead, whose preemption makes room."""
        ahead = [
            j.job_id
            for j in pending_order([j for j in jobs if j.state == "ACCEPTED"])
            if (j.spec.priority, -j.submitted_ts) > (rec.spec.priority, -rec.submitted_ts)
        ]
        preemptible = [
            (j.job_id, j.allocation, j.spec.priority)
            for j in jobs
            if j.state in ACTIVE_STATES and j.allocation is not None and j.spec.preemptible
        ]
        return explain_pending(self.state, rec.spec, ahead=ahead, preemptible=preemptible).to_dict()


class SnapshotSource:
    def __init__(self, js: JetStreamContext, store: ReservationStore) -> None:
        self.js = js
        self.store = store
        self.nic_gbps = float(os.environ.get("ONEPLUS_NIC_GBPS_PER_GPU", "400"))
        self.oversubscription = float(os.environ.get("ONEPLUS_OVERSUBSCRIPTION", "1.0"))

    async def records(self) -> list[NodeRecord]:
        return [NodeRecord.model_validate_json(v) for v in await latest_values(self.js, subjects.TOPOLOGY_KV)]

    async def snapshot(self) -> LiveSnapshot:
        records = await self.records()
        state = ClusterSnapshot.from_records("live", records, self.nic_gbps, self.oversubscription).thaw()
        known = {r.topology.node for r in records}
        held: dict[str, int] = {}
        for res in await self.store.all():
            if not set(res.allocation.nodes) <= known:
                continue  # a node that has not (re)reported: its GPUs are not offered anyway
            try:
                state.apply(res.allocation)
            except AllocationConflict as exc:
                log.error("reservation %s does not fit the topology model: %s", res.job_id, exc)
                continue
            held[res.job_id] = res.token
        return LiveSnapshot(state, records, held)


QUEUES_KEY = "config"


async def live_queue_config(queues_kv: KeyValue) -> QueueConfig:
    """The queue tree operators stored in the `queues` bucket, else ONEPLUS_QUEUES_FILE, else one `default` queue."""
    try:
        entry = await queues_kv.get(QUEUES_KEY)
    except KeyNotFoundError:
        entry = None
    if entry is not None and entry.value:
        return load_queue_config(entry.value.decode())
    path = os.environ.get("ONEPLUS_QUEUES_FILE")
    if path:
        with open(path, encoding="utf-8") as f:  # noqa: ASYNC230 - a small config file, read once per cycle
            return load_queue_config(f.read())
    return default_config()
