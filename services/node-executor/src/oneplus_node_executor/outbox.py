"""The executor's outbox: every fact it reports is on disk before `put` returns, and delivered until it is recorded.

A fact about a job's ranks (starting, running, node_finished, checkpointed) must reach the job's owner whatever
fails meanwhile: NATS down for minutes, the executor killed and restarted. So `put` appends the fact to a JSON-lines
file in the executor's state directory and returns; one sender task delivers the pending facts in order and appends a
`done` line for those the job owner answered. By default (`fact_sender`) a fact is a request to the owner
(`JobLedger.deliver`), answered once its job event is committed or it was refused: the outbox is the fact's only
durable copy until then, and the owner's event the only append it costs. The fact's event_id is its event's
Nats-Msg-Id, so a fact sent twice (a resend after a lost answer, or after a restart) is folded once.

Delivery is pipelined: one round sends up to `batch` facts side by side (one request each, all in flight at once),
at most one per job, so a job's facts are stored in the order they happened even when part of a round fails (a
later fact of a job is never sent before an earlier one is stored). While the bus is down the sender retries one
fact at a time with a capped backoff, forever; the first success sends full rounds again.

The file: one line per fact `{"seq": n, "event": {...}, "traceparent": "..."}`, one line per delivered round
`{"done": [n, ...]}`. Loading it replays both (a torn last line from a crash is skipped). It is compacted (rewritten
with only the pending facts, or emptied) once nothing is pending or every `COMPACT_EVERY` delivered facts.
A lock file keeps a second process from sharing it.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from oneplus_bus.ledger import JobLedger
from oneplus_bus.telemetry import inject
from oneplus_contracts import JobEvent, parse_job_event

log = logging.getLogger("oneplus.executor.outbox")

BATCH = 256  # facts in flight at once
MIN_BACKOFF_S = 0.1
MAX_BACKOFF_S = 5.0
COMPACT_EVERY = 1024  # delivered facts between two rewrites of a file that is never empty

Deliver = Callable[[JobEvent, str | None], Awaitable[object]]


FACTS_VIA_ENV = "ONEPLUS_EXECUTOR_FACTS"
FACTS_VIA = ("direct", "stream")


def fact_sender(ledger: Callable[[], JobLedger], via: str | None = None) -> Deliver:
    """How the outbox delivers a fact: `direct` (the default), a request the job owner answers once the fact's
    event is committed, so the fact is appended once (as that event) and the outbox holds it until then; `stream`,
    an append to ONEPLUS_FACTS (for solvers older than the direct reports, during a rolling upgrade). `ledger()` is
    called at each delivery: the service's ledger exists once it started."""
    via = via if via is not None else (os.environ.get(FACTS_VIA_ENV) or "direct")
    if via == "direct":
        return lambda event, traceparent: ledger().deliver(event, traceparent)
    if via == "stream":
        return lambda event, traceparent: ledger().report(event, traceparent)
    raise ValueError(f"{FACTS_VIA_ENV} must be one of {', '.join(FACTS_VIA)}, not {via!r}")


def default_state_dir(name: str) -> Path:
    """`$XDG_STATE_HOME/oneplus/<name>`, by default `~/.local/state/oneplus/<name>`."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "oneplus" / name


def state_dir_from_env(name: str) -> Path:
    """ONEPLUS_STATE_DIR when set, else the default for `name` (`executor-<node>`, `fleet-<name>`)."""
    env = os.environ.get("ONEPLUS_STATE_DIR")
    return Path(env) if env else default_state_dir(name)


@dataclass(frozen=True)
class Entry:
    seq: int
    event: JobEvent
    traceparent: str | None = None


class Outbox:
    """Facts waiting for the job owner. `path=None` keeps them in memory only (tests, an embedded executor)."""

    def __init__(
        self,
        deliver: Deliver,
        path: Path | None = None,
        *,
        fsync: bool = True,
        batch: int = BATCH,
        max_backoff_s: float = MAX_BACKOFF_S,
    ) -> None:
        self.deliver = deliver
        self.path = path
        self.fsync = fsync
        self.batch = max(1, batch)
        self.max_backoff_s = max_backoff_s
        self.pending: dict[int, Entry] = {}  # seq → entry, in seq order
        self.delivered = 0  # facts stored since this outbox opened
        self.failures = 0  # failed delivery rounds in a row
        self._ids: set[str] = set()  # event ids pending: a fact put twice is kept once
        self._seq = 0
        self._opened = False
        self._file: IO[str] | None = None
        self._lock: IO[str] | None = None
        self._since_compact = 0
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._sender: asyncio.Task[None] | None = None
        self._closed = False

    # -- opening and closing -----------------------------------------------------------------------------------

    def open(self) -> int:
        """Lock and load the file (idempotent); returns how many facts were pending from before."""
        if self._opened:
            return len(self.pending)
        self._opened = True
        if self.path is None:
            return 0
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock = open(self.path.with_suffix(".lock"), "a+", encoding="utf-8")  # noqa: SIM115 (held until close)
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock.close()
            mine = self.path.with_name(f"{self.path.stem}.{os.getpid()}{self.path.suffix}")
            log.warning(
                "%s is in use by another process (two executors of one node?): this one keeps its facts in %s",
                self.path,
                mine,
            )
            self.path = mine
            lock = open(self.path.with_suffix(".lock"), "a+", encoding="utf-8")  # noqa: SIM115
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        self._lock = lock
        self._load()
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (kept open for appends)
        if self.pending:
            log.info("%s: %d facts pending from before, sending them", self.path, len(self.pending))
            self._idle.clear()
        return len(self.pending)

    def _load(self) -> None:
        assert self.path is not None
        if not self.path.exists():
            return
        done: set[int] = set()
        with open(self.path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    if "done" in row:
                        done.update(int(s) for s in row["done"])
                        continue
                    entry = Entry(int(row["seq"]), parse_job_event(json.dumps(row["event"])), row.get("traceparent"))
                except Exception as exc:  # a line torn by a crash mid-write: the fact was never acknowledged
                    log.warning("%s:%d: unreadable line skipped: %s", self.path, n, exc)
                    continue
                self._seq = max(self._seq, entry.seq)
                if entry.event.event_id not in self._ids:
                    self.pending[entry.seq] = entry
                    self._ids.add(entry.event.event_id)
        for seq in done:
            gone = self.pending.pop(seq, None)
            if gone is not None:
                self._ids.discard(gone.event.event_id)

    def start(self) -> None:
        """Open the file and start the sender (a `put` does both when it comes first)."""
        self.open()
        if self._sender is None or self._sender.done():
            self._closed = False
            self._sender = asyncio.create_task(self._send_forever(), name="outbox-sender")

    async def close(self, flush_s: float = 2.0) -> None:
        """Try to deliver what is pending for up to `flush_s`, then stop; what is left stays on disk."""
        if self._sender is not None and not self._sender.done() and flush_s > 0:
            await self.flush(flush_s)
        self._closed = True
        if self._sender is not None:
            self._sender.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._sender
            self._sender = None
        if self._file is not None:
            if not self.pending:
                with contextlib.suppress(OSError):
                    self._rewrite()
            self._file.close()
            self._file = None
        if self._lock is not None:
            self._lock.close()  # releases the flock
            self._lock = None
        self._opened = False

    # -- putting -----------------------------------------------------------------------------------------------

    def put(self, event: JobEvent) -> None:
        """Keep the fact (on disk when there is a file) and have it sent; returns once it is kept."""
        if not self._opened:
            self.open()
        if event.event_id in self._ids:
            return  # the same fact is pending already (its event id names it)
        headers = inject({})
        self._seq += 1
        entry = Entry(self._seq, event, headers.get("traceparent"))
        if self._file is not None:
            row = {"seq": entry.seq, "event": event.model_dump(mode="json"), "traceparent": entry.traceparent}
            self._write(json.dumps(row, separators=(",", ":")), sync=self.fsync)
        self.pending[entry.seq] = entry
        self._ids.add(event.event_id)
        self._idle.clear()
        self._wake.set()
        if not self._closed and (self._sender is None or self._sender.done()):
            self.start()

    def _write(self, line: str, *, sync: bool) -> None:
        assert self._file is not None
        self._file.write(line + "\n")
        self._file.flush()
        if sync:
            os.fsync(self._file.fileno())

    async def flush(self, timeout: float | None = None) -> bool:
        """Wait until nothing is pending; False if `timeout` ran out first."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
            return True
        except TimeoutError:
            return False

    # -- sending -----------------------------------------------------------------------------------------------

    def _round(self) -> list[Entry]:
        """The next facts to send: in order, at most one per job (a job's later facts wait for its earlier ones)."""
        limit = 1 if self.failures else self.batch  # while the bus is down, one fact probes it
        jobs: set[str] = set()
        out: list[Entry] = []
        for entry in self.pending.values():
            if entry.event.job_id in jobs:
                continue
            jobs.add(entry.event.job_id)
            out.append(entry)
            if len(out) >= limit:
                break
        return out

    async def _send_forever(self) -> None:
        while True:
            try:
                await self._send_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("the outbox's sender failed; it goes on in %.1f s", self.max_backoff_s)
                await asyncio.sleep(self.max_backoff_s)

    async def _send_once(self) -> None:
        if not self.pending:
            self._idle.set()
            self._wake.clear()
            await self._wake.wait()
            return
        entries = self._round()
        results = await asyncio.gather(*(self.deliver(e.event, e.traceparent) for e in entries), return_exceptions=True)
        sent = [e for e, r in zip(entries, results, strict=True) if not isinstance(r, BaseException)]
        # A request future cancelled by a lost connection is a failed delivery like any other.
        errors = [r for r in results if isinstance(r, BaseException)]
        self._mark_done(sent)
        if not errors:
            if self.failures:
                log.info("facts are recorded again (%d pending)", len(self.pending))
            self.failures = 0
            return
        self.failures += 1
        if self.failures == 1 or self.failures % 20 == 0:
            log.warning(
                "recording %s of %s failed (%d pending, try %d): %s",
                entries[0].event.type,
                entries[0].event.job_id,
                len(self.pending),
                self.failures,
                str(errors[0]) or type(errors[0]).__name__,
            )
        await asyncio.sleep(min(self.max_backoff_s, MIN_BACKOFF_S * 2 ** (self.failures - 1)))

    def _mark_done(self, sent: list[Entry]) -> None:
        if not sent:
            return
        for e in sent:
            self.pending.pop(e.seq, None)
            self._ids.discard(e.event.event_id)
        self.delivered += len(sent)
        if self._file is None:
            return
        self._since_compact += len(sent)
        if not self.pending or self._since_compact >= COMPACT_EVERY:
            self._rewrite()
        else:
            self._write(json.dumps({"done": [e.seq for e in sent]}, separators=(",", ":")), sync=False)

    def _rewrite(self) -> None:
        """Compact: the file becomes the pending facts only (empty when none), replaced atomically."""
        assert self.path is not None and self._file is not None
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            for e in self.pending.values():
                row: dict[str, Any] = {"seq": e.seq, "event": e.event.model_dump(mode="json")}
                row["traceparent"] = e.traceparent
                f.write(json.dumps(row, separators=(",", ":")) + "\n")
            f.flush()
            if self.fsync:
                os.fsync(f.fileno())
        os.replace(tmp, self.path)
        self._file.close()
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
        self._since_compact = 0
