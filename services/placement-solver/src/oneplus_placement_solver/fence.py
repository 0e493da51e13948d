"""The reservation store's epoch: how the solver notices a store that lost its state, and what it rebuilds.

Redis keeps its epoch marker (no TTL) beside the reservations; JetStream keeps the last epoch the solver set (in the
`solver_state` bucket). A store whose marker is gone was reset (restarted empty, flushed); one whose marker is below
JetStream's was rolled back (a stale snapshot, a replica promoted before it caught up). Either way its reservations
cannot be trusted: the solver bumps the epoch, so every new fencing token is above every token handed out before
(tokens of epoch e start at e * 2^32), puts back the reservations of the jobs its records say hold GPUs, under the
tokens their ranks already run with, and only then sets the marker, which the commit script requires.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue
from oneplus_bus.lease import wrong_last_sequence
from oneplus_contracts import Allocation, JobRecord
from oneplus_contracts.jobindex import HOLDING_STATES
from oneplus_reservations import Conflict, ReservationStore

log = logging.getLogger("oneplus.solver")

EPOCH_KEY = "fence_epoch"


@dataclass(frozen=True)
class StoreCheck:
    """What the solver found: the store's marker, the epoch JetStream remembers, and whether they agree."""

    marker: int | None
    remembered: int

    @property
    def intact(self) -> bool:
        return self.marker is not None and self.marker >= self.remembered

    @property
    def fresh(self) -> bool:
        """Never set up: no marker and no epoch remembered (a new installation)."""
        return self.marker is None and self.remembered == 0

    def describe(self) -> str:
        if self.marker is None:
            return "the reservation store has no epoch marker: it lost its state (restarted empty or flushed)"
        return f"the reservation store is at epoch {self.marker}, behind epoch {self.remembered}: it was rolled back"


@dataclass
class Rebuild:
    """The outcome of putting the holders' reservations back."""

    epoch: int
    restored: list[tuple[str, int, Allocation]] = field(default_factory=list)  # (job, token, allocation) put back
    refused: dict[str, str] = field(default_factory=dict)


def holders_to_restore(records: Iterable[JobRecord]) -> list[tuple[str, int, Allocation]]:
    """The (job, token, allocation) of every record that says it holds GPUs: what a rebuilt store must hold again."""
    out = []
    for rec in records:
        if rec.state in HOLDING_STATES and rec.allocation is not None and rec.token is not None:
            out.append((rec.job_id, rec.token, rec.allocation))
    return sorted(out, key=lambda t: t[1])


class StoreFence:
    def __init__(self, kv: KeyValue, store: ReservationStore) -> None:
        self.kv = kv
        self.store = store
        self.epoch = 0

    async def remembered(self) -> tuple[int, int | None]:
        """The epoch JetStream keeps and its revision (None when never written)."""
        try:
            entry = await self.kv.get(EPOCH_KEY)
        except KeyNotFoundError:
            return 0, None
        return int(entry.value or b"0"), entry.revision

    async def check(self) -> StoreCheck:
        marker = await self.store.epoch()
        remembered, _ = await self.remembered()
        if marker is not None and marker >= remembered:
            self.epoch = marker
        return StoreCheck(marker, remembered)

    async def bump(self, past: int) -> int:
        """A new epoch above `past` and above what JetStream remembers, written with compare-and-set."""
        while True:
            remembered, revision = await self.remembered()
            epoch = max(remembered, past) + 1
            try:
                if revision is None:
                    await self.kv.create(EPOCH_KEY, str(epoch).encode())
                else:
                    await self.kv.update(EPOCH_KEY, str(epoch).encode(), last=revision)
            except Exception as exc:
                if wrong_last_sequence(exc):
                    continue  # another replica moved it first: go above theirs
                raise
            self.epoch = epoch
            return epoch

    async def rebuild(self, check: StoreCheck, records: Iterable[JobRecord], lease_s: float) -> Rebuild:
        """Bump the epoch, put the holders' reservations back under their own tokens, then set the marker."""
        if check.marker is not None:
            # A rolled-back store holds reservations of jobs that have moved on since: none of them is trusted.
            await self.store.wipe()
        epoch = await self.bump(max(check.marker or 0, check.remembered))
        out = Rebuild(epoch)
        for job_id, token, alloc in holders_to_restore(records):
            res = await self.store.restore(job_id, token, alloc, lease_s)
            if isinstance(res, Conflict):
                out.refused[job_id] = f"{res.reason} {res.key or ''} {res.holder or ''}".strip()
            else:
                out.restored.append((job_id, token, alloc))
        await self.store.set_epoch(epoch)
        return out
