"""What the solver carries from cycle to cycle, kept in the `solver_state` KV bucket so a restart forgets nothing.

Fair-share usage (decayed GPU-seconds per queue and the recent preemptions behind the rate limit) and the cycle's
carry: the GPUs nominated for preemptors and the protected job. Without them a restarted solver would treat every
queue as unused, could hand a preemptor's nominated GPUs to someone else while its victims are still checkpointing,
and could let newcomers ahead of the job whose block it had promised.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue
from oneplus_bus.fencing import Deposed, OwnerFence
from oneplus_contracts import Allocation, subjects
from oneplus_queueing.fairshare import UsageHistory
from oneplus_queueing.model import CycleCarry
from pydantic import BaseModel, ValidationError

log = logging.getLogger("oneplus.solver")

USAGE_KEY = "usage"
NOMINATIONS_KEY = "nominations"
# Usage changes every cycle; writing it this often bounds what a crash loses to a few seconds of decayed GPU time.
USAGE_SAVE_EVERY_S = 2.0


class StoredUsage(BaseModel):
    queues: list[str]  # the queue tree it was charged under: a new tree starts a new history
    history: dict[str, Any]


class StoredCarry(BaseModel):
    nominations: dict[str, Allocation]
    protected: str | None = None  # absent in what older solvers stored


class SolverMemory:
    def __init__(self, kv: KeyValue) -> None:
        self.kv = kv
        self.saved_usage_at = -float("inf")
        self.saved_carry: CycleCarry | None = None
        # The job owner's fence: its writes carry the owner epoch's precondition (None: plain puts, as in tests).
        self.fence: OwnerFence | None = None

    async def _put(self, key: str, value: bytes) -> bool:
        """Whether `value` was stored: not when the server refused it (a newer owner fenced the bucket; the fence
        has already told the solver, which steps down and goes on as a follower, whose carry and usage nobody keeps)."""
        if self.fence is None:
            await self.kv.put(key, value)
            return True
        try:
            await self.fence.put_kv(subjects.SOLVER_STATE_KV, key, value)
        except Deposed:
            log.info("%s not saved: this solver is no longer the job owner", key)
            return False
        return True

    async def _read(self, key: str) -> bytes | None:
        try:
            entry = await self.kv.get(key)
        except KeyNotFoundError:
            return None
        return entry.value or None

    async def load_usage(self, queues: tuple[str, ...]) -> UsageHistory | None:
        """The stored history if it was charged under the same queue tree; None to start afresh."""
        raw = await self._read(USAGE_KEY)
        if raw is None:
            return None
        try:
            stored = StoredUsage.model_validate_json(raw)
            usage = UsageHistory.from_dict(stored.history)
        except (ValidationError, KeyError, TypeError, ValueError) as exc:
            log.warning("stored fair-share usage is unreadable (%s); starting afresh", exc)
            return None
        return usage if tuple(stored.queues) == queues else None

    async def load_carry(self) -> CycleCarry:
        raw = await self._read(NOMINATIONS_KEY)
        if raw is None:
            return CycleCarry()
        try:
            stored = StoredCarry.model_validate_json(raw)
        except ValidationError as exc:
            log.warning("stored nominations are unreadable (%s); starting without", exc)
            return CycleCarry()
        self.saved_carry = CycleCarry(dict(stored.nominations), stored.protected)
        return self.saved_carry

    async def save_usage(self, usage: UsageHistory, queues: tuple[str, ...], *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.saved_usage_at < USAGE_SAVE_EVERY_S:
            return
        doc = StoredUsage(queues=list(queues), history=usage.to_dict())
        if await self._put(USAGE_KEY, doc.model_dump_json().encode()):
            self.saved_usage_at = now

    async def save_carry(self, carry: CycleCarry) -> None:
        if self.saved_carry == carry:
            return  # most cycles nominate nobody new and keep the same protected job: no write
        doc = StoredCarry(nominations=dict(carry.nominations), protected=carry.protected)
        if await self._put(NOMINATIONS_KEY, doc.model_dump_json().encode()):
            self.saved_carry = carry
