"""Waiting for the job owner to fold a reported fact: one subscription per event type, shared by every wait.

A submission is answered once the owner has folded its `accepted` fact and written the record to the hot view, so
that a read right after finds the job; a cancel likewise. The owner says so on `oneplus.outcome.job.<job>.<type>`
(a `FactOutcome`), after the hot-view write: the job event itself goes out before that write, and a read on hearing
the event could still find the old record. A subscription per wait costs a SUB and an UNSUB on the bus for every
submission, and the server's subject index changes with each; one wildcard subscription per event type, made on
first use and kept, serves every wait of that type.
"""

from __future__ import annotations

import asyncio

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from oneplus_contracts import FactOutcome, subjects
from pydantic import ValidationError

Key = tuple[str, str]  # (job id, event type)


class FoldWatch:
    def __init__(self, nc: Client) -> None:
        self.nc = nc
        self._subs: dict[str, Subscription] = {}
        self._waiting: dict[Key, set[asyncio.Future[bool]]] = {}

    @staticmethod
    def watchable(job_id: str) -> bool:
        """A job id of one subject token: a wildcard subscription matches its events."""
        return bool(job_id) and not any(c in job_id for c in ".*> \t")

    async def expect(self, job_id: str, event_type: str) -> asyncio.Future[bool]:
        """A future done when the owner tells the outcome of `event_type` of `job_id` (True: folded, False: refused);
        made before the fact is reported, so the outcome cannot pass unseen. `forget` it when done waiting."""
        if event_type not in self._subs:
            # The SUB goes out on the connection ahead of the fact that follows: the server has it first.
            self._subs[event_type] = await self.nc.subscribe(
                subjects.fact_outcome("*", event_type), cb=self._on_outcome
            )
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault((job_id, event_type), set()).add(fut)
        return fut

    def forget(self, job_id: str, event_type: str, fut: asyncio.Future[bool]) -> None:
        waiting = self._waiting.get((job_id, event_type))
        if waiting is None:
            return
        waiting.discard(fut)
        if not waiting:
            del self._waiting[(job_id, event_type)]

    async def _on_outcome(self, msg: Msg) -> None:
        applied = outcome_applied(msg.data)
        if applied is None:
            return
        parts = msg.subject.split(".")  # oneplus.outcome.job.<job>.<type>
        for fut in self._waiting.pop((parts[-2], parts[-1]), ()):
            if not fut.done():
                fut.set_result(applied)

    @property
    def waiting(self) -> int:
        """Waits in progress (for tests and metrics)."""
        return sum(len(w) for w in self._waiting.values())


def outcome_applied(data: bytes) -> bool | None:
    """Whether the owner folded the fact, from its `FactOutcome`; None for a message that is not one."""
    try:
        return FactOutcome.model_validate_json(data).applied
    except ValidationError:
        return None
