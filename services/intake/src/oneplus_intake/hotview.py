"""The intake's copy of the hot view (the `jobs` KV bucket), kept by following the bucket, for the job list.

Every page of a listing used to read the whole bucket: a full `oneplus jobs list` of 10,000 jobs read it 100 times.
Here the bucket is listed once and followed (`kv_list_and_watch`); a page filters and sorts small index rows in
memory and parses only the records it returns.

A read sees every write the bucket held when the read began: it waits, briefly, until the copy has followed the
bucket up to the sequence its stream had then. A finished job's key is purged when it moves to the archive, so
that sequence may never arrive; a wait that times out on one sequence is not repeated for it.

A purge leaves nothing in the bucket's stream to follow, so the copy also follows the archive: a job put there
leaves the copy (the listing then finds it in the archive). A finished job still in the copy long after it should
have moved (its archiving happened while this copy was listing) is looked up in the bucket and dropped if gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time

from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError
from oneplus_bus.informer import StreamTail, kv_list_and_watch
from oneplus_contracts import JobRecord, subjects
from oneplus_stores.archive import ARCHIVE_PREFIX, JobRow

from .settings import IntakeSettings

log = logging.getLogger("oneplus.intake.hotview")

SYNC_WAIT_S = 0.25  # how long a read waits for the copy to catch up with the bucket before it reads what it has
SWEEP_EVERY_S = 60.0
STALE_AFTER_S = 120.0  # past ONEPLUS_MIN_JOB_AGE_S: a finished job's key should be gone from the bucket by then


class HotView:
    def __init__(self, js: JetStreamContext, min_job_age_s: float | None = None) -> None:
        self.js = js
        self.rows: dict[str, JobRow] = {}
        self.min_job_age_s = IntakeSettings.load().min_job_age_s if min_job_age_s is None else min_job_age_s
        self._tail: StreamTail | None = None
        self._archive_tail: StreamTail | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._gave_up_at = -1  # the stream sequence a read last waited for in vain (a purged last message)

    async def start(self) -> None:
        # The archive's position first: a job archived after it leaves the copy even if the listing below has it.
        archived = int((await self.js.stream_info(subjects.ARCHIVE_STREAM)).state.last_seq or 0)
        self._tail = await kv_list_and_watch(self.js, subjects.JOBS_KV, self._on_change, "intake-jobs")
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
        for tail in (self._tail, self._archive_tail):
            if tail is not None:
                await tail.stop()
        self._tail = self._archive_tail = None

    async def _on_archived(self, seq: int, subject: str, data: bytes, headers: dict[str, str]) -> None:
        with contextlib.suppress(ValueError, KeyError, TypeError):
            self.rows.pop(str(json.loads(data)["job_id"]), None)

    async def sweep(self, now: float | None = None) -> int:
        """Drop finished jobs whose key has left the bucket unseen; how many were dropped."""
        cutoff = (time.time() if now is None else now) - self.min_job_age_s - STALE_AFTER_S
        stale = [r.job_id for r in list(self.rows.values()) if r.ended_ts is not None and r.ended_ts < cutoff]
        if not stale:
            return 0
        kv = await self.js.key_value(subjects.JOBS_KV)
        dropped = 0
        for job_id in stale:
            try:
                await kv.get(job_id)
            except KeyNotFoundError:
                self.rows.pop(job_id, None)
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

    async def _on_change(self, job_id: str, value: bytes | None) -> None:
        if value is None:
            self.rows.pop(job_id, None)
            return
        try:
            self.rows[job_id] = JobRow.of(value)
        except (ValueError, KeyError, TypeError):
            self.rows.pop(job_id, None)  # not a job record: nothing to list

    async def synced(self) -> None:
        """Until the copy holds every write the bucket held now (or SYNC_WAIT_S passed)."""
        assert self._tail is not None
        want = int((await self.js.stream_info(f"KV_{subjects.JOBS_KV}")).state.last_seq or 0)
        if self._tail.last_seq >= want or want == self._gave_up_at:
            return
        deadline = time.monotonic() + SYNC_WAIT_S
        while self._tail.last_seq < want:
            if time.monotonic() > deadline:
                self._gave_up_at = want  # purged before the copy saw it: never coming
                return
            await asyncio.sleep(0.002)
