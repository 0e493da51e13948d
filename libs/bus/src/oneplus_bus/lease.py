"""Leadership and membership among replicas of a service, kept in a JetStream KV bucket.

`Lease`: one holder at a time, by compare-and-set on one key. The holder renews it every beat (a new revision); a
candidate takes it over only after it has watched the revision stay the same for `ttl_s` by its own clock, and a
holder counts itself the holder only for `ttl_s / 2` after it sent its last successful renewal. So no clock is
compared with another machine's, and two holders never overlap while clocks run at nearly the same rate. This is
the Kubernetes leader-election shape (client-go's leaderelection over a Lease object), on a KV revision instead of
a resourceVersion.

`ReplicaSet`: who is alive. Each replica writes its key every beat; the others follow those keys' changes and
count a replica alive while its key changed within `ttl_s` (again by their own clock).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from .informer import StreamTail, kv_list_and_watch

log = logging.getLogger("oneplus.lease")

Clock = Callable[[], float]


@dataclass(frozen=True)
class LeaseView:
    holder: str | None
    revision: int | None


def wrong_last_sequence(exc: BaseException) -> bool:
    """A KV compare-and-set lost to another writer (nats-py raises either the typed error or a plain API error)."""
    return isinstance(exc, KeyWrongLastSequenceError) or "wrong last sequence" in str(exc).lower()


class Lease:
    """A lease on `key` of `kv` for `me`: `try_hold()` each beat takes it, renews it, or says who holds it."""

    def __init__(self, kv: KeyValue, key: str, me: str, *, ttl_s: float = 10.0, clock: Clock = time.monotonic) -> None:
        self.kv = kv
        self.key = key
        self.me = me
        self.ttl_s = ttl_s
        self.clock = clock
        self.revision: int | None = None  # the revision this replica last wrote (it holds) or saw
        self.holder: str | None = None
        self._seen_at = clock()  # when the revision last changed, by this replica's clock
        self._renewed_at = -float("inf")  # when this replica sent its last successful renewal
        self._lock = asyncio.Lock()

    @property
    def held(self) -> bool:
        """Whether this replica may act as the holder now (half the lease: the other half is the margin)."""
        return self.holder == self.me and self.clock() - self._renewed_at < self.ttl_s / 2

    async def read(self) -> LeaseView:
        try:
            entry = await self.kv.get(self.key)
        except KeyNotFoundError:
            return LeaseView(None, None)
        if not entry.value:
            return LeaseView(None, entry.revision)
        try:
            holder = str(json.loads(entry.value)["holder"])
        except (ValueError, KeyError, TypeError):
            holder = None
        return LeaseView(holder, entry.revision)

    async def try_hold(self) -> bool:
        """Renew the lease if this replica holds it, take it if it is free or ran out, else note who holds it."""
        # One at a time: two renewals of this replica side by side would race on the revision, and the loser
        # would read its own lease as lost.
        async with self._lock:
            return await self._try_hold()

    async def _try_hold(self) -> bool:
        sent = self.clock()
        view = await self.read()
        if view.revision != self.revision:
            self.revision, self._seen_at = view.revision, self.clock()
        self.holder = view.holder
        expired = self.clock() - self._seen_at >= self.ttl_s
        if view.holder not in (None, self.me) and not expired:
            return False
        value = json.dumps({"holder": self.me, "ttl_s": self.ttl_s}).encode()
        try:
            if view.revision is None:
                revision = await self.kv.create(self.key, value)
            else:
                revision = await self.kv.update(self.key, value, last=view.revision)
        except Exception as exc:
            if wrong_last_sequence(exc) or "key exists" in str(exc).lower():
                return False  # another replica wrote it first: it holds the lease
            raise
        if view.holder != self.me:
            log.info("lease %s taken by %s (was %s)", self.key, self.me, view.holder or "free")
        self.revision, self.holder = int(revision), self.me
        self._seen_at = self._renewed_at = sent
        return True

    async def release(self) -> None:
        """Give the lease up at once (a clean stop), so another replica need not wait out the ttl."""
        if self.holder != self.me or self.revision is None:
            return
        try:
            await self.kv.update(self.key, b"", last=self.revision)
        except Exception as exc:
            if not wrong_last_sequence(exc):
                raise
        self.holder = None
        self._renewed_at = -float("inf")


class ReplicaSet:
    """The live replicas of a service: `beat()` writes this one's key; the set follows the others'."""

    def __init__(
        self,
        js: JetStreamContext,
        kv: KeyValue,
        bucket: str,
        me: str,
        *,
        prefix: str = "replica.",
        ttl_s: float = 10.0,
        clock: Clock = time.monotonic,
    ) -> None:
        self.js = js
        self.kv = kv
        self.bucket = bucket
        self.me = me
        self.prefix = prefix
        self.ttl_s = ttl_s
        self.clock = clock
        self.seen: dict[str, float] = {}
        self._tail: StreamTail | None = None

    async def start(self) -> None:
        await self.beat()
        self.seen[self.me] = self.clock()
        self._tail = await kv_list_and_watch(
            self.js, self.bucket, self._on_change, f"replicas-{self.me}", prefix=self.prefix
        )

    async def stop(self) -> None:
        if self._tail is not None:
            await self._tail.stop()
        try:
            await self.kv.delete(self.prefix + self.me)  # gone now, not after the ttl
        except Exception as exc:
            log.info("replica %s: could not remove its key (%s); it ages out", self.me, exc)

    async def beat(self) -> None:
        await self.kv.put(self.prefix + self.me, json.dumps({"replica": self.me}).encode())
        self.seen[self.me] = self.clock()

    async def _on_change(self, key: str, value: bytes | None) -> None:
        replica = key[len(self.prefix) :]
        if value is None:
            self.seen.pop(replica, None)
        else:
            self.seen[replica] = self.clock()

    def alive(self) -> tuple[str, ...]:
        """The replicas whose key changed within the ttl, this one always included, in name order."""
        now = self.clock()
        live = {r for r, at in self.seen.items() if now - at < self.ttl_s}
        live.add(self.me)
        return tuple(sorted(live))
