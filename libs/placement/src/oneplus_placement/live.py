"""Per-node free capacity kept current from node records and the gangs that hold GPUs (pure).

The solver feeds it from the topology bucket's changes and from its own reservations; a scheduling cycle takes a
copy (`state()`), whose cost follows the nodes, never the jobs ever run. A node record whose topology changes
rebuilds the model; a cordon, a drain, a loss or an unhealthy GPU is applied in place.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from oneplus_contracts import Allocation, NodeRecord
from oneplus_contracts.slim import slim

from .snapshot import AllocationConflict, ClusterSnapshot, ClusterState

log = logging.getLogger("oneplus.placement")


class LiveCapacity:
    def __init__(self, name: str = "live", nic_gbps_per_gpu: float = 400.0, oversubscription: float = 1.0) -> None:
        self.name = name
        self.nic_gbps = nic_gbps_per_gpu
        self.oversubscription = oversubscription
        self.records: dict[str, NodeRecord] = {}
        self.held: dict[str, tuple[int, Allocation]] = {}  # job → (fencing token, allocation) of every holder
        self._state: ClusterState | None = None

    # -- nodes ---------------------------------------------------------------------------------------------------
    def set_node(self, rec: NodeRecord) -> bool:
        """A node's record changed; True when it may offer more than before (a node back, uncordoned, healed)."""
        node = rec.topology.node
        before = self.records.get(node)
        if before is not None and before.topology == rec.topology:
            # The same board (a persisted heartbeat, a status change): keep the topology already held, so the copy
            # just parsed is dropped at once instead of living on beside the jobs of the moment (heap fragmentation).
            rec = rec.model_copy(update={"topology": before.topology})
        slim(rec)
        self.records[node] = rec
        if before is None or before.topology is not rec.topology or self._state is None:
            self._state = None  # a new node or a new board: rebuild on the next read
            return True
        self._state.set_schedulable(node, rec.schedulable)
        self._state.set_unhealthy(node, rec.unhealthy_gpus)
        more = rec.schedulable and not before.schedulable
        return more or len(rec.unhealthy_gpus) < len(before.unhealthy_gpus)

    def remove_node(self, node: str) -> None:
        if self.records.pop(node, None) is not None:
            self._state = None

    # -- holders -------------------------------------------------------------------------------------------------
    def hold(self, job_id: str, token: int, alloc: Allocation) -> None:
        if job_id in self.held:
            self.release(job_id)
        self.held[job_id] = (token, alloc)
        if self._state is not None and set(alloc.nodes) <= self.records.keys():
            try:
                self._state.apply(alloc)
            except AllocationConflict as exc:
                log.error("holder %s does not fit the topology model: %s; rebuilding", job_id, exc)
                self._state = None

    def ensure_held(self, job_id: str, token: int, alloc: Allocation) -> None:
        """Hold `alloc` for `job_id` under `token` unless it is held so already (a new token replaces the old)."""
        if self.token_of(job_id) != token:
            self.hold(job_id, token, alloc)

    def hold_exactly(self, holds: Iterable[tuple[str, int, Allocation]]) -> None:
        """Hold exactly these (job, token, allocation): what the reservation store holds, read whole."""
        wanted = {job_id: (token, alloc) for job_id, token, alloc in holds}
        for job_id in list(self.held):
            if job_id not in wanted:
                self.release(job_id)
        for job_id, (token, alloc) in wanted.items():
            self.ensure_held(job_id, token, alloc)

    def release(self, job_id: str) -> None:
        held = self.held.pop(job_id, None)
        if held is None or self._state is None:
            return
        if set(held[1].nodes) <= self.records.keys():
            try:
                self._state.release(held[1])
            except AllocationConflict:
                self._state = None

    def token_of(self, job_id: str) -> int | None:
        held = self.held.get(job_id)
        return held[0] if held is not None else None

    # -- reads ---------------------------------------------------------------------------------------------------
    def state(self) -> ClusterState:
        """The current model (shared: copy it before trying placements on it)."""
        if self._state is None:
            self._state = self._build()
        return self._state

    def copy(self) -> ClusterState:
        return self.state().mutable_copy()

    def _build(self) -> ClusterState:
        records = sorted(self.records.values(), key=lambda r: r.topology.node)
        state = ClusterSnapshot.from_records(self.name, records, self.nic_gbps, self.oversubscription).thaw()
        for job_id, (_, alloc) in self.held.items():
            if not set(alloc.nodes) <= self.records.keys():
                continue  # a node that has not (re)reported: its GPUs are not offered anyway
            try:
                state.apply(alloc)
            except AllocationConflict as exc:
                log.error("holder %s does not fit the topology model: %s", job_id, exc)
        return state
