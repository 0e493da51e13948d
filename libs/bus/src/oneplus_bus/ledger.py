"""The `jobs` KV bucket as a cache of the job event stream.

Every state change is first published to the stream (deduplicated by its event id), then folded into
the record with a compare-and-set on the KV revision, so concurrent writers never lose an update.
"""

from __future__ import annotations

import asyncio

from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue
from oneplus_contracts import JobEvent, JobRecord, apply_event, subjects

from .telemetry import inject

_CAS_RETRIES = 20


class JobLedger:
    def __init__(self, js: JetStreamContext, kv: KeyValue) -> None:
        self.js = js
        self.kv = kv

    async def get(self, job_id: str) -> tuple[JobRecord | None, int]:
        try:
            entry = await self.kv.get(job_id)
        except KeyNotFoundError:
            return None, 0
        if entry.value is None:
            return None, entry.revision or 0
        return JobRecord.model_validate_json(entry.value), entry.revision or 0

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

    async def record(self, event: JobEvent, *, traceparent: str | None = None) -> JobRecord:
        """Publish `event` and fold it into the job's record; raises IllegalTransition if it does not apply."""
        for attempt in range(_CAS_RETRIES):
            rec, rev = await self.get(event.job_id)
            new = apply_event(rec, event)
            tp = traceparent or (rec.traceparent if rec else None)
            if tp and new.traceparent is None:
                new = new.model_copy(update={"traceparent": tp})
            await self.publish(event, traceparent=new.traceparent)
            data = new.model_dump_json().encode()
            try:
                if rev == 0:
                    await self.kv.create(event.job_id, data)
                else:
                    await self.kv.update(event.job_id, data, last=rev)
                return new
            except KeyWrongLastSequenceError:
                await asyncio.sleep(0.005 * (attempt + 1))
            except Exception as exc:  # nats-py raises BadRequestError for create() on an existing key
                if "wrong last sequence" not in str(exc):
                    raise
                await asyncio.sleep(0.005 * (attempt + 1))
        raise RuntimeError(f"could not update job {event.job_id}: too many concurrent writers")

    async def all(self) -> list[JobRecord]:
        """Every job's current record, read with one watcher rather than one request per key."""
        return [JobRecord.model_validate_json(v) for v in await latest_values(self.kv)]


async def latest_values(kv: KeyValue, timeout: float = 10.0) -> list[bytes]:
    """The latest value of every key of a bucket (deleted keys left out), in key order."""
    # A short inactivity threshold: each read leaves no consumer behind for long on a busy bucket.
    watcher = await kv.watchall(ignore_deletes=True, inactive_threshold=2.0)
    values: dict[str, bytes] = {}
    try:
        while True:
            entry = await watcher.updates(timeout=timeout)  # type: ignore[no-untyped-call]
            if entry is None:  # the watcher has delivered every current value
                break
            if entry.value:
                values[entry.key] = entry.value
    finally:
        await watcher.stop()  # type: ignore[no-untyped-call]
    return [values[k] for k in sorted(values)]
