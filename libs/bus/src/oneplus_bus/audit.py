"""The reservation audit on JetStream: what the solver reserved, put back and freed, beyond a reset of Redis.

Redis' own history stream is exact (written by the same script as the reservation) but lives in the store a reset
erases; this one is written by the solver right after each store operation, in the order it made them, and replays
into the same check (`oneplus_reservations.check_history`), in the store's order (`store_at`). A solver killed
between a store operation and its audit entry leaves that entry out: a lost reserve makes the check see less; a
lost release would read as a double use when the GPUs are taken again, so the next owner writes the store
history's recent releases again (`ReservationAuditLog.catch_up_releases`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Literal

from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import DeliverPolicy, PubAck
from nats.js.errors import NotFoundError
from oneplus_contracts import Allocation, RankPlacement, ReservationAudit, subjects
from oneplus_reservations import HistoryEntry, KeySpace, store_order

from oneplus_bus.acks import wait_acks

AuditOp = Literal["reserve", "restore", "release"]


class ReservationAuditLog:
    """The solver's writer: entries are published without waiting; `flush` waits for JetStream's acks."""

    def __init__(self, js: JetStreamContext) -> None:
        self.js = js
        self.epoch = 0
        self._pending: list[asyncio.Future[PubAck]] = []

    async def record(
        self, op: str, job_id: str, token: int, alloc: Allocation | None = None, reason: str = "", at: str = ""
    ) -> None:
        entry = ReservationAudit(
            op=op,
            job_id=job_id,
            token=token,
            ranks=list(alloc.ranks) if alloc is not None else [],
            reason=reason,
            epoch=self.epoch,
            ts=time.time(),
            store_at=at,
        )
        suffix = f"-{self.epoch}" if op == "restore" else ""
        fut = await self.js.publish_async(
            subjects.RESERVATION_AUDIT,
            entry.model_dump_json().encode(),
            headers={"Nats-Msg-Id": f"{op}-{job_id}-{token}{suffix}"},
            stream=subjects.AUDIT_STREAM,
        )
        self._pending.append(fut)
        if len(self._pending) >= 256:
            await self.flush()

    async def flush(self) -> None:
        pending, self._pending = self._pending, []
        await wait_acks(pending)

    async def catch_up_releases(self, history: Sequence[HistoryEntry], epoch: int) -> int:
        """Write the store history's releases into the audit again, each at its place in the store's order.

        A solver killed between a release and its entry's delivery leaves the audit holding GPUs the store freed,
        and a later reserve of them reads as a double use. Releases are idempotent in the replay and deduplicated
        by JetStream (same message id), so writing one the audit already has changes nothing."""
        n = 0
        for e in history:
            if e.op == "release":
                await self.record("release", e.job_id, e.token, reason="caught up from the store's history",
                                  at=f"{epoch}:{e.entry_id}")  # fmt: skip
                n += 1
        await self.flush()
        return n


async def last_audit_ts(js: JetStreamContext) -> float | None:
    """When the newest audit entry was written (its writer's clock); None when the audit is empty."""
    try:
        msg = await js.get_last_msg(subjects.AUDIT_STREAM, subjects.RESERVATION_AUDIT)
    except NotFoundError:
        return None
    return ReservationAudit.model_validate_json(msg.data or b"{}").ts


async def read_audit(nc: Client, *, timeout: float = 5.0) -> list[ReservationAudit]:
    """Every audit entry kept, in order (an ordered consumer from the first)."""
    js = nc.jetstream()
    info = await js.stream_info(subjects.AUDIT_STREAM)
    last = info.state.last_seq
    out: list[ReservationAudit] = []
    if info.state.messages == 0:
        return out
    sub = await js.subscribe(
        subjects.RESERVATION_AUDIT,
        ordered_consumer=True,
        deliver_policy=DeliverPolicy.ALL,
        stream=subjects.AUDIT_STREAM,
    )
    try:
        while True:
            msg = await sub.next_msg(timeout=timeout)
            out.append(ReservationAudit.model_validate_json(msg.data))
            if msg.metadata.sequence.stream >= last:
                return out
    finally:
        await sub.unsubscribe()


def store_ordered(entries: Sequence[ReservationAudit]) -> list[ReservationAudit]:
    """The entries in the store's order: by `store_at`, an entry without one right after the entry it followed.

    One solver writes its entries in the order of its store operations; several replicas' entries interleave as
    their connections deliver them, so a release by one can land after the reserve by another that it made
    possible. Sorting is stable, so one writer's order is kept wherever the store's is unknown."""
    keyed: list[tuple[tuple[int, int, int], int, ReservationAudit]] = []
    key = (-1, 0, 0)
    for n, e in enumerate(entries):
        key = store_order(e.store_at) or key
        keyed.append((key, n, e))
    return [e for _, _, e in sorted(keyed, key=lambda k: (k[0], k[1]))]


def audit_history(entries: Sequence[ReservationAudit], cluster: str = "default") -> list[HistoryEntry]:
    """The entries as reservation history, for `check_history`: a release frees what its (job, token) held."""
    ks = KeySpace(cluster)
    held: dict[tuple[str, int], tuple[tuple[str, int], ...]] = {}
    out: list[HistoryEntry] = []
    for n, e in enumerate(store_ordered(entries)):
        if e.op == "release":
            slots = held.pop((e.job_id, e.token), ())
        else:
            slots = _slots(ks, e.ranks)
            held[(e.job_id, e.token)] = slots
        out.append(HistoryEntry(e.op, e.job_id, e.token, slots, f"audit-{n + 1}"))
    return out


def _slots(ks: KeySpace, ranks: Sequence[RankPlacement]) -> tuple[tuple[str, int], ...]:
    gpus = [
        (ks.gpu(r.node, g) if r.gpu_milli == 0 else ks.share(r.node, g), r.gpu_milli) for r in ranks for g in r.gpus
    ]
    return tuple(gpus + [(ks.mig(r.node, u), 0) for r in ranks for u in r.mig])
