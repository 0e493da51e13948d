"""The intake's copy of the hot view (live jobs and recently finished ones), kept by following the job stream.

Every page of a listing used to read the whole bucket: a full `oneplus jobs list` of 10,000 jobs read it 100 times.
Here the hot view is read once (`hot_index`: the records the job owner last saved, and the job stream after them)
and the job stream is followed, each event folded into the copy as the owner folded it; a page filters and sorts
small index rows in memory and parses only the records it returns.

A read sees every event the job stream held when the read began: it waits, briefly, until the copy has followed the
stream up to the sequence it had then.

A finished job leaves the hot view for the archive, which is not an event: the copy also follows the archive, and a
job put there leaves the copy (the listing then finds it in the archive). A finished job still in the copy long after
it should have moved (its archiving happened while this copy was listing) is looked up in the archive and dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time

from nats.js import JetStreamContext
from oneplus_bus.fencing import is_fence
from oneplus_bus.informer import StreamTail
from oneplus_bus.ledger import hot_index
from oneplus_contracts import JobRecord, parse_job_event, subjects
from oneplus_contracts.jobindex import JobIndex
from oneplus_stores.archive import ARCHIVE_PREFIX, JobArchive, JobRow
from pydantic import ValidationError
from pydantic_core import from_json

from .settings import IntakeSettings

log = logging.getLogger("oneplus.intake.hotview")

SYNC_WAIT_S = 0.25  # how long a read waits for the copy to catch up with the bucket before it reads what it has
SWEEP_EVERY_S = 60.0
EVENT_PREFIX = f"{subjects.PREFIX}.job."  # a job event's subject: this, the job id, its type
FOLD_AT = 32  # unread events of one job past which the copy folds them (a long-lived job's, nobody listing)
DROPPED_KEPT = 10_000  # jobs remembered as gone to the archive, against a late save of one of them
STALE_AFTER_S = 120.0  # past ONEPLUS_MIN_JOB_AGE_S: a finished job should have left for the archive by then


class HotView:
    def __init__(self, js: JetStreamContext, min_job_age_s: float | None = None) -> None:
        self.js = js
        self._rows: dict[str, JobRow] = {}
        self.index = JobIndex()
        # Events not folded yet, by job: (sequence, event JSON, traceparent). Folded when a read needs the job; a
        # job that ends and leaves for the archive before anyone reads it is never folded here at all.
        self._unfolded: dict[str, list[tuple[int, bytes, str | None]]] = {}
        self.min_job_age_s = IntakeSettings.load().min_job_age_s if min_job_age_s is None else min_job_age_s
        self._tail: StreamTail | None = None
        self._archive_tail: StreamTail | None = None
        self._saved_tail: StreamTail | None = None
        self._gave_up_at = -1  # the bucket's sequence a read last waited for in vain (a purged last message)
        self._sweeper: asyncio.Task[None] | None = None
        # Jobs archived before this copy folded their last event: job id → that event's sequence.
        self._archived: dict[str, int] = {}
        self._dropped: dict[str, int] = {}  # jobs that left the copy for the archive → their last sequence

    async def start(self) -> None:
        # The archive's position first: a job archived after it leaves the copy even if the listing below has it.
        archived = int((await self.js.stream_info(subjects.ARCHIVE_STREAM)).state.last_seq or 0)
        self._tail = StreamTail(
            self.js, subjects.JOBS_STREAM, subjects.JOB_EVENTS_ALL, self._on_event, relist=self._list, whole=True,
            name="intake-jobs",
        )  # fmt: skip
        saved = int((await self.js.stream_info(f"KV_{subjects.JOBS_KV}")).state.last_seq or 0)
        self._tail.start(await self._list())
        # The saved records too: a record written to the bucket without its events (a restore, a tool) is seen.
        self._saved_tail = StreamTail(
            self.js, f"KV_{subjects.JOBS_KV}", f"$KV.{subjects.JOBS_KV}.>", self._on_saved, name="intake-saved"
        )
        self._saved_tail.start(saved)
        self._archive_tail = StreamTail(
            self.js, subjects.ARCHIVE_STREAM, f"{ARCHIVE_PREFIX}.>", self._on_archived, name="intake-archive"
        )
        self._archive_tail.start(archived)
        self._sweeper = asyncio.create_task(self._sweep_loop(), name="intake-hot-view-sweep")

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._sweeper
            self._sweeper = None
        for tail in (self._tail, self._archive_tail, self._saved_tail):
            if tail is not None:
                await tail.stop()
        self._tail = self._archive_tail = self._saved_tail = None

    async def _list(self) -> int:
        """Read the hot view whole; the job-stream sequence to follow from."""
        self.index = await hot_index(self.js)
        self._archived.clear()
        self._unfolded.clear()
        rows: dict[str, JobRow] = {}
        for job_id, rec in self.index.jobs.items():
            rows[job_id] = JobRow.of_record(rec)
        for job_id, done in self.index.finished.items():
            rows[job_id] = JobRow.of(done.data)
        self._rows = rows
        return self.index.last_seq

    @property
    def rows(self) -> dict[str, JobRow]:
        """Every job of the copy by id, each with every event the copy has read folded in."""
        for job_id in list(self._unfolded):
            self._fold(job_id)
        return self._rows

    def _fold(self, job_id: str) -> None:
        for seq, data, traceparent in self._unfolded.pop(job_id, ()):
            try:
                event = parse_job_event(data)
            except ValidationError:
                continue
            rec = self.index.apply(event, seq, traceparent)
            if rec is not None:
                done = self.index.finished.get(rec.job_id)
                self._rows[rec.job_id] = JobRow.of_record(rec, done.data if done is not None else None)

    def _last_seq(self, job_id: str) -> int | None:
        """The sequence of the last event or record of the job this copy has read (None: none)."""
        unfolded = self._unfolded.get(job_id)
        if unfolded:
            return unfolded[-1][0]
        live, done = self.index.jobs.get(job_id), self.index.finished.get(job_id)
        return live.seq if live is not None else done.seq if done is not None else None

    async def _on_event(self, seq: int, subject: str, data: bytes, headers: dict[str, str]) -> None:
        if is_fence(subject):
            return  # the job owner's epoch (oneplus_bus.fencing), not an event
        job_id = subject[len(EVENT_PREFIX) :].rpartition(".")[0]
        if job_id not in self._rows and not subject.endswith((".accepted", ".submitted")):
            return  # a job that has left the copy (or never had a record: a refused submission)
        unfolded = self._unfolded.setdefault(job_id, [])
        unfolded.append((seq, data, headers.get("traceparent")))
        if job_id not in self._rows or len(unfolded) >= FOLD_AT:
            self._fold(job_id)  # a new job gets its row at once; a long-lived one never keeps many events unread
        if self._archived.get(job_id, seq + 1) <= seq:
            del self._archived[job_id]
            self._drop(job_id)

    async def _on_saved(self, seq: int, subject: str, data: bytes, headers: dict[str, str]) -> None:
        if is_fence(subject):
            return
        job_id = subject[len(f"$KV.{subjects.JOBS_KV}.") :]
        if headers.get("KV-Operation") in ("DEL", "PURGE"):
            self._drop(job_id)
            return
        held = self._last_seq(job_id)
        held = held if held is not None else self._dropped.get(job_id)
        try:
            # The owner saves what it folded, seconds later: this copy has mostly read past it (not parsed then).
            if held is not None and int(from_json(data).get("seq") or 0) <= held:
                return
            rec = JobRecord.model_validate_json(data)
        except (ValidationError, ValueError, AttributeError):
            return
        self._unfolded.pop(job_id, None)  # all older than the record: its events after it come later
        self.index.put(rec)
        self._rows[job_id] = JobRow.of_record(rec, data)

    async def _on_archived(self, seq: int, subject: str, data: bytes, headers: dict[str, str]) -> None:
        with contextlib.suppress(ValueError, KeyError, TypeError):
            raw = json.loads(data)
            job_id, at = str(raw["job_id"]), int(raw.get("seq") or 0)
            last = self._last_seq(job_id)
            if last is None:
                return
            if last >= at:
                self._drop(job_id)
            else:  # the copy has not read the event the archived record ends with yet: it leaves once it has
                self._archived[job_id] = at

    def _drop(self, job_id: str) -> None:
        last = self._last_seq(job_id)
        self._unfolded.pop(job_id, None)
        self._rows.pop(job_id, None)
        self.index.forget(job_id)
        if last is not None:
            # An older save of it still on its way (the bucket and the archive are followed apart) is not taken back.
            self._dropped[job_id] = last
            while len(self._dropped) > DROPPED_KEPT:
                del self._dropped[next(iter(self._dropped))]

    async def sweep(self, now: float | None = None) -> int:
        """Drop finished jobs that are in the archive and still in the copy; how many were dropped."""
        cutoff = (time.time() if now is None else now) - self.min_job_age_s - STALE_AFTER_S
        stale = [r.job_id for r in list(self.rows.values()) if r.ended_ts is not None and r.ended_ts < cutoff]
        archive = JobArchive(self.js)
        dropped = 0
        for job_id in stale:
            if await archive.get(job_id) is not None:
                self._drop(job_id)
                dropped += 1
        return dropped

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_EVERY_S)
            try:
                await self.sweep()
            except Exception:
                log.exception("hot view sweep failed; trying again in %.0f s", SWEEP_EVERY_S)

    def record(self, job_id: str) -> JobRecord | None:
        """The job's record as the copy holds it (None: not in the hot view, or not seen yet)."""
        self._fold(job_id)
        row = self._rows.get(job_id)
        return row.record() if row is not None else None

    def array_task(self, array_job_id: str) -> JobRecord | None:
        """A task of the array, one still live if there is one (None: no array of that id in the hot view)."""
        prefix = array_job_id + "_"
        found: JobRow | None = None
        for job_id, row in self.rows.items():
            if job_id.startswith(prefix) and job_id[len(prefix) :].isdigit():
                if row.ended_ts is None:
                    return row.record()
                found = found or row
        return found.record() if found is not None else None

    @property
    def following(self) -> bool:
        return self._tail is not None

    async def synced(self) -> None:
        """Until the copy holds every event the job stream held now, and every record the bucket did (or SYNC_WAIT_S
        passed)."""
        assert self._tail is not None
        want = int((await self.js.stream_info(subjects.JOBS_STREAM)).state.last_seq or 0)
        tail = self._saved_tail
        saved = int((await self.js.stream_info(f"KV_{subjects.JOBS_KV}")).state.last_seq or 0) if tail else 0
        if saved == self._gave_up_at:
            saved = 0
        deadline = time.monotonic() + SYNC_WAIT_S
        while self._tail.last_seq < want or (tail is not None and tail.last_seq < saved):
            if time.monotonic() > deadline:
                if tail is not None and tail.last_seq < saved:
                    self._gave_up_at = saved  # a purged key's last write: never coming, not waited for again
                return
            await asyncio.sleep(0.002)
