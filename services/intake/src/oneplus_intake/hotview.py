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

from .settings import IntakeSettings

log = logging.getLogger("oneplus.intake.hotview")

SYNC_WAIT_S = 0.25  # how long a read waits for the copy to catch up with the bucket before it reads what it has
SWEEP_EVERY_S = 60.0
STALE_AFTER_S = 120.0  # past ONEPLUS_MIN_JOB_AGE_S: a finished job should have left for the archive by then


class HotView:
    def __init__(self, js: JetStreamContext, min_job_age_s: float | None = None) -> None:
        self.js = js
        self.rows: dict[str, JobRow] = {}
        self.index = JobIndex()
        self.min_job_age_s = IntakeSettings.load().min_job_age_s if min_job_age_s is None else min_job_age_s
        self._tail: StreamTail | None = None
        self._archive_tail: StreamTail | None = None
        self._saved_tail: StreamTail | None = None
        self._gave_up_at = -1  # the bucket's sequence a read last waited for in vain (a purged last message)
        self._sweeper: asyncio.Task[None] | None = None
        # Jobs archived before this copy folded their last event: job id → that event's sequence.
        self._archived: dict[str, int] = {}

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
        rows: dict[str, JobRow] = {}
        for job_id, rec in self.index.jobs.items():
            rows[job_id] = JobRow.of(rec.model_dump_json().encode())
        for job_id, done in self.index.finished.items():
            rows[job_id] = JobRow.of(done.data)
        self.rows = rows
        return self.index.last_seq

    async def _on_event(self, seq: int, subject: str, data: bytes, headers: dict[str, str]) -> None:
        try:
            event = parse_job_event(data)
        except ValidationError:
            return  # the job owner's epoch (oneplus_bus.fencing), not an event
        rec = self.index.apply(event, seq, headers.get("traceparent"))
        if rec is not None and self._archived.get(rec.job_id, seq + 1) <= seq:
            del self._archived[rec.job_id]
            self._drop(rec.job_id)
        elif rec is not None:
            done = self.index.finished.get(rec.job_id)
            self.rows[rec.job_id] = JobRow.of(done.data if done is not None else rec.model_dump_json().encode())

    async def _on_saved(self, seq: int, subject: str, data: bytes, headers: dict[str, str]) -> None:
        if is_fence(subject):
            return
        job_id = subject[len(f"$KV.{subjects.JOBS_KV}.") :]
        if headers.get("KV-Operation") in ("DEL", "PURGE"):
            self._drop(job_id)
            return
        try:
            rec = JobRecord.model_validate_json(data)
        except ValidationError:
            return
        held = self.index.get(job_id)
        if held is None or rec.seq >= held.seq:  # the owner saves what it folded: never ahead of this copy's events
            self.index.put(rec)
            done = self.index.finished.get(job_id)
            self.rows[job_id] = JobRow.of(done.data if done is not None else data)

    async def _on_archived(self, seq: int, subject: str, data: bytes, headers: dict[str, str]) -> None:
        with contextlib.suppress(ValueError, KeyError, TypeError):
            raw = json.loads(data)
            job_id, at = str(raw["job_id"]), int(raw.get("seq") or 0)
            row = self.rows.get(job_id)
            if row is None:
                return
            if (rec := self.index.get(job_id)) is not None and rec.seq >= at:
                self._drop(job_id)
            else:  # the copy has not folded the event the archived record ends with yet: it leaves once it has
                self._archived[job_id] = at

    def _drop(self, job_id: str) -> None:
        self.rows.pop(job_id, None)
        self.index.forget(job_id)

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
        row = self.rows.get(job_id)
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
