"""The job ledger as every service sees it: facts reported to the job's owner, and the hot view read back.

The placement-solver owns job state (oneplus_placement_solver.owner): it alone folds events into records, publishes
them on the job-event stream and writes the `jobs` KV bucket (the hot view: live jobs and recently finished ones).
Every other service reports what it saw as a fact (`report`) and reads records with `get` / `all`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import NamedTuple

from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as FetchTimeout
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import BadRequestError, KeyNotFoundError, NotFoundError
from nats.js.kv import KeyValue
from oneplus_contracts import (
    FactOutcome,
    IllegalTransition,
    JobEvent,
    JobRecord,
    apply_event,
    parse_job_event,
    subjects,
)
from oneplus_contracts.jobindex import JobIndex, fold_event
from pydantic import ValidationError

from .fencing import is_fence
from .foldwatch import FoldWatch, outcome_applied
from .retry import until_answered
from .telemetry import inject

log = logging.getLogger("oneplus.ledger")


# A direct report's answer comes after one commit of the owner (ms); longer means a paused or cut-off owner.
DELIVER_TIMEOUT_S = 5.0


class NotDelivered(RuntimeError):
    """No job owner answered a direct report (`JobLedger.deliver`), or it asked for the fact again later."""


class Reported(NamedTuple):
    """What became of a reported fact: folded by the owner within the wait; already in the stream (a retry)."""

    folded: bool
    duplicate: bool


class JobLedger:
    def __init__(self, js: JetStreamContext, kv: KeyValue, nc: Client | None = None) -> None:
        self.js = js
        self.kv = kv
        self.nc = nc
        self._watch: FoldWatch | None = None  # made on the first report that waits

    async def get(self, job_id: str) -> tuple[JobRecord | None, int]:
        """The job's record as of the job stream's last event: its last saved state in the hot view, with the job's
        events after it folded in (the owner saves records periodically, not on every transition). The second item
        is the record's job-stream sequence (0: no record). None: no such job, or it has left for the archive."""
        rec: JobRecord | None = None
        with contextlib.suppress(KeyNotFoundError):
            entry = await self.kv.get(job_id)
            if entry.value is not None:
                rec = JobRecord.model_validate_json(entry.value)
        for seq, event, traceparent in await job_events_after(self.js, job_id, rec.seq if rec is not None else 0):
            rec = fold_event(rec, event, seq, traceparent) or rec
        return rec, rec.seq if rec is not None else 0

    async def publish(self, event: JobEvent, traceparent: str | None = None) -> None:
        headers = {"Nats-Msg-Id": event.event_id}
        if traceparent:
            headers["traceparent"] = traceparent
        else:
            inject(headers)
        await self.js.publish(
            subjects.job_event(event.job_id, event.type),
            event.model_dump_json().encode(),
            headers=headers,
            stream=subjects.JOBS_STREAM,
        )

    async def report(self, event: JobEvent, traceparent: str | None = None, *, wait_s: float = 0.0) -> Reported:
        """Report a fact about a job to its owner (the placement-solver), which folds it in order and publishes the
        job event, or refuses it. Every service but the owner changes job state this way.

        With `wait_s`, wait (no polling: one subscription per event type, shared by every wait, `FoldWatch`) up to
        that long for the owner to say it folded the fact and wrote the record to the hot view, so that a read right
        after sees it; a refused fact ends the wait at once (`folded` False). The fact is stored either way and
        folded when the owner gets to it. A fact whose event id the stream already holds (within its duplicate
        window) is not stored again: `duplicate`, and nothing is waited for."""
        headers = {"Nats-Msg-Id": event.event_id}
        if traceparent:
            headers["traceparent"] = traceparent
        else:
            inject(headers)
        fut: asyncio.Future[bool] | None = None
        folded = None
        if wait_s > 0 and self.nc is not None:
            headers[subjects.AWAIT_FOLD_HEADER] = "1"
            if FoldWatch.watchable(event.job_id):
                if self._watch is None:
                    self._watch = FoldWatch(self.nc)
                fut = await self._watch.expect(event.job_id, event.type)
            else:  # an id a wildcard cannot match: a subscription of its own
                folded = await self.nc.subscribe(subjects.fact_outcome(event.job_id, event.type), max_msgs=1)
        try:
            ack = await self.js.publish(
                subjects.job_fact(event.job_id, event.type),
                event.model_dump_json().encode(),
                headers=headers,
                stream=subjects.FACTS_STREAM,
            )
            if ack.duplicate:
                return Reported(folded=False, duplicate=True)
            if fut is None and folded is None:
                return Reported(folded=False, duplicate=False)
            try:
                if fut is not None:
                    applied = await asyncio.wait_for(asyncio.shield(fut), timeout=wait_s)
                else:
                    assert folded is not None
                    applied = bool(outcome_applied((await folded.next_msg(timeout=wait_s)).data))
                return Reported(folded=applied, duplicate=False)
            except (TimeoutError, FetchTimeout):
                log.warning("%s of %s: not folded by the job owner within %.1f s", event.type, event.job_id, wait_s)
                return Reported(folded=False, duplicate=False)
        finally:
            if fut is not None and self._watch is not None:
                self._watch.forget(event.job_id, event.type, fut)
            if folded is not None:
                with contextlib.suppress(Exception):
                    await folded.unsubscribe()

    async def deliver(
        self, event: JobEvent, traceparent: str | None = None, *, timeout: float = DELIVER_TIMEOUT_S
    ) -> Reported:
        """Send a fact straight to the job owner (core NATS request: no JetStream append) and wait for its answer,
        which comes once the fact's event is in the job stream, or the fact was refused (`folded` False). Raises
        `NotDelivered` when no owner answered it (none running, a takeover, a timeout) or the owner asked for it again
        later: the caller keeps the fact (the executor's durable outbox) and sends it again. A fact sent twice is
        folded once: the job stream drops an event id it holds (its duplicate window), the owner refuses the rest."""
        if self.nc is None:
            raise NotDelivered("no NATS connection to send a fact to the job owner")
        headers: dict[str, str] = {}
        if traceparent:
            headers["traceparent"] = traceparent
        else:
            inject(headers)
        try:
            reply = await self.nc.request(
                subjects.job_report(event.job_id, event.type),
                event.model_dump_json().encode(),
                timeout=timeout,
                headers=headers,
            )
        except (NoRespondersError, FetchTimeout, TimeoutError) as exc:
            raise NotDelivered(f"{event.type} of {event.job_id}: no job owner answered ({type(exc).__name__})") from exc
        if (reply.headers or {}).get(subjects.RETRY_HEADER):
            raise NotDelivered(f"{event.type} of {event.job_id}: the job owner asks again later: {reply.data.decode()}")
        try:
            outcome = FactOutcome.model_validate_json(reply.data)
        except ValidationError as exc:
            raise NotDelivered(f"{event.type} of {event.job_id}: unreadable answer from the job owner") from exc
        return Reported(folded=outcome.applied, duplicate=False)

    async def unfolded(self, job_id: str) -> JobRecord | None:
        """The record a job will have once the owner folds its acceptance, while that fact still waits (an owner that
        is behind or down): a show or a cancel right after a submission finds the job either way."""
        try:
            msg = await self.js.get_last_msg(subjects.FACTS_STREAM, subjects.job_fact(job_id, "accepted"))
            return apply_event(None, parse_job_event(msg.data or b""))
        except (NotFoundError, BadRequestError, ValidationError, IllegalTransition):
            return None

    async def all(self) -> list[JobRecord]:
        """Every job's current record in the hot view (`hot_index`)."""
        return list(await hot_index(self.js))


async def job_events_after(js: JetStreamContext, job_id: str, seq: int) -> list[tuple[int, JobEvent, str | None]]:
    """The job's events in the job stream after `seq`, in order: (sequence, event, traceparent). One stream request
    an event and one more (next by subject, answered by the stream leader, so a read after a commit sees it)."""
    out: list[tuple[int, JobEvent, str | None]] = []
    subject = subjects.job_event(job_id, "*")
    at = seq + 1
    while True:
        try:
            msg = await js.get_msg(subjects.JOBS_STREAM, seq=at, subject=subject, next=True)
        except NotFoundError:
            return out
        at = int(msg.seq or at) + 1
        try:
            event = parse_job_event(msg.data or b"")
        except ValidationError:
            continue
        out.append((at - 1, event, (msg.headers or {}).get("traceparent")))


async def hot_index(js: JetStreamContext, *, keep_finished: bool = True, timeout: float = 30.0) -> JobIndex:
    """The hot view as of now: the records the job owner last saved in the `jobs` bucket, with the job stream after
    the projected sequence folded in (the owner saves records periodically; every event up to that sequence is in a
    saved record or in the archive). Its `last_seq` is where a follower of the job stream goes on from.

    Read again from the start while JetStream answers 503 (a stream leader being elected), up to `timeout`."""
    return await until_answered(lambda: _hot_index(js, keep_finished), "reading the hot view", timeout)


async def _hot_index(js: JetStreamContext, keep_finished: bool) -> JobIndex:
    # The saved sequence before the records: a save between the two reads may archive a job and purge its key after
    # the listing saw its live record, and a sequence read after that save would skip the event that ended it (a
    # follower replica then held a finished job's GPUs). Read first, it can only make the replay longer.
    start = await projected_seq(await js.key_value(subjects.SOLVER_STATE_KV))
    index = JobIndex.of(
        (JobRecord.model_validate_json(v) for v in await latest_values(js, subjects.JOBS_KV)),
        keep_finished=keep_finished,
    )
    index.last_seq = max(index.last_seq, start)
    for at, data, headers in await read_stream(js, subjects.JOBS_STREAM, start + 1):
        try:
            event = parse_job_event(data)
        except ValidationError:
            index.last_seq = max(index.last_seq, at)
            continue
        index.apply(event, at, headers.get("traceparent"))
    return index


_DELETED = {"DEL", "PURGE"}
_MARKERS = {"MaxAge", "Purge", "Remove"}
_FETCH_BATCH = 512


async def latest_values(js: JetStreamContext, bucket: str, timeout: float = 10.0) -> list[bytes]:
    """The latest value of every key of a KV bucket (deleted keys left out), in key order."""
    return [value for _, value in await latest_items(js, bucket, timeout)]


async def latest_items(js: JetStreamContext, bucket: str, timeout: float = 10.0) -> list[tuple[str, bytes]]:
    """(key, latest value) of every key of a KV bucket (deleted keys left out), in key order.

    Read again from the start while JetStream answers 503 (a stream leader being elected), up to `timeout`.
    """
    return [(key, value) for key, value, _ in await latest_entries(js, bucket, timeout)]


async def latest_entries(js: JetStreamContext, bucket: str, timeout: float = 10.0) -> list[tuple[str, bytes, int]]:
    """As `latest_items`, each with its revision (the stream sequence of the value)."""
    return await until_answered(lambda: _latest_items(js, bucket, timeout), f"reading KV bucket {bucket!r}", timeout)


async def _latest_items(js: JetStreamContext, bucket: str, timeout: float) -> list[tuple[str, bytes, int]]:
    """One read of `latest_entries`.

    An ephemeral pull consumer, not `kv.watchall()`: the push watcher signals "all current values
    delivered" from consumer info, which can answer before the pushed values reach the client, and
    then a reader sees an empty bucket. A pull consumer delivers nothing until asked, so the pending
    count it reports at creation is exactly what the read has to collect.
    """
    stream = f"KV_{bucket}"
    config = ConsumerConfig(
        filter_subject=f"$KV.{bucket}.>",
        deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
        ack_policy=AckPolicy.NONE,
        inactive_threshold=5.0,  # a reader that dies leaves no consumer behind for long
        mem_storage=True,
    )
    info = await js.add_consumer(stream, config=config)  # its reply carries the pending count: no second request
    sub = await js.pull_subscribe_bind(consumer=info.name, stream=stream)
    prefix = len(f"$KV.{bucket}.")
    values: dict[str, tuple[bytes, int]] = {}
    try:
        # Read what was there when the consumer was made, and no further: on a busy bucket new writes
        # would keep the pending count above zero forever.
        todo = remaining = info.num_pending or 0
        deadline = asyncio.get_running_loop().time() + timeout
        while todo > 0 and remaining > 0:
            try:
                msgs = await sub.fetch(batch=min(todo, _FETCH_BATCH), timeout=1.0)
            except (FetchTimeout, TimeoutError):  # nats-py's fetch raises either
                if asyncio.get_running_loop().time() > deadline:
                    raise TimeoutError(f"reading KV bucket {bucket!r}: no values for {timeout:g}s") from None
                # A value overwritten after the consumer was made is gone from the stream; ask what is left.
                remaining = (await sub.consumer_info()).num_pending or 0
                continue
            for msg in msgs:
                remaining = msg.metadata.num_pending or 0
                if is_fence(msg.subject):
                    continue  # the job owner's epoch (oneplus_bus.fencing), not an entry
                key = msg.subject[prefix:]
                if _removed(msg.headers or {}):
                    values.pop(key, None)
                else:
                    values[key] = (msg.data, msg.metadata.sequence.stream)
            todo -= len(msgs)
    finally:
        await sub.unsubscribe()
        with contextlib.suppress(Exception):  # best effort: the inactivity threshold removes it anyway
            await js.delete_consumer(stream, info.name)
    return [(k, *values[k]) for k in sorted(values)]


def _removed(headers: dict[str, str]) -> bool:
    """A delete or purge marker; nats-server 2.11+ marks a TTL expiry or purge with Nats-Marker-Reason instead."""
    return headers.get("KV-Operation") in _DELETED or headers.get("Nats-Marker-Reason") in _MARKERS


async def read_stream(
    js: JetStreamContext, stream: str, start_seq: int, filter_subject: str | None = None, timeout: float = 10.0
) -> list[tuple[int, bytes, dict[str, str]]]:
    """Every message of `stream` from `start_seq` up to its end when the read began: (sequence, data, headers).

    A restarted service replays what it has not folded yet this way; like `latest_values`, a pull consumer's
    pending count at creation says where the end is, so writes during the replay cannot keep it going.
    """
    config = ConsumerConfig(
        deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
        opt_start_seq=max(1, start_seq),
        ack_policy=AckPolicy.NONE,
        inactive_threshold=5.0,
        mem_storage=True,
        filter_subject=filter_subject,
    )
    info = await js.add_consumer(stream, config=config)
    sub = await js.pull_subscribe_bind(consumer=info.name, stream=stream)
    out: list[tuple[int, bytes, dict[str, str]]] = []
    try:
        todo = info.num_pending or 0
        deadline = asyncio.get_running_loop().time() + timeout
        while todo > 0:
            try:
                msgs = await sub.fetch(batch=min(todo, _FETCH_BATCH), timeout=1.0)
            except (FetchTimeout, TimeoutError):  # nats-py's fetch raises either
                if asyncio.get_running_loop().time() > deadline:
                    raise TimeoutError(f"replaying stream {stream!r}: no messages for {timeout:g}s") from None
                todo = min(todo, (await sub.consumer_info()).num_pending or 0)
                continue
            for msg in msgs:
                if not is_fence(msg.subject):  # the job owner's epoch (oneplus_bus.fencing), not a message to fold
                    out.append((msg.metadata.sequence.stream, msg.data, dict(msg.headers or {})))
            todo -= len(msgs)
    finally:
        await sub.unsubscribe()
        with contextlib.suppress(Exception):
            await js.delete_consumer(stream, info.name)
    return out


async def stream_last_seq(js: JetStreamContext, stream: str) -> int:
    return int((await js.stream_info(stream)).state.last_seq or 0)


# In the `solver_state` bucket: a job-stream sequence up to which every event is in the hot view or the archive.
PROJECTED_SEQ_KEY = "jobs_projected_seq"


async def projected_seq(state_kv: KeyValue) -> int:
    """Where a reader of the hot view resumes the job stream when the view no longer holds the latest sequence (its
    jobs were archived): without it an emptied hot view would mean replaying the stream from its first event."""
    try:
        entry = await state_kv.get(PROJECTED_SEQ_KEY)
    except KeyNotFoundError:
        return 0
    return int(entry.value or b"0")
