"""The reservation audit on JetStream: what the solver reserved, put back and freed, beyond a reset of Redis.

Redis' own history stream is exact (written by the same script as the reservation) but lives in the store a reset
erases. The audit that outlives it rides on the job transitions (`transition_audit`): a gang's hold begins with the
`placed` event that records its reservation (job, token, ranks) and ends with the event that takes its record out of
the holding states (finished, requeued, ...), in the job stream, with no append of its own. That order is the
store's for what matters: the owner commits an attempt's end *before* it frees the reservation in Redis, and a
`placed` is committed only *after* its reservation was granted, so a release that made a reserve possible always
comes before that reserve's `placed` in the one stream the owner writes, whichever replica reserved.

The ONEPLUS_AUDIT stream keeps what is not a transition: `restore` (the reservations put back into Redis after a
reset, from the records) and entries a solver before this change wrote (`reserve`/`release`, replayed in the store's
order, `store_at`). `read_audit` merges both by time; the replay (`audit_history`) never lets a restore bring back a
hold the job stream had ended, nor counts a second reserve of one (job, token) as a double use.
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections.abc import Iterable, Sequence
from typing import Literal

from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import DeliverPolicy, PubAck
from oneplus_bus.acks import wait_acks
from oneplus_bus.fencing import EPOCH_HEADER, is_fence
from oneplus_contracts import (
    Allocation,
    IllegalTransition,
    JobEvent,
    JobRecord,
    RankPlacement,
    ReservationAudit,
    apply_event,
    parse_job_event,
    subjects,
)
from oneplus_contracts.jobindex import HOLDING_STATES
from oneplus_reservations import HistoryEntry, KeySpace, store_order

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


async def read_audit(nc: Client, *, timeout: float = 5.0) -> list[ReservationAudit]:
    """Every audit entry: the job transitions' (`transition_audit`) and the ONEPLUS_AUDIT stream's, merged by time."""
    derived = transition_audit(await _read_ordered(nc, subjects.JOBS_STREAM, subjects.JOB_EVENTS_ALL, timeout))
    recorded = [
        ReservationAudit.model_validate_json(data)
        for data, _, _ in await _read_ordered(nc, subjects.AUDIT_STREAM, subjects.RESERVATION_AUDIT, timeout)
    ]
    return list(heapq.merge(derived, recorded, key=lambda e: e.ts))


async def _read_ordered(
    nc: Client, stream: str, subject: str, timeout: float
) -> list[tuple[bytes, float, dict[str, str]]]:
    """Every message of `stream` in order (fence messages left out): (data, JetStream's timestamp, headers)."""
    js = nc.jetstream()
    info = await js.stream_info(stream)
    last = info.state.last_seq
    out: list[tuple[bytes, float, dict[str, str]]] = []
    if info.state.messages == 0:
        return out
    sub = await js.subscribe(subject, ordered_consumer=True, deliver_policy=DeliverPolicy.ALL, stream=stream)
    try:
        while True:
            msg = await sub.next_msg(timeout=timeout)
            if not is_fence(msg.subject):
                ts = msg.metadata.timestamp.timestamp() if msg.metadata.timestamp else 0.0
                out.append((msg.data, ts, dict(msg.headers or {})))
            if msg.metadata.sequence.stream >= last:
                return out
    finally:
        await sub.unsubscribe()


def _hold(rec: JobRecord | None) -> tuple[int, Allocation] | None:
    """The reservation `rec` holds (token and allocation), as the job index counts holders; None when none."""
    if rec is None or rec.state not in HOLDING_STATES or rec.allocation is None or rec.token is None:
        return None
    return rec.token, rec.allocation


def transition_audit(messages: Iterable[tuple[bytes, float, dict[str, str]]]) -> list[ReservationAudit]:
    """The reserves and releases the job stream's events are, in its order: (data, timestamp, headers) of each
    event. Folded with the owner's own `apply_event`: a hold begins when a record enters the holding states with a
    token and ends when it leaves them (or its token changes); an event that does not apply is skipped, as the
    owner skipped it."""
    records: dict[str, JobRecord] = {}
    out: list[ReservationAudit] = []
    for data, ts, headers in messages:
        event: JobEvent = parse_job_event(data)
        before = records.get(event.job_id)
        try:
            after = apply_event(before, event)
        except IllegalTransition:
            continue
        records[event.job_id] = after
        old, new = _hold(before), _hold(after)
        if old == new or (old is not None and new is not None and old[0] == new[0] and old[1].ranks == new[1].ranks):
            continue  # the same hold (a hold whose GPUs change under one token is released and taken again)
        epoch = int(headers.get(EPOCH_HEADER) or 0)
        if old is not None:
            out.append(ReservationAudit(op="release", job_id=event.job_id, token=old[0], reason=event.type,
                                        epoch=epoch, ts=ts))  # fmt: skip
        if new is not None:
            out.append(ReservationAudit(op="reserve", job_id=event.job_id, token=new[0], ranks=list(new[1].ranks),
                                        reason=event.type, epoch=epoch, ts=ts))  # fmt: skip
    return out


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
    ended: set[tuple[str, int]] = set()  # holds released: a restore read after its release does not bring one back
    out: list[HistoryEntry] = []
    for n, e in enumerate(store_ordered(entries)):
        holder = (e.job_id, e.token)
        op = e.op
        if op == "release":
            slots = held.pop(holder, ())
            ended.add(holder)
        elif op == "restore" and holder in ended:
            continue
        else:
            # A hold reserved again (its transition and an older solver's own entry, both kept) is no second use.
            op = "restore" if op == "reserve" and holder in held else op
            slots = _slots(ks, e.ranks)
            held[holder] = slots
        out.append(HistoryEntry(op, e.job_id, e.token, slots, f"audit-{n + 1}"))
    return out


def _slots(ks: KeySpace, ranks: Sequence[RankPlacement]) -> tuple[tuple[str, int], ...]:
    gpus = [
        (ks.gpu(r.node, g) if r.gpu_milli == 0 else ks.share(r.node, g), r.gpu_milli) for r in ranks for g in r.gpus
    ]
    return tuple(gpus + [(ks.mig(r.node, u), 0) for r in ranks for u in r.mig])
