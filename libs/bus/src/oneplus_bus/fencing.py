"""Ownership the server enforces: an owner epoch per stream, checked by NATS on every write of the owner.

A lease (`oneplus_bus.lease`) says who should write; only the server can say whose writes land. Each stream the job
owner writes (the job events, the `jobs` KV bucket, the archive, the `solver_state` bucket) keeps `FENCE_LANES`
*fence subjects* (`fence_subject(stream, lane)`). An owner that takes over first appends its epoch to each (the lease
revision it took the lease at, compare-and-set on that subject's last sequence, never below the epoch already
there), and from then on every write it makes to the stream carries `Nats-Expected-Last-Subject-Sequence` = the
sequence of its own fence message on one lane, checked on that lane's subject
(`Nats-Expected-Last-Subject-Sequence-Subject`, nats-server >= 2.11). Once a newer owner has fenced a stream, the
older one's writes there are refused by the server (error 10071, "wrong last sequence"), whatever its clock says:
paused past its lease, partitioned, or flushing buffered publishes after a reconnect. The refusal is the deposed
owner's signal to stop (`Deposed`); it is counted in `oneplus_owner_writes_refused_total{stream}`.

Why lanes, and one write in flight per lane: on a replicated stream (R3) the stream leader lets only one write
whose expected-sequence check names a given subject be in flight (proposed to the cluster, not yet applied); a
second one meanwhile is refused with error 10164 ("wrong last sequence", nats-server's
JSStreamWrongLastSequenceConstantErr, jetstream_batching.go). A single fence subject therefore allowed one write in
flight per stream: every pipelined write after the first was refused, and the owner never wrote (the multi-host
run lost 29 of 50 jobs). A single server checks each write as it stores it and has no such limit. So each stream
has `FENCE_LANES` fence subjects and `OwnerFence.publish` sends a write on a lane only once that lane's previous
write is acknowledged (the ack comes after the leader applied it): up to `FENCE_LANES` writes in flight per stream,
in the order they were sent, and never two checks of one subject in flight at once.

Because the new owner fences every stream *before* it reads any of them back (bootstrap), whatever an old owner
landed is already in what it reads, and nothing of the old owner's lands after.

Every fenced write also carries `Oneplus-Owner-Epoch`, so a reader can check (`oneplus.chaos`'s `fenced` profile
does) that no stream ever holds a write of an older epoch after a newer one's.

`FencedPublisher` pipelines these writes and hands a refusal back as an error: nats-py 2.16's `publish_async` does
not (its reply handler raises the error instead of setting it on the future, which then never resolves).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Callable, Mapping

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import NoRespondersError
from nats.js import JetStreamContext
from nats.js.api import PubAck
from nats.js.errors import APIError, NotFoundError
from oneplus_contracts import subjects
from prometheus_client import CollectorRegistry, Counter

from .acks import PUBLISH_ACK_TIMEOUT_S, wait_acks

log = logging.getLogger("oneplus.fencing")

# A key / subject token no job id gives (`~` is neither in the intake's ids nor in an archive job token).
FENCE_TOKEN = "~owner"
EPOCH_HEADER = "Oneplus-Owner-Epoch"
EXPECTED_SEQ = "Nats-Expected-Last-Subject-Sequence"
EXPECTED_SEQ_SUBJECT = "Nats-Expected-Last-Subject-Sequence-Subject"
EXPECTED_STREAM = "Nats-Expected-Stream"
WRONG_LAST_SEQUENCE = 10071  # JetStream's error code for a failed expected-sequence check
# A replicated stream's leader refuses an expected-sequence check on a subject another in-flight write checks.
CHECK_IN_FLIGHT = 10164
FENCE_LANES = 16  # fence subjects per stream: the owner's writes in flight per stream (one per lane)

JOBS_KV_STREAM = f"KV_{subjects.JOBS_KV}"
SOLVER_STATE_STREAM = f"KV_{subjects.SOLVER_STATE_KV}"
# The streams only the job owner writes (the solver_state bucket's owner keys; its lease and liveness keys are
# written by every replica, unfenced).
FENCED_STREAMS = (subjects.JOBS_STREAM, JOBS_KV_STREAM, subjects.ARCHIVE_STREAM, SOLVER_STATE_STREAM)


def fence_subject(stream: str, lane: int = 0) -> str:
    """The subject of `stream` that holds its owner epochs on `lane` (lane 0: the subject of a one-lane fence)."""
    base = {
        subjects.JOBS_STREAM: f"{subjects.PREFIX}.job.{FENCE_TOKEN}.epoch",
        JOBS_KV_STREAM: f"$KV.{subjects.JOBS_KV}.{FENCE_TOKEN}",
        subjects.ARCHIVE_STREAM: f"{subjects.PREFIX}.archive.{FENCE_TOKEN}",
        SOLVER_STATE_STREAM: f"$KV.{subjects.SOLVER_STATE_KV}.{FENCE_TOKEN}",
    }[stream]
    return base if lane == 0 else f"{base}.{lane}"


FENCE_SUBJECTS = frozenset(fence_subject(s, lane) for s in FENCED_STREAMS for lane in range(FENCE_LANES))


def is_fence(subject: str) -> bool:
    """Whether `subject` is a fence subject (readers of a whole stream or bucket skip it)."""
    return subject in FENCE_SUBJECTS


def refused_by_fence(exc: BaseException) -> bool:
    """A write the server refused because its expected sequence no longer holds, or because another owner's write
    checking the same fence subject was in flight (an owner never has two of its own in flight on one lane)."""
    return isinstance(exc, APIError) and exc.err_code in (WRONG_LAST_SEQUENCE, CHECK_IN_FLIGHT)


def fence_enabled(env: Mapping[str, str] | None = None) -> bool:
    """ONEPLUS_OWNER_FENCE: `on` (`auto`, the default, is on: one server or a replicated cluster) or `off` (ownership
    rests on the lease's clock guard alone: for a nats-server older than 2.11, which ignores the check)."""
    env = os.environ if env is None else env
    mode = env.get("ONEPLUS_OWNER_FENCE", "auto").strip().lower() or "auto"
    if mode in ("on", "auto"):
        return True
    if mode == "off":
        return False
    raise ValueError(f"ONEPLUS_OWNER_FENCE={mode!r}: on, off or auto")


class Deposed(RuntimeError):
    """A newer owner fenced a stream this owner writes: its writes are refused there; it must stop writing."""


class FencedPublisher:
    """Pipelined JetStream publishes (one round trip for a batch) whose refusals come back as errors."""

    def __init__(self, nc: Client) -> None:
        self.nc = nc
        self._prefix = ""
        self._futures: dict[str, asyncio.Future[PubAck]] = {}
        self._n = 0

    async def publish(
        self, subject: str, data: bytes, headers: Mapping[str, str], stream: str
    ) -> asyncio.Future[PubAck]:
        if not self._prefix:
            self._prefix = self.nc.new_inbox()
            await self.nc.subscribe(f"{self._prefix}.*", cb=self._on_reply)
        self._n += 1
        token = str(self._n)
        fut: asyncio.Future[PubAck] = asyncio.get_running_loop().create_future()
        self._futures[token] = fut
        fut.add_done_callback(lambda _f: self._futures.pop(token, None))
        await self.nc.publish(
            subject, data, reply=f"{self._prefix}.{token}", headers={**headers, EXPECTED_STREAM: stream}
        )
        return fut

    async def _on_reply(self, msg: Msg) -> None:
        fut = self._futures.get(msg.subject[len(self._prefix) + 1 :])
        if fut is None or fut.done():
            return
        if msg.headers and msg.headers.get("Status") == "503":
            fut.set_exception(NoRespondersError())
            return
        try:
            resp = json.loads(msg.data)
        except ValueError as exc:
            fut.set_exception(exc)
            return
        if "error" in resp:
            err = resp["error"]
            fut.set_exception(
                APIError(code=err.get("code"), err_code=err.get("err_code"), description=err.get("description"))
            )
        else:
            fut.set_result(PubAck.from_response(resp))


class OwnerFence:
    """This owner's epoch and the sequences of its fence messages (one per lane) on each stream it writes."""

    def __init__(
        self,
        js: JetStreamContext,
        nc: Client,
        me: str,
        metrics: CollectorRegistry | None = None,
        enabled: bool | None = None,
    ) -> None:
        self.js = js
        self.me = me
        self.enabled = fence_enabled() if enabled is None else enabled
        self.publisher = FencedPublisher(nc)
        self.epoch = 0
        self.seqs: dict[str, list[int]] = {}  # stream -> its fence message's sequence on each lane
        self.deposed = False
        self.on_deposed: Callable[[], None] | None = None  # called once: a write refused, or a newer epoch found
        # stream -> each lane's latest write (a lane takes its next write once that one is acknowledged)
        self._in_flight: dict[str, list[asyncio.Future[PubAck] | None]] = {}
        self._next_lane: dict[str, int] = {}
        self._sending: dict[str, asyncio.Lock] = {}
        # One establishment at a time: a commit racing a takeover's bootstrap waits for its fence instead of fencing
        # at an epoch of its own (the multi-host lab: a binding's commit fenced at the old epoch + 1, met the lease's
        # epoch the bootstrap had just written, and deposed the new owner).
        self._establishing = asyncio.Lock()
        self.refused = Counter(
            "oneplus_owner_writes_refused",
            "Writes of this job owner the NATS server refused: a newer owner had fenced the stream",
            ["stream"],
            registry=metrics,
        )

    @property
    def established(self) -> bool:
        return bool(self.seqs) and not self.deposed

    async def last(self, stream: str, lane: int = 0) -> tuple[int, int]:
        """(sequence, epoch) of the latest fence message on `stream`'s `lane`; (0, 0) when it has none."""
        try:
            msg = await self.js.get_last_msg(stream, fence_subject(stream, lane))
        except NotFoundError:
            return 0, 0
        try:
            epoch = int(json.loads(msg.data or b"{}").get("epoch", 0))
        except (ValueError, TypeError, AttributeError):
            epoch = 0
        return int(msg.seq or 0), epoch

    async def establish(self, epoch: int | None = None) -> int:
        """Fence every lane of every stream the owner writes at `epoch` (the owner lease's revision; None: one above
        the newest epoch found, for an owner without a lease). Raises Deposed where a newer epoch is there already."""
        async with self._establishing:
            return await self._establish(epoch)

    async def _establish(self, epoch: int | None) -> int:
        self._in_flight.clear()
        if not self.enabled:  # writes carry no precondition: the lease's clock guard alone keeps one writer
            self.epoch, self.deposed = epoch or 0, False
            self.seqs = {s: [0] * FENCE_LANES for s in FENCED_STREAMS}
            log.warning("owner %s writes unfenced (ONEPLUS_OWNER_FENCE=off)", self.me)
            return self.epoch
        lanes = [(s, lane) for s in FENCED_STREAMS for lane in range(FENCE_LANES)]
        if epoch is None:
            epoch = max([there for _, there in await asyncio.gather(*(self.last(s, n) for s, n in lanes))]) + 1
        # Every lane at once: each fence write checks its own lane's subject, so they may all be in flight.
        done = await asyncio.gather(*(self._fence_lane(s, n, epoch) for s, n in lanes), return_exceptions=True)
        seqs: dict[str, list[int]] = {s: [0] * FENCE_LANES for s in FENCED_STREAMS}
        for (stream, lane), result in zip(lanes, done, strict=True):
            if isinstance(result, BaseException):
                raise result
            seqs[stream][lane] = result
        self.epoch, self.seqs, self.deposed = epoch, seqs, False
        log.info("owner %s fenced %s at epoch %d", self.me, ", ".join(FENCED_STREAMS), epoch)
        return epoch

    async def _fence_lane(self, stream: str, lane: int, epoch: int) -> int:
        """Append `epoch` to one lane's fence subject (compare-and-set on its last sequence); its sequence."""
        while True:
            seq, there = await self.last(stream, lane)
            if there > epoch:
                self._depose()
                raise Deposed(f"{stream} is fenced at epoch {there}, above this owner's {epoch}")
            body = json.dumps({"owner": self.me, "epoch": epoch}).encode()
            headers = {EXPECTED_SEQ: str(seq), EPOCH_HEADER: str(epoch)}
            try:
                ack = await self.js.publish(fence_subject(stream, lane), body, headers=headers, stream=stream)
            except APIError as exc:
                if exc.err_code == CHECK_IN_FLIGHT:
                    await asyncio.sleep(0.01)  # the older owner's write on this lane is being applied: then ours
                    continue
                if refused_by_fence(exc):
                    continue  # another owner fenced it between our read and our write: look again
                raise
            return int(ack.seq)

    async def ensure(self) -> None:
        """Raise Deposed once refused; fence every stream (an owner without a lease) if never done."""
        if self.deposed:
            raise Deposed(f"owner {self.me} (epoch {self.epoch}) was deposed")
        if not self.seqs:
            async with self._establishing:
                if self.deposed:  # the establishment it waited for found a newer owner
                    raise Deposed(f"owner {self.me} (epoch {self.epoch}) was deposed")
                if not self.seqs:  # not fenced by the establishment it waited for (a takeover's)
                    await self._establish(None)

    def headers(self, stream: str, base: Mapping[str, str] | None = None, lane: int = 0) -> dict[str, str]:
        """`base` and the preconditions of a write to `stream` by this owner, checked on `lane`."""
        if self.deposed:
            raise Deposed(f"owner {self.me} (epoch {self.epoch}) was deposed")
        if not self.enabled:
            return dict(base or {})
        return {
            **(base or {}),
            EXPECTED_SEQ: str(self.seqs[stream][lane]),
            EXPECTED_SEQ_SUBJECT: fence_subject(stream, lane),
            EPOCH_HEADER: str(self.epoch),
        }

    async def publish(
        self, stream: str, subject: str, data: bytes, base: Mapping[str, str] | None = None
    ) -> asyncio.Future[PubAck]:
        """Send one fenced write without waiting for its ack (the future: await it with `acks`). Writes take the
        stream's lanes in turn; a lane whose previous write is not yet acknowledged is waited for (bounded) first,
        so that no two writes checking one fence subject are in flight (module doc)."""
        if not self.enabled:
            return await self.publisher.publish(subject, data, self.headers(stream, base), stream)
        lock = self._sending.setdefault(stream, asyncio.Lock())
        async with lock:  # one sender picks a lane at a time: writes go out in the order they were asked for
            lanes = self._in_flight.setdefault(stream, [None] * FENCE_LANES)
            lane = self._next_lane.get(stream, 0)
            self._next_lane[stream] = (lane + 1) % FENCE_LANES
            prev = lanes[lane]
            if prev is not None and not prev.done():
                await asyncio.wait([prev], timeout=PUBLISH_ACK_TIMEOUT_S)
                if not prev.done():
                    raise TimeoutError(f"{stream}: no ack for an earlier write on fence lane {lane}")
            fut = await self.publisher.publish(subject, data, self.headers(stream, base, lane), stream)
            lanes[lane] = fut
            return fut

    async def acks(self, stream: str, futures: list[asyncio.Future[PubAck]]) -> list[PubAck]:
        """The acks of fenced writes to `stream`, in order; Deposed if the server refused any (this owner is then
        deposed for good: `establish` again after taking the lease again)."""
        try:
            return await wait_acks(futures)
        except APIError as exc:
            if not refused_by_fence(exc):
                raise
            n = sum(1 for f in futures if f.done() and not f.cancelled() and f.exception() is not None)
            self.refused.labels(stream).inc(max(1, n))
            self._depose()
            log.warning("owner %s (epoch %d): %d write(s) to %s refused by the server", self.me, self.epoch, n, stream)
            raise Deposed(f"owner {self.me} (epoch {self.epoch}): {stream} is fenced by a newer owner") from exc

    def _depose(self) -> None:
        if self.deposed:
            return
        self.deposed = True
        if self.on_deposed is not None:
            self.on_deposed()

    async def put_kv(self, bucket: str, key: str, value: bytes) -> int:
        """A fenced KV put (`bucket` is one of the fenced buckets); its revision."""
        stream = f"KV_{bucket}"
        fut = await self.publish(stream, f"$KV.{bucket}.{key}", value)
        return int((await self.acks(stream, [fut]))[0].seq)
