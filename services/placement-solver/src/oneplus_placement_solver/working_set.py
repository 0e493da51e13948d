"""The solver's working set: per-node free capacity, what the nodes report, the queue config, and the gangs leaving.

Fed by the topology bucket's changes, the nodes' heartbeats and the queues bucket's changes (kube-scheduler's
informer-fed cache); a scheduling cycle reads only this memory and the job owner's index.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from oneplus_contracts import Allocation, JobRecord, NodeRecord
from oneplus_placement.live import LiveCapacity
from oneplus_placement.reports import HeartbeatRanks, NodeReports
from oneplus_placement.snapshot import ClusterState
from oneplus_queueing.advance import AdvanceBook
from oneplus_queueing.config import QueueConfig, QueueConfigError, default_config
from oneplus_queueing.model import RunningJob
from oneplus_reservations import Reservation
from oneplus_stores.clusterview import QUEUES_KEY, queue_config_from

log = logging.getLogger("oneplus.solver")


class WorkingSet:
    def __init__(self, capacity: LiveCapacity, wake: asyncio.Event) -> None:
        self.capacity = capacity
        self.reports = NodeReports()  # what the nodes say runs on them (their heartbeats)
        self.config: QueueConfig = default_config()
        self.config_from_kv = False
        self.queues_file: str | None = None  # SolverSettings.queues_file (None: the environment's)
        self.advance = AdvanceBook()  # advance reservations, from their bucket (oneplus_queueing.advance)
        self.wake = wake
        # Attempts whose end is recorded and whose GPUs are not released yet: the cycle sees them as vacating (they
        # still hold their GPUs), so a nomination on their GPUs is not taken for stale.
        self.leaving: dict[str, RunningJob] = {}

    # -- feeds -----------------------------------------------------------------------------------------------------
    async def on_node(self, node: str, value: bytes | None) -> None:
        if value is None:
            self.capacity.remove_node(node)
            return
        if self.capacity.set_node(NodeRecord.model_validate_json(value)):
            self.wake.set()  # a node (back), uncordoned or healed: pending jobs may fit now

    async def on_queues(self, key: str, value: bytes | None) -> None:
        if key != QUEUES_KEY:
            return
        if value is None:
            self.config_from_kv = False
            self.load_file_config()
        else:
            try:
                self.config = queue_config_from(value, self.queues_file)
                self.config_from_kv = True
            except QueueConfigError as exc:
                log.error("the stored queue config is refused, keeping the previous one: %s", exc)
        self.wake.set()

    async def on_advance(self, key: str, value: bytes | None) -> None:
        problem = self.advance.apply(key, value)
        if problem:
            log.error("%s", problem)
        self.wake.set()

    def load_file_config(self) -> None:
        if self.config_from_kv:
            return
        self.config = queue_config_from(None, self.queues_file)

    async def on_heartbeat_msg(self, msg: Any) -> None:
        try:
            hb = HeartbeatRanks.model_validate_json(msg.data)
        except ValueError as exc:
            log.warning("unreadable heartbeat on %s: %s", msg.subject, exc)
            return
        self.reports.report(hb)

    # -- reads -----------------------------------------------------------------------------------------------------
    def offered(self) -> ClusterState:
        """The cycle's copy of free capacity: without GPUs on which a node still reports ranks that hold nothing."""
        state = self.capacity.copy()
        for node, gpus in self.reports.lingering(self.capacity.held).items():
            state.block(node, gpus)
        return state

    def running(self, holders: Iterable[JobRecord]) -> list[RunningJob]:
        """Holders whose reservation the working set holds under the same token, and the attempts leaving."""
        held = self.capacity.held
        out = [
            RunningJob.from_record(r)
            for r in holders
            if r.allocation is not None and held.get(r.job_id, (None,))[0] == r.token
        ]
        if self.leaving:
            seen = {r.job_id for r in out}
            out += [r for j, r in self.leaving.items() if j not in seen and j in held]
        return out

    def holding(
        self,
        reservations: Iterable[Reservation],
        holders: Iterable[JobRecord],
        binding: Mapping[str, tuple[int, Allocation]],
    ) -> list[tuple[str, int, Allocation]]:
        """What the capacity model holds: the store's reservations; every attempt whose job record still holds GPUs
        though its reservation is gone (its lease ran out: a node silent, or reports not folded yet), as those GPUs
        are offered only once the record ends (reconcile requeues it); and the gangs being bound (assumed by a cycle,
        or reserved after the store was read)."""
        held = {r.job_id: (r.job_id, r.token, r.allocation) for r in reservations}
        for rec in holders:
            if rec.job_id not in held and rec.allocation is not None and rec.token is not None:
                held[rec.job_id] = (rec.job_id, rec.token, rec.allocation)
        for job_id, (token, alloc) in binding.items():
            held.setdefault(job_id, (job_id, token, alloc))
        return list(held.values())

    def leave(self, rec: JobRecord) -> None:
        """`rec`'s attempt ends: until its GPUs are released the cycle sees it vacating them."""
        if rec.allocation is not None and rec.state != "ACCEPTED" and not rec.terminal:
            self.leaving[rec.job_id] = dataclasses.replace(RunningJob.from_record(rec), preempting=True)

    def left(self, job_id: str) -> None:
        self.leaving.pop(job_id, None)
