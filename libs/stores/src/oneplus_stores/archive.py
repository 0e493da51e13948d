"""The archive of finished jobs: what `sacct` reads in Slurm, on the ONEPLUS_ARCHIVE stream.

The job owner keeps live and recently finished jobs in the `jobs` KV bucket (the hot view); when a finished job
has been there ONEPLUS_MIN_JOB_AGE_S it is `put` here and its key deleted. One message per job, on

    oneplus.archive.<job_id>.<STATE>.<team>.<user>

so `get(job_id)` is one last-by-subject lookup, and `page` lets the server filter on state, team and user before
a single record is read. The job id's token is one-to-one (`job_token`); team and user are made subject-safe
(`token`), so two names may share a token, and every reader checks the decoded record against the exact values.
The stream's limits (streams.stream_limits) decide how long a job stays: ONEPLUS_ARCHIVE_RETENTION_S (30 days)
and ONEPLUS_ARCHIVE_MAX_BYTES (10 GiB), the oldest first.

Pages follow the stream's order, which is the order jobs were archived (their finish, plus the hot view's delay).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncGenerator, Collection, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import get_args

from nats.errors import NoRespondersError
from nats.errors import TimeoutError as FetchTimeout
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError
from oneplus_bus.acks import wait_acks
from oneplus_bus.fencing import OwnerFence, is_fence
from oneplus_contracts import TERMINAL_STATES, JobRecord, JobState, subjects
from oneplus_contracts.jobindex import FinishedJob
from pydantic_core import from_json

ARCHIVE_PREFIX = f"{subjects.PREFIX}.archive"
JOB_STATES: tuple[str, ...] = get_args(JobState)
# How far before `since` a time-based read starts: a job is archived after it finished, by the clock of the NATS
# server; this margin covers a server clock behind the job owner's.
CLOCK_MARGIN_S = 300.0
_FETCH_BATCH = 256
PUT_BATCH = 256  # finished jobs archived per round trip
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def _dedupe(job_id: str, seq: int) -> dict[str, str]:
    """The headers of an archived record: JetStream drops a second put of the same record (a pass run again)."""
    return {"Nats-Msg-Id": f"archive-{job_id}-{seq}"}


def token(value: str) -> str:
    """`value` as one subject token: characters outside [A-Za-z0-9_-] become `_`; the empty string is `_`."""
    return _UNSAFE.sub("_", value) or "_"


def job_token(job_id: str) -> str:
    """`job_id` as one subject token, one-to-one (a job's subject is its own): a safe id as it is, any other as `=`
    and the hex of its UTF-8 (`=` is never in a safe id)."""
    if job_id and not _UNSAFE.search(job_id):
        return job_id
    return "=" + job_id.encode("utf-8", "surrogatepass").hex()


def job_of_token(tok: str) -> str:
    """The job id whose `job_token` is `tok`."""
    return bytes.fromhex(tok[1:]).decode("utf-8", "surrogatepass") if tok.startswith("=") else tok


def archive_subject(rec: JobRecord) -> str:
    return subject_of(rec.job_id, rec.state, rec.spec.team, rec.spec.user)


def subject_of(job_id: str, state: str, team: str, user: str) -> str:
    return f"{ARCHIVE_PREFIX}.{job_token(job_id)}.{state}.{token(team)}.{token(user)}"


def reply_size(rec: JobRecord) -> int:
    """Bytes `rec` takes in a page of the job list (its stored JSON, as the archive keeps it), with its separator."""
    return len(rec.model_dump_json()) + 1


@dataclass(frozen=True, slots=True)
class JobRow:
    """A stored job record (the hot view's or the archive's JSON, as the job owner wrote it) and what the job list
    filters and sorts on; the record is validated only by whoever needs the model."""

    submitted_ts: float
    job_id: str
    state: str
    user: str | None
    team: str | None
    ended_ts: float | None  # finished_ts (else updated_ts) of a finished job; None while it is live
    # The stored JSON, or the record it stands for (a copy that folds events: serialised only when a page shows it).
    stored: bytes | JobRecord
    queue: str | None = None  # for the intake's jobs-by-state-and-queue gauge

    @property
    def data(self) -> bytes:
        """The record's JSON as a page of the job list carries it."""
        return self.stored if isinstance(self.stored, bytes) else self.stored.model_dump_json().encode()

    @classmethod
    def of_record(cls, rec: JobRecord, data: bytes | None = None) -> JobRow:
        """The row of a record at hand (`data`: its JSON, where already made), without serialising it now."""
        ended = None
        if rec.terminal:
            ended = rec.finished_ts if rec.finished_ts is not None else rec.updated_ts
        return cls(
            submitted_ts=rec.submitted_ts,
            job_id=rec.job_id,
            state=rec.state,
            user=rec.spec.user,
            team=rec.spec.team,
            ended_ts=ended,
            stored=data if data is not None else rec,
            queue=rec.spec.queue,
        )

    @classmethod
    def of(cls, data: bytes) -> JobRow:
        """Raises ValueError, KeyError or TypeError for what is not a job record."""
        raw = from_json(data)  # pydantic's parser: half json.loads' time, and no model built
        spec = raw.get("spec") or {}
        state = str(raw.get("state"))
        ended = None
        if state in TERMINAL_STATES:
            ended = raw.get("finished_ts") if raw.get("finished_ts") is not None else raw.get("updated_ts")
        return cls(
            submitted_ts=float(raw.get("submitted_ts") or 0.0),
            job_id=str(raw["job_id"]),
            state=state,
            user=spec.get("user"),
            team=spec.get("team"),
            ended_ts=float(ended) if ended is not None else None,
            stored=data,
            queue=spec.get("queue"),
        )

    def matches(
        self,
        *,
        states: Iterable[str] | None = None,
        since: float | None = None,
        user: str | None = None,
        team: str | None = None,
    ) -> bool:
        """The one filter of the job list, for the hot view and the archive alike. `since` is sacct's --starttime:
        the job had not ended by then (it is live, or it ended at or after `since`)."""
        return (
            (states is None or self.state in states)
            and (team is None or self.team == team)
            and (user is None or self.user == user)
            and (since is None or self.ended_ts is None or self.ended_ts >= since)
        )

    def record(self) -> JobRecord:
        return self.stored if isinstance(self.stored, JobRecord) else JobRecord.model_validate_json(self.stored)


def parse_states(raw: object) -> set[str] | None:
    """`RUNNING,FAILED`, a list of names, Slurm's codes (`R`, `PD`, `CD`...) or Slurm's and Kubernetes' state names
    (`PENDING`, `COMPLETED`, `Succeeded`...; `STATE_ALIASES`), in any case: a set of JobState names; None for every
    state. Raises ValueError naming the value that is not a state."""
    from oneplus_contracts.slurm import STATE_ALIASES, STATE_CODES

    if raw is None or raw == "" or raw == []:
        return None
    if isinstance(raw, str):
        items = raw.split(",")
    elif isinstance(raw, list) and all(isinstance(i, str) for i in raw):
        items = list(raw)
    else:
        raise ValueError(f"must be a comma-separated string or a list of job states, not {type(raw).__name__}")
    wanted: set[str] = set()
    for item in (i.strip().upper() for i in items):
        if not item:
            continue
        if item == "ALL":
            return None
        if item in JOB_STATES:
            wanted.add(item)
            continue
        if item in STATE_ALIASES:
            wanted.update(STATE_ALIASES[item])
            continue
        by_code = {s for s, code in STATE_CODES.items() if code == item}
        if not by_code:
            raise ValueError(
                f"{item!r} is not a job state; use one of {', '.join(JOB_STATES)}, a Slurm code "
                f"({', '.join(sorted(set(STATE_CODES.values())))}) or one of {', '.join(STATE_ALIASES)}"
            )
        wanted |= by_code
    return wanted or None


def parse_since(raw: object) -> float | None:
    """Epoch seconds (a number or a numeric string) or an ISO-8601 time (without a zone: UTC). Raises ValueError."""
    if raw is None or raw == "":
        return None
    if isinstance(raw, bool):
        raise ValueError("must be epoch seconds or an ISO-8601 time, not a boolean")
    if isinstance(raw, int | float):
        value = float(raw)
    elif isinstance(raw, str):
        try:
            value = float(raw)
        except ValueError:
            try:
                when = datetime.fromisoformat(raw.strip())
            except ValueError:
                raise ValueError(f"{raw!r} is neither epoch seconds nor an ISO-8601 time") from None
            value = (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()
    else:
        raise ValueError(f"must be epoch seconds or an ISO-8601 time, not {type(raw).__name__}")
    if value != value or value in (float("inf"), float("-inf")) or value < 0:
        raise ValueError(f"{raw!r} is not a time")
    return value


class JobArchive:
    """Finished jobs on the ONEPLUS_ARCHIVE stream: `put` by the job owner, `get` and `page` by everybody."""

    def __init__(self, js: JetStreamContext, *, stream: str = subjects.ARCHIVE_STREAM, timeout: float = 5.0) -> None:
        self.js = js
        self.stream = stream
        self.timeout = timeout

    async def put(self, rec: JobRecord, data: bytes | None = None) -> int:
        """Archive `rec` (`data`: its JSON, where the caller has it already); the same record (job and sequence) put
        again within the dedupe window is not stored twice. Returns its sequence in the archive stream."""
        data = data if data is not None else rec.model_dump_json().encode()
        return await self._publish(archive_subject(rec), rec.job_id, rec.seq, data)

    async def put_finished(self, done: Sequence[FinishedJob], fence: OwnerFence | None = None) -> None:
        """`put` of finished jobs as the hot view keeps them (their JSON and filing fields): nothing is parsed. Sent
        without waiting for each one's ack, `PUT_BATCH` at a time: one round trip a batch, not one a job. With the
        job owner's `fence`, each put carries its epoch's precondition (raises fencing.Deposed when refused)."""
        for start in range(0, len(done), PUT_BATCH):
            if fence is not None:
                batch = [
                    await fence.publish(
                        self.stream, subject_of(d.job_id, d.state, d.team, d.user), d.data, _dedupe(d.job_id, d.seq)
                    )
                    for d in done[start : start + PUT_BATCH]
                ]
                await fence.acks(self.stream, batch)
                continue
            futures = [
                await self.js.publish_async(
                    subject_of(d.job_id, d.state, d.team, d.user),
                    d.data,
                    headers=_dedupe(d.job_id, d.seq),
                    stream=self.stream,
                )
                for d in done[start : start + PUT_BATCH]
            ]
            await wait_acks(futures)

    async def _publish(self, subject: str, job_id: str, seq: int, data: bytes) -> int:
        ack = await self.js.publish(subject, data, headers=_dedupe(job_id, seq), stream=self.stream)
        return int(ack.seq)

    async def get(self, job_id: str) -> JobRecord | None:
        """The archived record of `job_id`, or None: one last-by-subject lookup on the job's subject prefix."""
        subject = f"{ARCHIVE_PREFIX}.{job_token(job_id)}.>"
        try:
            msg = await self.js.get_msg(self.stream, subject=subject, direct=True)
        except NotFoundError:
            return None
        except NoRespondersError:  # a stream declared before direct gets were allowed: the API call
            try:
                msg = await self.js.get_last_msg(self.stream, subject)
            except NotFoundError:
                return None
        rec = JobRecord.model_validate_json(msg.data or b"null")
        return rec if rec.job_id == job_id else None

    async def page(
        self,
        *,
        states: set[str] | None = None,
        since: float | None = None,
        user: str | None = None,
        team: str | None = None,
        limit: int = 100,
        cursor: str | None = None,
        max_bytes: int | None = None,
        at_least_one: bool = True,
        skip: Collection[str] = (),
    ) -> tuple[list[bytes], str | None]:
        """At most `limit` archived jobs matching every filter given, as stored (JSON), in archive order, and the
        cursor of the next page (None at the end). `since` (epoch seconds) keeps the jobs that ended at or after it.
        `max_bytes` caps the sum of their sizes in a reply (`reply_size`); with `at_least_one` the first record comes
        whatever its size, so that a reader always gets on. `skip`: ids of jobs not to list (the hot view's: one
        archived while its key is still being deleted there is listed from there)."""
        if limit < 1:
            raise ValueError("limit must be at least 1")
        if states is not None and not states:
            return [], None
        start_seq = _cursor_seq(cursor) if cursor is not None else None
        out: list[bytes] = []
        used = 0
        team_tok, user_tok = token(team or ""), token(user or "")
        # Team and user tokens may stand for several names, and the time is in the record: those filters read it.
        exact = since is not None or user is not None or team is not None
        scan = self._scan(_filter(states, team, user), since=since, start_seq=start_seq, first_batch=limit + 1)
        async with contextlib.aclosing(scan):
            async for subject, data, seq in scan:
                # The subject says state, team and user (as tokens): what cannot match is never parsed.
                parts = subject.split(".")
                by_subject = len(parts) == 6
                if by_subject and (
                    (skip and job_of_token(parts[2]) in skip)
                    or (states is not None and parts[3] not in states)
                    or (team is not None and parts[4] != team_tok)
                    or (user is not None and parts[5] != user_tok)
                ):
                    continue
                if exact or not by_subject:
                    row = JobRow.of(data)
                    if row.job_id in skip or not row.matches(states=states, since=since, user=user, team=team):
                        continue
                size = len(data) + 1 if max_bytes is not None else 0
                full = max_bytes is not None and used + size > max_bytes and (out or not at_least_one)
                if len(out) >= limit or full:
                    return out, str(seq)  # this record starts the next page
                out.append(data)
                used += size
        return out, None

    async def _scan(
        self,
        filter_subject: str,
        *,
        since: float | None = None,
        start_seq: int | None = None,
        first_batch: int = _FETCH_BATCH,
    ) -> AsyncGenerator[tuple[str, bytes, int], None]:
        """(subject, record, stream sequence) of the messages under `filter_subject`, read by a short-lived pull
        consumer that delivers nothing until asked; it reads what was there when it was made, and no further. Use it
        inside `contextlib.aclosing`, so that a reader that stops early removes its consumer at once. The first
        fetch asks for `first_batch` messages (what a page needs when nothing is filtered out), later ones for more."""
        config = ConsumerConfig(
            # No filter for the whole archive: with one subject per job, the server counts a filtered consumer's
            # pending messages subject by subject (50-90 ms at 100,000 jobs, against under 1 ms unfiltered).
            filter_subject=None if filter_subject == f"{ARCHIVE_PREFIX}.>" else filter_subject,
            ack_policy=AckPolicy.NONE,
            inactive_threshold=5.0,  # a reader that dies leaves no consumer behind for long
            mem_storage=True,
        )
        if start_seq is not None:
            config.deliver_policy = DeliverPolicy.BY_START_SEQUENCE
            config.opt_start_seq = start_seq
        elif since is not None:
            config.deliver_policy = DeliverPolicy.BY_START_TIME
            config.opt_start_time = datetime.fromtimestamp(max(0.0, since - CLOCK_MARGIN_S), UTC)
        info = await self.js.add_consumer(self.stream, config=config)
        sub = await self.js.pull_subscribe_bind(consumer=info.name, stream=self.stream)
        try:
            remaining = info.num_pending or 0
            batch = max(1, min(first_batch, _FETCH_BATCH))
            deadline = asyncio.get_running_loop().time() + self.timeout
            while remaining > 0:
                try:
                    msgs = await sub.fetch(batch=min(remaining, batch), timeout=1.0)
                    batch = _FETCH_BATCH
                    deadline = asyncio.get_running_loop().time() + self.timeout
                except (FetchTimeout, TimeoutError):  # nats-py's fetch raises either
                    if asyncio.get_running_loop().time() > deadline:
                        raise TimeoutError(f"reading {self.stream}: no records for {self.timeout:g}s") from None
                    # Records aged out after the consumer was made: ask what is left.
                    remaining = (await sub.consumer_info()).num_pending or 0
                    continue
                for msg in msgs:
                    remaining = msg.metadata.num_pending or 0
                    if msg.data and not is_fence(msg.subject):  # not the job owner's epoch (oneplus_bus.fencing)
                        yield msg.subject, msg.data, msg.metadata.sequence.stream
                    if remaining == 0:
                        break
        finally:
            await sub.unsubscribe()
            with contextlib.suppress(Exception):  # best effort: the inactivity threshold removes it anyway
                await self.js.delete_consumer(self.stream, info.name)


def _filter(states: set[str] | None, team: str | None, user: str | None) -> str:
    """One filter subject that lets the server skip what cannot match; the exact check is on the record. Several
    states are one `*` (a consumer with several filter subjects reads many times slower), and only finished jobs
    are archived: `RUNNING,FAILED` reads the FAILED subjects alone."""
    if states is not None:
        states = (states & TERMINAL_STATES) or states
    state_tok = next(iter(states)) if states is not None and len(states) == 1 else "*"
    team_tok = token(team) if team is not None else "*"
    user_tok = token(user) if user is not None else "*"
    if state_tok == team_tok == user_tok == "*":
        return f"{ARCHIVE_PREFIX}.>"
    return f"{ARCHIVE_PREFIX}.*.{state_tok}.{team_tok}.{user_tok}"


def _cursor_seq(cursor: str) -> int:
    try:
        seq = int(cursor)
    except (TypeError, ValueError):
        raise ValueError(f"{cursor!r} is not an archive cursor") from None
    if seq < 1:
        raise ValueError(f"{cursor!r} is not an archive cursor")
    return seq
