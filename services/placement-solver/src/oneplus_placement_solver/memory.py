"""What the solver carries from cycle to cycle, kept in the `solver_state` KV bucket so a restart forgets nothing.

Fair-share usage (decayed GPU-seconds per queue and the recent preemptions behind the rate limit) and the GPUs
nominated for preemptors. Without them a restarted solver would treat every queue as unused and could hand a
preemptor's nominated GPUs to someone else while its victims are still checkpointing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue
from oneplus_contracts import Allocation
from oneplus_queueing.fairshare import UsageHistory
from pydantic import BaseModel, ValidationError

log = logging.getLogger("oneplus.solver")

USAGE_KEY = "usage"
NOMINATIONS_KEY = "nominations"
# Usage changes every cycle; writing it this often bounds what a crash loses to a few seconds of decayed GPU time.
USAGE_SAVE_EVERY_S = 2.0


class StoredUsage(BaseModel):
    queues: list[str]  # the queue tree it was charged under: a new tree starts a new history
    history: dict[str, Any]


class StoredNominations(BaseModel):
    nominations: dict[str, Allocation]


class SolverMemory:
    def __init__(self, kv: KeyValue) -> None:
        self.kv = kv
        self.saved_usage_at = -float("inf")
        self.saved_nominations: dict[str, Allocation] | None = None

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

    async def load_nominations(self) -> dict[str, Allocation]:
        raw = await self._read(NOMINATIONS_KEY)
        if raw is None:
            return {}
        try:
            noms = StoredNominations.model_validate_json(raw).nominations
        except ValidationError as exc:
            log.warning("stored nominations are unreadable (%s); starting without", exc)
            return {}
        self.saved_nominations = dict(noms)
        return dict(noms)

    async def save_usage(self, usage: UsageHistory, queues: tuple[str, ...], *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.saved_usage_at < USAGE_SAVE_EVERY_S:
            return
        doc = StoredUsage(queues=list(queues), history=usage.to_dict())
        await self.kv.put(USAGE_KEY, doc.model_dump_json().encode())
        self.saved_usage_at = now

    async def save_nominations(self, nominations: Mapping[str, Allocation]) -> None:
        if self.saved_nominations == dict(nominations):
            return  # most cycles nominate nobody new: no write
        doc = StoredNominations(nominations=dict(nominations))
        await self.kv.put(NOMINATIONS_KEY, doc.model_dump_json().encode())
        self.saved_nominations = dict(nominations)
