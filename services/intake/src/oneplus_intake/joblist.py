"""`oneplus.ops.job.list` and `oneplus.ops.job.show`: the hot view first, then the archive, a page at a time.

The hot view is the `jobs` KV bucket (live jobs and those finished less than ONEPLUS_MIN_JOB_AGE_S ago), kept in the
intake's memory (hotview.py), filtered and sorted by (submitted_ts, job_id); the archive (oneplus_stores.archive)
follows, in the order jobs were archived. A request names its filters (`state`, `since`, `user`; the team is the
caller's), a `limit` and the `cursor` the previous page returned; a reply is `{"jobs": [record, ...], "next": cursor
or null}` and never grows past PAGE_BYTES, well under NATS' max_payload (1 MB by default), however many jobs match.

A page is what the platform held when it was read: a job that moves from the hot view to the archive between two
pages of one listing can show up on both, and the reader keeps its first sighting (OnePlusClient.iter_jobs does).
"""

from __future__ import annotations

import base64
import binascii
import bisect
import contextlib
import hashlib
import json
import re
from dataclasses import dataclass, replace
from typing import Any

from nats.js.errors import InvalidKeyError
from oneplus_bus.ledger import JobLedger, hot_index
from oneplus_bus.service import OpsError, RawJson
from oneplus_bus.tenancy import Caller
from oneplus_contracts import TERMINAL_STATES, JobRecord
from oneplus_stores.archive import JobArchive, JobRow, parse_since, parse_states

from .hotview import HotView

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
# Bytes of job records in one reply: the envelope and a margin stay under the 1 MB max_payload NATS defaults to.
PAGE_BYTES = 900_000


@dataclass(frozen=True)
class JobQuery:
    """One request of the job list: its filters, how many records, and where the previous page stopped."""

    limit: int = DEFAULT_LIMIT
    states: frozenset[str] | None = None
    since: float | None = None
    user: str | None = None
    team: str | None = None
    after: tuple[float, str] | None = None  # the hot view's last (submitted_ts, job_id) already listed
    archive_cursor: str | None = None  # where the archive's part resumes; "" for its start
    in_archive: bool = False

    @property
    def filters(self) -> str:
        """A short digest of the filters, carried in the cursor: a cursor fits only the listing that made it."""
        key = json.dumps([sorted(self.states or []), self.since, self.user, self.team])
        return hashlib.blake2s(key.encode(), digest_size=6).hexdigest()

    @property
    def reads_archive(self) -> bool:
        """The archive holds finished jobs only: a listing of live states never reads it."""
        return self.states is None or bool(self.states & TERMINAL_STATES)

    def cursor(self, *, after: tuple[float, str] | None = None, archive: str | None = None) -> str:
        body: dict[str, Any] = {"f": self.filters}
        if after is not None:
            body["h"] = [after[0], after[1]]
        else:
            body["a"] = archive or ""
        return base64.urlsafe_b64encode(json.dumps(body, separators=(",", ":")).encode()).decode().rstrip("=")


def parse_query(payload: dict[str, Any], caller: Caller) -> JobQuery:
    """The request's filters and position; an OpsError (400) names the field that is wrong."""
    limit = payload.get("limit")
    if limit is None:
        limit = DEFAULT_LIMIT
    elif isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise OpsError(f"limit must be a whole number from 1 to {MAX_LIMIT}, got {limit!r}", 400)
    try:
        states = parse_states(payload.get("state"))
    except ValueError as exc:
        raise OpsError(f"state: {exc}", 400) from None
    try:
        since = parse_since(payload.get("since"))
    except ValueError as exc:
        raise OpsError(f"since: {exc}", 400) from None
    user = payload.get("user")
    if user is not None and not isinstance(user, str):
        raise OpsError(f"user must be a string, got {type(user).__name__}", 400)
    query = JobQuery(
        limit=limit,
        states=frozenset(states) if states is not None else None,
        since=since,
        user=user or None,
        team=caller.team,
    )
    raw = payload.get("cursor")
    if raw is None or raw == "":
        return query
    if not isinstance(raw, str):
        raise OpsError(f"cursor must be the string a previous page returned, got {type(raw).__name__}", 400)
    body = _decode_cursor(raw)
    if body.get("f") != query.filters:
        raise OpsError("cursor: it was returned for other filters (state, since, user, team); start again", 400)
    if "h" in body:
        ts, job_id = body["h"]
        return replace(query, after=(float(ts), str(job_id)))
    return replace(query, archive_cursor=str(body["a"]), in_archive=True)


def _decode_cursor(raw: str) -> dict[str, Any]:
    body: Any = None
    with contextlib.suppress(binascii.Error, ValueError):  # UnicodeDecodeError is a ValueError
        body = json.loads(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)))
    ok = isinstance(body, dict) and isinstance(body.get("f"), str)
    if ok and "h" in body:
        h = body["h"]
        ok = isinstance(h, list) and len(h) == 2 and isinstance(h[0], int | float) and isinstance(h[1], str)
    elif ok:
        ok = isinstance(body.get("a"), str) and (body["a"] == "" or (body["a"].isdigit() and int(body["a"]) > 0))
    if not ok:
        raise OpsError(f"cursor: {raw[:64]!r} is not a cursor this endpoint returned", 400)
    result: dict[str, Any] = body
    return result


async def hot_rows(ledger: JobLedger, hot: HotView | None, query: JobQuery) -> tuple[list[JobRow], set[str]]:
    """The hot view's rows that match, in listing order, and every job id it holds."""
    if hot is not None and hot.following:
        await hot.synced()
        rows = list(hot.rows.values())
    else:  # no copy kept (a tool, a test): read the hot view now
        index = await hot_index(ledger.js)
        rows = [JobRow.of_record(r) for r in index.jobs.values()]
        rows += [JobRow.of(done.data) for done in index.finished.values()]
    keep = [r for r in rows if r.matches(states=query.states, since=query.since, user=query.user, team=query.team)]
    keep.sort(key=lambda r: (r.submitted_ts, r.job_id))
    return keep, {r.job_id for r in rows}


def page_json(jobs: list[bytes], nxt: str | None) -> RawJson:
    """`{"jobs": [record, ...], "next": cursor or null}` with each record as the store keeps it."""
    return RawJson(b'{"jobs":[' + b",".join(jobs) + b'],"next":' + json.dumps(nxt).encode() + b"}")


async def list_page(ledger: JobLedger, archive: JobArchive, query: JobQuery, hot: HotView | None = None) -> RawJson:
    """One page of the job list: `{"jobs": [...], "next": cursor or None}`, the records as stored (the job owner
    wrote them from the model; parsing and encoding them again was most of a long listing's time)."""
    jobs: list[bytes] = []
    used = 0
    hot_ids: set[str] = set()
    if not query.in_archive:
        rows, hot_ids = await hot_rows(ledger, hot, query)
        if query.after is not None:
            rows = rows[bisect.bisect_right(rows, query.after, key=lambda r: (r.submitted_ts, r.job_id)) :]
        for i, row in enumerate(rows):
            data = row.data
            size = len(data) + 1
            if len(jobs) >= query.limit or (jobs and used + size > PAGE_BYTES):
                last = rows[i - 1]
                return page_json(jobs, query.cursor(after=(last.submitted_ts, last.job_id)))
            jobs.append(data)
            used += size
        if not query.reads_archive:
            return page_json(jobs, None)
        if len(jobs) >= query.limit:
            return page_json(jobs, query.cursor(archive=""))
    elif not query.reads_archive:
        return page_json([], None)
    records, nxt = await archive.page(
        states=set(query.states) if query.states is not None else None,
        since=query.since,
        user=query.user,
        team=query.team,
        limit=query.limit - len(jobs),
        cursor=query.archive_cursor or None,
        max_bytes=PAGE_BYTES - used,
        at_least_one=not jobs,
        skip=hot_ids,
    )
    jobs.extend(records)
    return page_json(jobs, query.cursor(archive=nxt) if nxt is not None else None)


async def job_list(
    ledger: JobLedger, archive: JobArchive, payload: dict[str, Any], caller: Caller, hot: HotView | None = None
) -> RawJson:
    """The `job-list` ops endpoint: parse the request, serve one page."""
    return await list_page(ledger, archive, parse_query(payload, caller), hot)


NAMEABLE = re.compile(r"[A-Za-z0-9_\-=:@+]+")  # what a job id may hold: one NATS subject token, no wildcard


async def job_show(ledger: JobLedger, archive: JobArchive, payload: dict[str, Any], caller: Caller) -> JobRecord:
    """The `job-show` ops endpoint: the job's record from the hot view, else from the archive; another team's job
    does not exist, as far as this caller knows."""
    job_id = payload.get("job_id")
    if not isinstance(job_id, str) or not job_id:
        raise OpsError("job_id: name the job to show", 400)
    if not NAMEABLE.fullmatch(job_id):
        # A wildcard or a dot would make the lookups below subject filters that match other jobs.
        raise OpsError(f"no job {job_id!r}", 404)
    try:
        rec, _ = await ledger.get(job_id)
    except InvalidKeyError:  # no job is named that way
        rec = None
    if rec is None:
        rec = await archive.get(job_id) or await ledger.unfolded(job_id)
    if rec is None or not caller.sees(rec.spec.team):
        raise OpsError(f"no job {job_id!r}", 404)
    return rec
