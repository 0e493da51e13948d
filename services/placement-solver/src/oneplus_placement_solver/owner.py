"""The one writer of job records: folds facts and the solver's own decisions, in order, into the job working set.

Other services report facts (`JobLedger.report`, on `oneplus.fact.job.<job>.<type>`); the owner drains them in
batches, folds each with `apply_event`, and publishes only what applied on the job-event stream: that append is the
transition's one durable write. Records are saved periodically (`save`, each expire tick): a live job's latest
record to the `jobs` KV bucket, a finished job's to the archive, then the job-stream sequence they reach
(`solver_state`). Readers and a restarted owner list the saved records and fold the job stream after that sequence
(`oneplus_bus.ledger.hot_index`; one job: `JobLedger.get`): each event applies only to a record whose sequence is
below its own. A fact that does not apply is refused and counted, never half-applied. Finished jobs stay in the
owner's index `min_age_s` (a late event still folds into them), then leave it.
A commit whose acknowledgements did not all come back (the bus dropped) may have stored
some of its events: before the next commit the owner reads the stream after its last sequence and folds what is
there, so its records never lag the stream they publish to.

With several solver replicas only the one holding the owner lease commits (`guard` refuses a commit otherwise);
the others `follow()`: they list the hot view and fold the job stream into the same index, read-only, and report
what they decide as facts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import TimeoutError as FetchTimeout
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, PubAck
from nats.js.errors import NotFoundError
from nats.js.kv import KeyValue
from oneplus_bus.acks import PUBLISH_ACK_TIMEOUT_S
from oneplus_bus.fencing import JOBS_KV_STREAM, Deposed, OwnerFence
from oneplus_bus.informer import StreamTail
from oneplus_bus.ledger import PROJECTED_SEQ_KEY, hot_index, latest_values, projected_seq, read_stream
from oneplus_bus.retry import raise_if_cancelling, until_answered
from oneplus_bus.telemetry import inject
from oneplus_contracts import (
    FactOutcome,
    IllegalTransition,
    JobEvent,
    JobPlaced,
    JobRecord,
    apply_event,
    parse_job_event,
    subjects,
)
from oneplus_contracts.array_facts import expand_fact
from oneplus_contracts.jobindex import HOLDING_STATES, FinishedJob, GpuSlots, JobIndex
from oneplus_stores.archive import JobArchive
from prometheus_client import CollectorRegistry, Counter
from pydantic import ValidationError

log = logging.getLogger("oneplus.owner")

FACTS_CONSUMER = "job-owner"
FACTS_ACK_WAIT_S = 30.0  # a fact fetched and not acknowledged (its fetcher died) is delivered again this much later
FACT_BATCH = 256
REPLAY_WAIT_S = 30.0  # a replay of the job stream waits out a stream leader election this long
# A batch of direct reports waits at most this long for the facts stored in the stream before it to be folded first.
STREAM_FIRST_WAIT_S = 1.0
HELD_FACT_DELAY_S = 1.0  # a fact about a job not known yet, while an earlier owner's facts come back, waits this much
REST_OF_BATCH_S = 0.05  # the facts pending behind a first one are in the stream already: they come at once
# Hot-view keys purged side by side when finished jobs move to the archive: few, so that the commits' writes to the
# same bucket get their turn between batches (128 at once delayed them by tens of ms).
PURGE_BATCH = 16
# Events folded in one commit at most: an array's fact stands for thousands of tasks, committed this many at a time.
COMMIT_CHUNK = 512
FIRST_CHUNK = 64


# A live record is saved once it has not changed for this long: a job that ends sooner goes straight to the archive,
# and a gang's placed, starting and running, seconds apart, are one write.
SAVE_SETTLED_S = 2.0
SAVE_WITHIN_S = 10.0  # ... or once it has been unsaved this long (one that changes all the time)


@dataclass(frozen=True)
class Unsaved:
    first_seq: int  # the record's first event not saved
    since: float  # when it was first left unsaved (monotonic)
    changed: float  # when it last changed


@dataclass(frozen=True)
class Applied:
    event: JobEvent
    before: JobRecord | None
    record: JobRecord


OnApplied = Callable[[Sequence[Applied]], Awaitable[None]]
Answer = Callable[[Sequence[JobRecord | None]], Awaitable[None]]
OnFollowed = Callable[[JobEvent, JobRecord], Awaitable[None]]


class NotOwner(RuntimeError):
    """This replica does not hold the owner lease (now): it must not write job records."""


class JobOwner:
    def __init__(
        self,
        js: JetStreamContext,
        archive: JobArchive,
        *,
        min_age_s: float,
        metrics: CollectorRegistry | None = None,
        state_kv: KeyValue | None = None,
        nc: Client | None = None,
        me: str = "owner",
    ) -> None:
        self.js = js
        self.nc = nc  # where a fact's outcome is told to a reporter that waits for it (None: nobody is told)
        self.archive = archive
        self.state_kv = state_kv  # where the projected sequence is kept (PROJECTED_SEQ_KEY)
        self.saved_seq = 0
        self.min_age_s = min_age_s
        self.index = JobIndex()
        self.stale = False  # a commit failed after publishing: the stream may hold events the index lacks
        self._cut_off: list[asyncio.Future[PubAck]] = []  # that commit's publishes whose outcome is not known yet
        self.unprojected: dict[str, JobRecord] = {}  # folded, but not saved yet (`save`)
        self._unsaved: dict[str, Unsaved] = {}  # of each of those: since when, and from which event
        self._lock = asyncio.Lock()
        self._save_lock = asyncio.Lock()
        # Jobs whose record is in the `jobs` bucket (listed at bootstrap, or saved since): purged once archived.
        self.in_bucket: set[str] = set()
        self._listeners: list[OnApplied] = []
        # Awaited before every commit: raises NotOwner unless this replica holds the owner lease.
        self.guard: Callable[[], Awaitable[None]] | None = None
        self._tail: StreamTail | None = None
        # Until then a record may lag what its nodes reported: an earlier owner died holding facts it had fetched.
        self.facts_back_at = 0.0
        self.refused = Counter(
            "oneplus_job_facts_refused", "Facts that did not apply to the job's record", ["type"], registry=metrics
        )
        self.applied = Counter(
            "oneplus_job_events_applied", "Events folded into job records", ["type"], registry=metrics
        )
        # Every write of this owner carries its epoch's precondition, checked by the server (oneplus_bus.fencing).
        self.fence = OwnerFence(js, nc if nc is not None else js._nc, me, metrics)  # nats-py: no public accessor
        self.fence.on_deposed = self._deposed
        # Called once when the server refused a write: a newer owner fenced the streams (the solver steps down).
        self.on_deposed: Callable[[], None] | None = None

    def _deposed(self) -> None:
        """A newer owner fenced the streams: nothing this owner holds unwritten may be written any more."""
        log.warning("job owner %s: deposed by a newer owner (the server refused its writes); it stops writing",
                    self.fence.me)  # fmt: skip
        self.unprojected.clear()
        self._unsaved.clear()
        self.stale = False
        self._cut_off = []
        if self.on_deposed is not None:
            self.on_deposed()

    def on_applied(self, fn: OnApplied) -> None:
        """`fn(applied)` runs after each commit, outside the commit (it may commit more)."""
        self._listeners.append(fn)

    # -- bootstrap -------------------------------------------------------------------------------------------------
    async def bootstrap(self, epoch: int | None = None) -> int:
        """Fence the streams at `epoch` (the owner lease's revision; None: above the newest epoch there), then list
        the hot view once and replay the job stream after it; returns how many events were replayed. Fenced first,
        so that whatever an earlier owner landed is in what is read, and nothing of it lands after."""
        await self.fence.establish(epoch)
        records = [JobRecord.model_validate_json(v) for v in await latest_values(self.js, subjects.JOBS_KV)]
        self.index = JobIndex.of(records)
        self.in_bucket = {rec.job_id for rec in records}
        # Not after the highest record: the last commit's other records may not have been projected.
        start = self.index.last_seq
        if (state_kv := self.state_kv) is not None:
            self.saved_seq = await until_answered(
                lambda: projected_seq(state_kv), "reading the saved sequence", REPLAY_WAIT_S
            )
            start = self.saved_seq
            self.index.last_seq = max(self.index.last_seq, self.saved_seq)
        replayed = await self._replay_after(start)
        log.info(
            "job owner: %d records, %d events replayed, at sequence %d", len(records), replayed, self.index.last_seq
        )
        self.facts_back_at = await self._stranded_facts_back_at()
        return replayed

    async def _stranded_facts_back_at(self) -> float:
        """When the facts an earlier owner fetched and never acknowledged will have been delivered again (now if it
        left none): JetStream gives them back only `FACTS_ACK_WAIT_S` after they went out."""
        try:
            info = await self.js.consumer_info(subjects.FACTS_STREAM, FACTS_CONSUMER)
        except NotFoundError:
            return 0.0
        except Exception as exc:  # not answered (a stream leader election): assume some are out
            raise_if_cancelling()
            log.warning(
                "job owner: facts consumer not answered (%s); assuming facts out for %.0f s", exc, FACTS_ACK_WAIT_S
            )
            return time.time() + FACTS_ACK_WAIT_S
        if not info.num_ack_pending:
            return 0.0
        log.info(
            "job owner: %d fact(s) fetched by an earlier owner come back within %.0f s",
            info.num_ack_pending,
            FACTS_ACK_WAIT_S,
        )
        return time.time() + FACTS_ACK_WAIT_S

    def facts_caught_up(self, now: float) -> bool:
        """Whether every fact reported before this owner began can have been folded: records may lag their nodes
        until then, so a reservation missing from the store says nothing yet about its job."""
        return now >= self.facts_back_at

    async def follow(self, on_event: OnFollowed) -> None:
        """Read-only: list the hot view, then fold the job stream's events into the index as the owner publishes
        them (`on_event(event, record)` after each that applied). A gap lists again."""

        async def relist() -> int:
            self.index = await hot_index(self.js)
            return self.index.last_seq

        async def fold(seq: int, subject: str, data: bytes, headers: dict[str, str]) -> None:
            try:
                event = parse_job_event(data)
            except ValidationError:
                return
            rec = self.index.apply(event, seq, headers.get("traceparent"))
            if rec is not None:
                await on_event(event, rec)

        await self.unfollow()
        self._tail = StreamTail(
            self.js, subjects.JOBS_STREAM, subjects.JOB_EVENTS_ALL, fold, relist=relist, whole=True, name="follower"
        )
        self._tail.start(await relist())

    @property
    def following(self) -> bool:
        """Whether this index follows the owner's job stream (`follow`)."""
        return self._tail is not None

    async def unfollow(self) -> None:
        if self._tail is not None:
            await self._tail.stop()
            self._tail = None

    async def _replay_after(self, seq: int) -> int:
        """Fold the job stream's events after `seq` into the index (each only where it is newer than the record) and
        project what changed; how many applied."""
        replayed = 0
        changed: dict[str, JobRecord] = {}
        # A stream leader being elected (a server killed) answers 503 for a few seconds: read again, not fail.
        rows = await until_answered(
            lambda: read_stream(self.js, subjects.JOBS_STREAM, seq + 1), "replaying the job stream", REPLAY_WAIT_S
        )
        for at, data, headers in rows:
            try:
                event = parse_job_event(data)
            except ValidationError:
                log.error("job stream message %d is not a job event; skipped", at)
                continue
            rec = self.index.apply(event, at, headers.get("traceparent"))
            if rec is not None:
                replayed += 1
                changed[rec.job_id] = rec
        self._project(list(changed.values()), first_seq=seq + 1)
        return replayed

    # -- commits ---------------------------------------------------------------------------------------------------
    async def commit(
        self,
        *events: JobEvent,
        traceparents: Sequence[str | None] = (),
        awaited: Sequence[bool] = (),
        answer: Answer | None = None,
    ) -> list[JobRecord | None]:
        """Fold, publish and project `events` in order; the record of each, or None where it did not apply.
        `awaited[i]`: the reporter of `events[i]` waits to hear what became of it (`_tell_outcomes`).
        `answer(out)`: runs once the commit is durable, before the listeners react (direct reports' replies)."""
        try:
            async with self._lock:
                applied, out = await self._commit_locked(events, traceparents, awaited)
        except Deposed as exc:
            raise NotOwner(str(exc)) from exc
        if any(awaited):
            # Before the listeners: their reactions (settling ended gangs, cancelling) take round trips of their own.
            await self._tell_outcomes(events, out, awaited)
        if answer is not None:
            await answer(out)
        await self._notify(applied)
        return out

    async def _commit_locked(
        self, events: Sequence[JobEvent], traceparents: Sequence[str | None], awaited: Sequence[bool] = ()
    ) -> tuple[list[Applied], list[JobRecord | None]]:
        if self.guard is not None:
            await self.guard()
        await self.fence.ensure()
        if self.stale:
            await self._settle_cut_off()
            caught = await self._replay_after(self.index.last_seq)
            self.stale = False
            log.warning("job owner: %d event(s) of a commit cut off by the bus were in the stream; folded", caught)
        staged: list[tuple[int, JobEvent, JobRecord | None, JobRecord, asyncio.Future[PubAck]]] = []
        out: list[JobRecord | None] = [None] * len(events)
        # Records folded in this batch, so two events of one job in one batch see each other.
        folded: dict[str, JobRecord | None] = {}
        claimed = GpuSlots()  # the GPUs this batch's placements take, beside those the index's holders hold
        ended: set[str] = set()  # holders whose attempt an earlier event of this batch ends
        for i, event in enumerate(events):
            before = folded[event.job_id] if event.job_id in folded else self.index.get(event.job_id)
            try:
                new = apply_event(before, event)
            except IllegalTransition as exc:
                self.refused.labels(event.type).inc()
                log.info("refused %s of %s: %s", event.type, event.job_id, exc)
                continue
            if isinstance(event, JobPlaced):
                # The store granted it, but the store forgets a hold whose lease ran out before its end is recorded:
                # the record, not the store, says whether the GPUs are free (reconcile frees such a reservation).
                clash = self.index.slots.conflict(event.job_id, event.allocation, claimed, ended=ended)
                if clash is not None:
                    self.refused.labels(event.type).inc()
                    log.warning("refused placed of %s (token %d): %s", event.job_id, event.token, clash)
                    continue
                claimed.hold(event.job_id, event.allocation)
            elif new.state not in HOLDING_STATES:
                ended.add(event.job_id)  # its GPUs are free for a placement later in this batch
                claimed.release(event.job_id)
            tp = (traceparents[i] if i < len(traceparents) else None) or new.traceparent
            if tp and new.traceparent is None:
                new = new.model_copy(update={"traceparent": tp})
            headers = {"Nats-Msg-Id": event.event_id}
            if new.traceparent:
                headers["traceparent"] = new.traceparent
            else:
                inject(headers)
            try:
                fut = await self.fence.publish(
                    subjects.JOBS_STREAM,
                    subjects.job_event(event.job_id, event.type),
                    event.model_dump_json().encode(),
                    headers,
                )
            except BaseException:
                # The events sent before this one may be stored (nats-py flushes its buffer once reconnected):
                # catch up from the stream, once they landed, before folding anything more.
                self.stale = True
                self._cut_off = [f for *_, f in staged]
                raise
            folded[event.job_id] = new
            staged.append((i, event, before, new, fut))
        applied: list[Applied] = []
        records: list[JobRecord] = []
        # Bounded: an ack lost with a dropped connection would hold the owner's lock for ever. Nothing is folded
        # into the index before every ack is in; a retry's publish is dropped as a duplicate by its event id.
        try:
            acks = await self.fence.acks(subjects.JOBS_STREAM, [fut for *_, fut in staged])
        except BaseException:
            # Some may be stored: catch up from the stream before folding anything more (a deposed owner folds no more).
            self.stale = bool(staged) and not self.fence.deposed
            raise
        rebased: set[str] = set()  # jobs of this batch with an event the stream already held
        for (i, event, before, new, _), ack in zip(staged, acks, strict=True):
            if event.job_id in rebased:
                # Folded on top of a duplicate that was not applied: fold again on what the record really is.
                before = self.index.get(event.job_id)
                try:
                    new = apply_event(before, event).model_copy(update={"traceparent": new.traceparent})
                except IllegalTransition as exc:
                    log.error("%s of %s is in the job stream but does not apply: %s", event.type, event.job_id, exc)
                    continue
            elif ack.duplicate and before is None:
                # The stream holds this event and the index does not know the job: a redelivered or retried
                # `accepted` of a job that finished and left the index. Folded, it would run the job again (seen in
                # the multi-host run: a second placed..finished after `finished`). Past the index's last sequence
                # the index missed it instead: the next commit catches up from the stream first.
                self.refused.labels(event.type).inc()
                log.warning("refused %s of %s: the stream already holds %s (sequence %d) and the job is not in the "
                            "index", event.type, event.job_id, event.event_id, ack.seq)  # fmt: skip
                if ack.seq > self.index.last_seq:
                    self.stale = True
                rebased.add(event.job_id)
                continue
            elif ack.duplicate and before is not None and before.seq >= ack.seq:
                # JetStream already held this event id (a decision taken again within the duplicate window) and the
                # record has folded it: folding it twice would make the record differ from the stream.
                self.refused.labels(event.type).inc()
                log.warning("refused %s of %s: the stream already holds %s", event.type, event.job_id, event.event_id)
                rebased.add(event.job_id)
                continue
            rec = new.model_copy(update={"seq": int(ack.seq)})
            out[i] = rec
            self.index.put(rec)
            self.applied.labels(event.type).inc()
            records.append(rec)
            applied.append(Applied(event, before, rec))
        self._project(records)
        return applied, out

    async def _settle_cut_off(self) -> None:
        """Wait (bounded) for the publishes of a commit cut off mid-batch to be stored or refused, so that the
        catch-up reads them: a replay that ran before they landed would leave them unfolded for good."""
        pending, self._cut_off = self._cut_off, []
        if pending:
            await asyncio.wait(pending, timeout=PUBLISH_ACK_TIMEOUT_S)
        for fut in pending:
            if fut.done() and not fut.cancelled():
                fut.exception()  # retrieved: its outcome is read from the stream, not from here
            else:
                fut.cancel()

    def _project(self, records: Sequence[JobRecord], first_seq: int | None = None) -> None:
        """Mark records as not saved yet: a later `save` writes each job's latest record once, however many of its
        transitions came between (its events are the durable record meanwhile; readers fold them, `hot_index`).
        `first_seq`: the first event not saved of each (default: the record's own, its latest)."""
        now = time.monotonic()
        for rec in records:
            self.unprojected[rec.job_id] = rec
            was = self._unsaved.get(rec.job_id)
            first = first_seq if first_seq is not None else rec.seq
            self._unsaved[rec.job_id] = Unsaved(was.first_seq, was.since, now) if was else Unsaved(first, now, now)

    def _due(self, now: float, flush: bool) -> dict[str, JobRecord]:
        """The unsaved records a save writes: finished ones at once (the archive), live ones once unchanged for
        `SAVE_SETTLED_S` (a job that ends within it is never written to the bucket) or unsaved `SAVE_WITHIN_S`."""
        if flush:
            return dict(self.unprojected)
        due: dict[str, JobRecord] = {}
        for job_id, rec in self.unprojected.items():
            u = self._unsaved[job_id]
            if rec.terminal or now - u.changed >= SAVE_SETTLED_S or now - u.since >= SAVE_WITHIN_S:
                due[job_id] = rec
        return due

    async def save(self, *, flush: bool = False) -> int:
        """The periodic state save (slurmctld's state save, client-go's relist point): write each record due
        (`_due`; all with `flush`) once, a finished job's to the archive, then the job-stream sequence up to which
        every event is in a saved record: a restart or a reader lists the saved records and folds the job stream
        after it (`hot_index`). Returns how many records were written.

        The records are written outside the commit lock: a save of a busy second's jobs must not hold the commits.
        The sequence is the one before the first event of any record still unsaved (the index's, when none is), read
        under the lock once the writes are in; a failed write leaves its records for the next save."""
        async with self._save_lock:
            if self.guard is not None:
                await self.guard()
            await self.fence.ensure()
            async with self._lock:
                todo = self._due(time.monotonic(), flush)
            done: list[FinishedJob] = []
            live: list[JobRecord] = []
            for rec in todo.values():
                finished = self.index.finished.get(rec.job_id) if rec.terminal else None
                if finished is not None:
                    done.append(finished)
                elif not rec.terminal:
                    live.append(rec)
                # A finished record the index no longer holds has left with an earlier save: nothing to write.
            # Finished jobs go to the archive, not to the hot view's bucket: a finished job's record is written once.
            await self.archive.put_finished(done, self.fence)
            futures = [
                await self.fence.publish(
                    JOBS_KV_STREAM, f"$KV.{subjects.JOBS_KV}.{rec.job_id}", rec.model_dump_json().encode()
                )
                for rec in live
            ]
            await self.fence.acks(JOBS_KV_STREAM, futures)
            self.in_bucket.update(rec.job_id for rec in live)
            # Purged, not deleted: a delete leaves a marker per key, which every read of the bucket would still walk
            # through (20,000 markers after 20,000 jobs); a purge of the key's subject leaves nothing. A purge is a
            # stream API call, which no precondition fences: a deposed owner skips them (its successor purges).
            gone = [d.job_id for d in done if d.job_id in self.in_bucket]
            for start in range(0, len(gone) if not self.fence.deposed else 0, PURGE_BATCH):
                await asyncio.gather(*(self._purge(job_id) for job_id in gone[start : start + PURGE_BATCH]))
            self.in_bucket.difference_update(gone)
            async with self._lock:
                now = time.monotonic()
                for job_id, rec in todo.items():
                    if self.unprojected.get(job_id) is rec:
                        del self.unprojected[job_id]
                        del self._unsaved[job_id]
                    elif job_id in self._unsaved:  # changed while being saved: unsaved from the event after
                        self._unsaved[job_id] = Unsaved(rec.seq + 1, now, self._unsaved[job_id].changed)
                seq = min(u.first_seq for u in self._unsaved.values()) - 1 if self._unsaved else self.index.last_seq
            if self.state_kv is not None and seq > self.saved_seq:
                await self.fence.put_kv(subjects.SOLVER_STATE_KV, PROJECTED_SEQ_KEY, str(seq).encode())
                self.saved_seq = seq
            if todo:
                log.debug("job owner: saved %d record(s) (%d archived); all up to sequence %d", len(todo), len(done),
                          seq)  # fmt: skip
            return len(live) + len(done)

    async def _notify(self, applied: Sequence[Applied]) -> None:
        if not applied:
            return
        for fn in self._listeners:
            try:
                await fn(applied)
            except Exception:
                log.exception("job owner: a listener failed on %d events", len(applied))

    # -- facts -----------------------------------------------------------------------------------------------------
    async def run_facts(self) -> None:
        """Drain the facts stream in order, in batches, for ever: fold, publish, project, then acknowledge."""
        await self._consume_facts(until_idle=False)

    async def drain_facts(self) -> int:
        """Fold every fact waiting now (a tool for tests and for taking over from a dead owner); returns how many."""
        return await self._consume_facts(until_idle=True)

    async def _consume_facts(self, *, until_idle: bool) -> int:
        config = ConsumerConfig(
            durable_name=FACTS_CONSUMER,
            deliver_policy=DeliverPolicy.ALL,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=FACTS_ACK_WAIT_S,
            max_ack_pending=FACT_BATCH * 4,
            filter_subject=subjects.JOB_FACTS_ALL,
        )
        sub = await self.js.pull_subscribe(
            subjects.JOB_FACTS_ALL, durable=FACTS_CONSUMER, stream=subjects.FACTS_STREAM, config=config
        )
        done = 0
        try:
            while True:
                try:
                    msgs = await fetch_batch(sub, timeout=0.5 if until_idle else 5.0)
                except (FetchTimeout, TimeoutError):  # nats-py's fetch raises either
                    if until_idle:
                        return done
                    raise_if_cancelling()  # a solver stopping must not fetch for ever
                    continue
                events: list[JobEvent] = []
                tps: list[str | None] = []
                awaited: list[bool] = []
                # An array's fact stands for its tasks' (array_facts.py): (the fact, where its tasks are in `events`).
                stood_for: list[tuple[JobEvent, int, int]] = []
                held: list[Msg] = []  # facts about jobs this owner does not know yet, while earlier ones may come back
                catching_up = not self.facts_caught_up(time.time())
                for msg in msgs:
                    try:
                        event = parse_job_event(msg.data)
                    except ValidationError as exc:
                        self.refused.labels("unreadable").inc()
                        log.error("refused an unreadable fact on %s: %s", msg.subject, str(exc)[:300])
                        continue
                    if catching_up and self._before_its_job(event, events):
                        held.append(msg)
                        continue
                    tp = (msg.headers or {}).get("traceparent")
                    tasks = expand_fact(event, self.index.live_tasks)
                    if tasks is None:
                        events.append(event)
                        tps.append(tp)
                        awaited.append(_awaited(msg))
                        continue
                    if _awaited(msg):
                        stood_for.append((event, len(events), len(events) + len(tasks)))
                    events += tasks
                    tps += [tp] * len(tasks)
                    awaited += [False] * len(tasks)
                try:
                    if events:
                        await self._commit_facts(events, tps, awaited, stood_for)
                except Exception:
                    # Not folded (the bus dropped, say): give the facts back now rather than after ack_wait.
                    for msg in msgs:
                        with contextlib.suppress(Exception):
                            await msg.nak(delay=1.0)
                    raise
                for msg in msgs:
                    if any(msg is h for h in held):
                        await msg.nak(delay=HELD_FACT_DELAY_S)
                    else:
                        await msg.ack()
                if held:
                    log.info("job owner: %d fact(s) about jobs not known yet held back: facts an earlier owner fetched "
                             "come back first", len(held))  # fmt: skip
                done += len(msgs) - len(held)
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def _commit_facts(
        self,
        events: Sequence[JobEvent],
        tps: Sequence[str | None],
        awaited: Sequence[bool],
        stood_for: Sequence[tuple[JobEvent, int, int]],
    ) -> None:
        """Commit a batch of facts, `COMMIT_CHUNK` events at a time: a 10,000-task array is not one commit that holds
        the lock (and every cycle, placement and other fold) for seconds. An array's reporter is told as soon as one of
        its tasks is recorded (a `jobs show` of it then finds it), or once all of them were refused."""
        out: list[JobRecord | None] = []
        pending = list(stood_for)
        at = 0
        while at < len(events):
            # The first commit is small when an array waits: its submitter hears back once a few tasks are recorded.
            end_at = at + (FIRST_CHUNK if at == 0 and pending else COMMIT_CHUNK)
            out += await self.commit(*events[at:end_at], traceparents=tps[at:end_at], awaited=awaited[at:end_at])
            at = end_at
            for item in list(pending):
                fact, start, end = item
                first = next((r for r in out[start:end] if r is not None), None)
                if first is not None or len(out) >= end:
                    await self._tell_outcomes([fact], [first], [True])
                    pending.remove(item)

    # -- facts sent straight to the owner ------------------------------------------------------------------------
    async def run_reports(self) -> None:
        """Answer the facts reporters send straight to the owner (`subjects.JOB_REPORTS_ALL`, core NATS: no stream
        holds them, the reporter's outbox does until it is answered), for ever. Folded in batches like the stream's:
        every request that came while a commit ran goes into the next one, and each is answered once its commit is
        durable (the job event in the job stream) or its fact was refused."""
        if self.nc is None:
            raise RuntimeError("the job owner answers direct reports only with a NATS connection (nc)")
        queue: asyncio.Queue[Msg] = asyncio.Queue()

        async def take(msg: Msg) -> None:
            queue.put_nowait(msg)

        sub = await self.nc.subscribe(subjects.JOB_REPORTS_ALL, queue=subjects.JOB_REPORTS_QUEUE, cb=take)
        try:
            while True:
                msgs = [await queue.get()]
                await asyncio.sleep(0)  # requests already read off the socket join this batch
                while not queue.empty() and len(msgs) < FACT_BATCH:
                    msgs.append(queue.get_nowait())
                try:
                    await self.fold_reports(msgs)
                except Exception as exc:
                    raise_if_cancelling()
                    # Not folded, or not known to be (the bus dropped, deposed): the reporters send them again.
                    log.warning("job owner: %d direct report(s) not folded (%s); asked again", len(msgs), exc)
                    for msg in msgs:
                        await _retry(msg, f"not folded: {exc}")
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
            # Requests taken and not answered: their reporters' requests time out and they send them again.

    async def fold_reports(self, msgs: Sequence[Msg]) -> None:
        """Fold one batch of direct reports and answer each (a `FactOutcome`; `RETRY_HEADER` where it must wait)."""
        await self._stream_facts_folded()
        events: list[JobEvent] = []
        tps: list[str | None] = []
        spans: list[tuple[Msg, JobEvent, int, int]] = []  # each request's fact and where its events are in `events`
        catching_up = not self.facts_caught_up(time.time())
        for msg in msgs:
            try:
                event = parse_job_event(msg.data)
            except ValidationError as exc:
                self.refused.labels("unreadable").inc()
                log.error("refused an unreadable report on %s: %s", msg.subject, str(exc)[:300])
                parts = msg.subject.split(".")
                job_id, kind = (parts[3], parts[4]) if len(parts) == 5 else ("", "")
                await _answer(msg, FactOutcome(job_id=job_id, event_id="", type=kind, applied=False))
                continue
            if catching_up and self._before_its_job(event, events):
                await _retry(msg, "facts an earlier owner fetched are not all back yet")
                continue
            tasks = expand_fact(event, self.index.live_tasks)
            mine = [event] if tasks is None else tasks
            spans.append((msg, event, len(events), len(events) + len(mine)))
            events += mine
            tps += [(msg.headers or {}).get("traceparent")] * len(mine)
        if not events:
            for msg, event, _, _ in spans:  # an array's fact that stands for no live task
                await _answer(msg, FactOutcome(job_id=event.job_id, event_id=event.event_id, type=event.type,
                                               applied=False))  # fmt: skip
            return
        done: list[JobRecord | None] = []

        async def answer(out: Sequence[JobRecord | None]) -> None:
            recs = [*done, *out]
            if len(recs) < len(events):
                return  # the batch's later chunks are not committed yet
            for msg, event, start, end in spans:
                applied = any(r is not None for r in recs[start:end])
                await _answer(msg, FactOutcome(job_id=event.job_id, event_id=event.event_id, type=event.type,
                                               applied=applied))  # fmt: skip

        # `COMMIT_CHUNK` events a commit: an array's fact may stand for thousands of tasks.
        for at in range(0, len(events), COMMIT_CHUNK):
            chunk = slice(at, at + COMMIT_CHUNK)
            done += await self.commit(*events[chunk], traceparents=tps[chunk], answer=answer)

    async def _stream_facts_folded(self) -> None:
        """Wait (bounded) until the facts stream's facts stored before now are folded, so that a direct report never
        overtakes a fact it follows from. Added when the preemption service stored `preempting` and then told the node
        to stop, whose `node_finished` (exit 143) folded first failed the job instead of requeueing it; the owner now
        sends every preempt command after it folded the `preempting`, so it is kept only as a guard for the facts
        still stored in the stream (the intake's). One request when nothing waits in the stream (the common case)."""
        deadline = time.monotonic() + STREAM_FIRST_WAIT_S
        target: int | None = None
        while True:
            try:
                info = await self.js.consumer_info(subjects.FACTS_STREAM, FACTS_CONSUMER)
            except NotFoundError:
                return  # no facts consumer yet: nothing was ever folded from the stream, nothing waits to be
            except Exception as exc:
                raise_if_cancelling()
                log.warning("job owner: facts consumer not answered (%s); direct reports folded without waiting", exc)
                return
            if not info.num_pending and not info.num_ack_pending:
                return
            if target is None:  # the last fact stored now: those after it may follow these reports
                target = (info.delivered.stream_seq or 0) + (info.num_pending or 0)
            if (info.ack_floor.stream_seq or 0) >= target:
                return
            if time.monotonic() >= deadline:
                log.info("job owner: direct reports folded before the facts stream caught up (to %d, at %d)", target,
                         info.ack_floor.stream_seq or 0)  # fmt: skip
                return
            await asyncio.sleep(0.01)

    def _before_its_job(self, event: JobEvent, batch: Sequence[JobEvent]) -> bool:
        """A fact about a job neither the index nor this batch has accepted: its `accepted` may be among the facts
        an earlier owner fetched and never acknowledged (paused or killed holding them). Folded now, it would be
        refused as about an unknown job and lost (a cancel, say); it waits until those facts are back."""
        if event.type == "accepted" or self.index.get(event.job_id) is not None:
            return False
        return not any(e.job_id == event.job_id and e.type == "accepted" for e in batch)

    async def _tell_outcomes(
        self, events: Sequence[JobEvent], records: Sequence[JobRecord | None], awaited: Sequence[bool]
    ) -> None:
        """Tell each reporter that waits what became of its fact. Sent after the commit wrote its records to the hot
        view, so a read the reporter makes on hearing it sees the fact (the job event itself goes out before that)."""
        if self.nc is None:
            return
        for event, rec, wanted in zip(events, records, awaited, strict=True):
            if wanted:
                outcome = FactOutcome(
                    job_id=event.job_id, event_id=event.event_id, type=event.type, applied=rec is not None
                )
                with contextlib.suppress(Exception):  # best effort: the reporter's wait times out, the fact stands
                    await self.nc.publish(
                        subjects.fact_outcome(event.job_id, event.type), outcome.model_dump_json().encode()
                    )

    # -- bounded history -------------------------------------------------------------------------------------------
    async def expire(self, now: float | None = None) -> list[FinishedJob]:
        """Save (`save`: finished jobs go to the archive then), then forget the finished jobs older than `min_age_s`
        (Slurm's MinJobAge: until then a late event still folds into their records, and a dependency reads them
        here rather than in the archive)."""
        try:
            await self.save()
        except Deposed as exc:
            raise NotOwner(str(exc)) from exc
        due = self.index.due_finished(time.time() if now is None else now, self.min_age_s)
        async with self._lock:
            # One a late event changed since the save stays, and is archived again with that event by the next save.
            gone = self.index.forget_finished(d for d in due if d.job_id not in self.unprojected)
        if gone:
            log.debug("%d finished job(s) left the hot view", len(gone))  # every second under a steady load
        return gone

    async def _purge(self, job_id: str) -> None:
        await self.js.purge_stream(f"KV_{subjects.JOBS_KV}", subject=f"$KV.{subjects.JOBS_KV}.{job_id}")


async def fetch_batch(sub: JetStreamContext.PullSubscription, timeout: float) -> list[Msg]:
    """The facts waiting now, up to FACT_BATCH, as soon as there is one (FetchTimeout after `timeout` with none).

    Not one `fetch(batch=FACT_BATCH)`: when nothing waits, nats-py then leaves a pull request for the whole batch
    with the server and, once the first fact comes, waits for the next one too; at one submission every 20 ms a fact
    waited ~20 ms for the one after it (`task bench:scale`'s paced jobs, p90 26 ms against 6 ms). One fact is asked
    for instead, and then, without waiting, as many more as its delivery says are pending behind it."""
    msgs = await sub.fetch(batch=1, timeout=timeout)
    pending = int(msgs[0].metadata.num_pending or 0)
    if pending > 0:
        # None coming means they were taken meanwhile (a stopping owner's puller): fold what came.
        with contextlib.suppress(FetchTimeout, TimeoutError):
            msgs += await sub.fetch(batch=min(pending, FACT_BATCH - 1), timeout=REST_OF_BATCH_S)
    return msgs


async def _answer(msg: Msg, outcome: FactOutcome) -> None:
    """Reply to a direct report: its reporter's outbox lets the fact go."""
    if not msg.reply:
        return
    with contextlib.suppress(Exception):  # best effort: a reporter that hears nothing sends it again
        await msg.respond(outcome.model_dump_json().encode())


async def _retry(msg: Msg, why: str) -> None:
    """Reply to a direct report that it was not folded: its reporter keeps it and sends it again."""
    if not msg.reply or msg._client is None:  # nats-py: no public accessor
        return
    with contextlib.suppress(Exception):
        await msg._client.publish(msg.reply, why.encode(), headers={subjects.RETRY_HEADER: "1"})


def _awaited(msg: Msg) -> bool:
    return bool((msg.headers or {}).get(subjects.AWAIT_FOLD_HEADER))
