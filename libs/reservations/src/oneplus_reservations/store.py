"""The reservation store: the single source of truth for who holds which GPU."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import redis.asyncio as aioredis
from oneplus_contracts import Allocation
from redis.asyncio.sentinel import SentinelConnectionPool
from redis.exceptions import RedisError

from . import scripts
from .connect import RedisSettings, client_for_url, redis_client
from .keys import KeySpace

DEFAULT_LEASE_S = 60.0
STORE_RESET = "store reset"  # the Conflict reason (prefix) of a commit refused by a store that lost its state
# The Conflict reason (prefix) of a commit no replica acknowledged in time: it was released again (the next cycle
# tries again), because a failover to a replica that missed it would hand its GPUs out a second time.
NOT_REPLICATED = "not replicated"

# What a lease renewal found: renewed, another attempt's token, no reservation, or a store that lost its state.
RenewStatus = Literal["ok", "stale", "gone", "reset"]


class Token(int):
    """A fencing token, with where the operation that returned it sits in the store's own order (`at`).

    `at` is `<epoch>:<history stream id>`: the audit of several solver replicas is replayed in this order, since
    their entries reach JetStream in whatever order their connections deliver them. Empty when unknown."""

    at: str

    def __new__(cls, value: int, at: str = "") -> Token:
        tok = super().__new__(cls, value)
        tok.at = at
        return tok


def store_order(at: str) -> tuple[int, int, int] | None:
    """`Token.at` as a sortable key (epoch, ms, seq); None for an empty or malformed one."""
    try:
        epoch, stream_id = at.split(":", 1)
        ms, seq = stream_id.split("-", 1)
        return int(epoch), int(ms), int(seq)
    except ValueError:
        return None


def _token(res: Sequence[object]) -> Token:
    return Token(int(str(_s(res[1]))), _s(res[2]) if len(res) > 2 else "")


@dataclass(frozen=True)
class Reservation:
    job_id: str
    token: int
    allocation: Allocation
    ts_ms: int = 0


@dataclass(frozen=True)
class Conflict:
    """Why a gang commit was refused: nothing was taken."""

    reason: str
    key: str | None = None
    holder: str | None = None

    @property
    def store_reset(self) -> bool:
        return self.reason.startswith(STORE_RESET)

    @property
    def not_replicated(self) -> bool:
        return self.reason.startswith(NOT_REPLICATED)


@dataclass(frozen=True)
class HistoryEntry:
    op: str
    job_id: str
    token: int
    slots: tuple[tuple[str, int], ...]
    entry_id: str


def _slots(ks: KeySpace, alloc: Allocation) -> tuple[list[str], list[str], list[int]]:
    gpu_keys: list[str] = []
    share_keys: list[str] = []
    milli: list[int] = []
    for rank in alloc.ranks:
        for g in rank.gpus:
            gpu_keys.append(ks.gpu(rank.node, g))
            share_keys.append(ks.share(rank.node, g))
            milli.append(rank.gpu_milli)
        for uuid in rank.mig:
            gpu_keys.append(ks.mig(rank.node, uuid))
            share_keys.append(ks.mig_share(rank.node, uuid))
            milli.append(0)
    return gpu_keys, share_keys, milli


def _s(v: object) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


class ReservationStore:
    """The store over one Redis client. `wait_replicas` > 0: a gang commit counts only once that many replicas
    acknowledged it (Redis WAIT, within `wait_timeout_ms`); one they did not is released and refused
    (`Conflict.not_replicated`). docs/reliability.md, "Redis failover", says why."""

    def __init__(
        self,
        client: aioredis.Redis,
        cluster: str = "default",
        wait_replicas: int = 0,
        wait_timeout_ms: int = 500,
    ) -> None:
        self.r = client
        self.ks = KeySpace(cluster)
        self.wait_replicas = wait_replicas
        self.wait_timeout_ms = wait_timeout_ms
        self._reserve = client.register_script(scripts.RESERVE)
        self._release = client.register_script(scripts.RELEASE)
        self._renew = client.register_script(scripts.RENEW)
        self._restore = client.register_script(scripts.RESTORE)

    @classmethod
    def from_url(cls, url: str, cluster: str = "default") -> ReservationStore:
        return cls(client_for_url(url), cluster)

    @classmethod
    def connect(cls, settings: RedisSettings, cluster: str = "default") -> ReservationStore:
        """The store as services build it: a plain URL or Sentinel (`connect.redis_client`), with the WAIT rule."""
        return cls(redis_client(settings), cluster, settings.wait_replicas, settings.wait_timeout_ms)

    async def load_scripts(self) -> None:
        """Load the Lua scripts once at start: the first commit then costs one EVALSHA like every other."""
        for script in (self._reserve, self._release, self._renew, self._restore):
            await self.r.script_load(script.script)

    async def close(self) -> None:
        sentinel = getattr(self.r.connection_pool, "sentinel_manager", None)
        await self.r.aclose()
        if sentinel is not None:  # the Sentinel client's own connections to the sentinels
            await sentinel.aclose()

    async def reserve(self, job_id: str, alloc: Allocation, lease_s: float = DEFAULT_LEASE_S) -> Token | Conflict:
        """Take every GPU (and share) of every rank, or nothing. Returns the fencing token.

        A store without its epoch marker (reset, or never set up by a solver) refuses: `Conflict.store_reset`."""
        call = self._reserve_call(job_id, alloc, lease_s)
        if isinstance(call, Conflict):
            return call
        keys, args = call
        if self.wait_replicas > 0:
            return await self._reserve_replicated(job_id, keys, args)
        res = await self._reserve(keys=keys, args=args)
        if int(res[0]) == 1:
            return _token(res)
        return _conflict(res)

    def _reserve_call(
        self, job_id: str, alloc: Allocation, lease_s: float
    ) -> tuple[list[str], list[str | int]] | Conflict:
        """The RESERVE script's keys and arguments for `alloc`; a Conflict for an allocation no store could take."""
        gpu_keys, share_keys, milli = _slots(self.ks, alloc)
        if len(set(gpu_keys)) != len(gpu_keys):
            return Conflict("the allocation names one GPU twice")
        keys = [
            self.ks.fence,
            self.ks.gang(job_id),
            self.ks.history,
            self.ks.gangs,
            *gpu_keys,
            *share_keys,
            self.ks.epoch,
        ]
        args: list[str | int] = [job_id, alloc.model_dump_json(), int(lease_s * 1000), len(gpu_keys), *milli]
        return keys, args

    async def reserve_many(
        self, gangs: Sequence[tuple[str, Allocation]], lease_s: float = DEFAULT_LEASE_S
    ) -> list[Token | Conflict]:
        """`reserve` for every gang of a cycle, in order, in one round trip: each is all-or-nothing on its own, and
        a refusal of one never undoes another. With `wait_replicas`, one at a time, stopping after the first that
        no replica acknowledged: the results are then fewer than the gangs, and the rest were not tried."""
        if self.wait_replicas > 0 or len(gangs) == 1:  # one gang: no pipeline's script check, one round trip
            out: list[Token | Conflict] = []
            for job_id, alloc in gangs:
                res = await self.reserve(job_id, alloc, lease_s)
                out.append(res)
                if isinstance(res, Conflict) and (res.not_replicated or res.store_reset):
                    break
            return out
        calls: list[tuple[list[str], list[str | int]] | Conflict] = [
            self._reserve_call(job_id, alloc, lease_s) for job_id, alloc in gangs
        ]
        todo = [c for c in calls if not isinstance(c, Conflict)]
        replies: list[Any] = []
        if todo:
            async with self.r.pipeline(transaction=False) as pipe:
                for keys, args in todo:
                    await self._reserve(keys=keys, args=args, client=pipe)
                replies = await pipe.execute()
        answers = iter(replies)
        results: list[Token | Conflict] = []
        for call in calls:
            if isinstance(call, Conflict):
                results.append(call)
                continue
            res = next(answers)
            results.append(_token(res) if int(res[0]) == 1 else _conflict(res))
        return results

    async def _reserve_replicated(self, job_id: str, keys: list[str], args: list[str | int]) -> Token | Conflict:
        """RESERVE, then WAIT on the same connection (WAIT covers the writes of its own connection only)."""
        conn = self.r.client()
        try:
            res = await self._reserve(keys=keys, args=args, client=conn)
            if int(res[0]) != 1:
                return _conflict(res)
            token = _token(res)
            acked = int(await conn.wait(self.wait_replicas, self.wait_timeout_ms))
            if acked >= self.wait_replicas:
                return token
            # Not on enough replicas: a failover now could lose it and give its GPUs to another gang. Take it back
            # (a release that is itself lost leaves a hold no job record names: reconcile frees it).
            await self._release(keys=self._release_keys(job_id), args=[job_id, token, NOT_REPLICATED],
                                client=conn)  # fmt: skip
            refused = Conflict(
                f"{NOT_REPLICATED}: {acked} of {self.wait_replicas} replica(s) acknowledged within "
                f"{self.wait_timeout_ms} ms; released, retried next cycle"
            )
        finally:
            await conn.aclose()
        await self._follow_primary()
        return refused

    async def _follow_primary(self) -> None:
        """Under Sentinel, ask who the primary is now and drop idle connections to one that no longer is.

        A primary the sentinels replaced (a false failover, a partition) still answers as a primary with no replica
        until they demote it, 10-20 s later: without this every commit would go to it and be refused until then."""
        pool = self.r.connection_pool
        if isinstance(pool, SentinelConnectionPool) and pool.is_master:
            with contextlib.suppress(RedisError):  # no sentinel answers: the next connect asks them again
                await pool.get_master_address()  # type: ignore[no-untyped-call]

    async def replicated(self) -> bool:
        """True once `wait_replicas` replicas hold every write this primary took so far (always, with 0).

        One write, then WAIT on its connection: replication is one ordered stream, so a replica that acknowledged
        this write holds every earlier one too, whoever made it (a reservation read back before it is recorded)."""
        if self.wait_replicas <= 0:
            return True
        conn = self.r.client()
        try:
            await conn.set(self.ks.replicated, "1")
            return int(await conn.wait(self.wait_replicas, self.wait_timeout_ms)) >= self.wait_replicas
        finally:
            await conn.aclose()

    async def release(self, job_id: str, token: int | None = None, reason: str = "finished") -> Token | None:
        """Free the gang's GPUs; with a token, only if it is still current (a stale actor frees nothing).

        Returns the token of the reservation freed (true), or None when nothing was freed."""
        res = await self._release(keys=self._release_keys(job_id), args=[job_id, token or 0, reason])
        return _token(res) if int(res[0]) == 1 else None

    async def release_many(self, gangs: Sequence[tuple[str, int | None, str]]) -> list[Token | None]:
        """`release` for (job, token, reason) of many gangs, in order, in one round trip."""
        if len(gangs) <= 1:
            return [await self.release(job_id, token, reason) for job_id, token, reason in gangs]
        async with self.r.pipeline(transaction=False) as pipe:
            for job_id, token, reason in gangs:
                await self._release(keys=self._release_keys(job_id), args=[job_id, token or 0, reason], client=pipe)
            replies = await pipe.execute()
        return [_token(res) if int(res[0]) == 1 else None for res in replies]

    def _release_keys(self, job_id: str) -> list[str]:
        return [self.ks.gang(job_id), self.ks.history, self.ks.gangs, self.ks.epoch]

    async def restore(
        self, job_id: str, token: int, alloc: Allocation, lease_s: float = DEFAULT_LEASE_S
    ) -> bool | Conflict:
        """Put back a reservation a store reset erased, under the token its ranks hold; True if it is held now."""
        gpu_keys, share_keys, milli = _slots(self.ks, alloc)
        keys = [self.ks.gang(job_id), self.ks.history, self.ks.gangs, *gpu_keys, *share_keys]
        args: list[str | int] = [job_id, token, alloc.model_dump_json(), int(lease_s * 1000), len(gpu_keys), *milli]
        res = await self._restore(keys=keys, args=args)
        if int(res[0]) == 1:
            return True
        return _conflict(res)

    def _renew_call(self, job_id: str, token: int, lease_s: float) -> tuple[list[str], list[str | int]]:
        return [self.ks.gang(job_id), self.ks.epoch], [job_id, token, int(lease_s * 1000)]

    async def renew(self, job_id: str, token: int, lease_s: float = DEFAULT_LEASE_S) -> bool:
        return await self.renew_status(job_id, token, lease_s) == "ok"

    async def renew_status(self, job_id: str, token: int, lease_s: float = DEFAULT_LEASE_S) -> RenewStatus:
        """Renew the lease; say why not: another attempt holds it, it is gone, or the store lost its state."""
        keys, args = self._renew_call(job_id, token, lease_s)
        return renew_status(await self._renew(keys=keys, args=args))

    async def renew_many(self, held: Sequence[tuple[str, int]], lease_s: float) -> dict[tuple[str, int], RenewStatus]:
        """Renew many (job, token) leases in one round trip (one lease: the plain call, no pipeline's script check)."""
        pairs = sorted(set(held))
        if len(pairs) <= 1:
            # Not self.renew_status: a subclass may batch that into renew_many (FleetStore).
            return {(j, t): renew_status(await self._renew(*self._renew_call(j, t, lease_s))) for j, t in pairs}
        async with self.r.pipeline(transaction=False) as pipe:
            for job_id, token in pairs:
                keys, args = self._renew_call(job_id, token, lease_s)
                await self._renew(keys=keys, args=args, client=pipe)
            replies = await pipe.execute()
        return {pair: renew_status(reply) for pair, reply in zip(pairs, replies, strict=True)}

    async def epoch(self) -> int | None:
        """The store's epoch marker; None when the store lost its state (or no solver has set it up yet)."""
        raw = await self.r.get(self.ks.epoch)
        return None if raw is None else int(raw)

    async def set_epoch(self, epoch: int) -> None:
        """Mark the store as rebuilt for `epoch`: commits are taken again, with tokens above epoch * 2^32."""
        await self.r.set(self.ks.epoch, epoch)

    async def get(self, job_id: str) -> Reservation | None:
        return _reservation(job_id, await self.r.hgetall(self.ks.gang(job_id)))

    async def current_token(self, job_id: str) -> int | None:
        tok = await self.r.hget(self.ks.gang(job_id), "token")
        return int(tok) if tok is not None else None

    async def all(self) -> list[Reservation]:
        """Every live reservation; gangs whose lease expired are pruned from the index as they are found."""
        jobs = sorted(_s(j) for j in await self.r.smembers(self.ks.gangs))
        # One round trip for every gang: reconcile reads them all every few seconds, hundreds in a busy cluster.
        async with self.r.pipeline(transaction=False) as pipe:
            for job in jobs:
                await pipe.hgetall(self.ks.gang(job))
            replies = await pipe.execute() if jobs else []
        out: list[Reservation] = []
        for job, data in zip(jobs, replies, strict=True):
            res = _reservation(job, data)
            if res is None:
                await self.r.srem(self.ks.gangs, job)
                continue
            out.append(res)
        return out

    async def history(self, count: int | None = None, since_ms: int = 0) -> list[HistoryEntry]:
        """The store's own history, oldest first; `since_ms`: only entries written from then on (Redis' clock)."""
        entries = await self.r.xrange(self.ks.history, min=f"{since_ms}-0" if since_ms else "-", count=count)
        out: list[HistoryEntry] = []
        for entry_id, fields in entries or []:
            f = {_s(k): _s(v) for k, v in (fields or {}).items()}
            slots: list[tuple[str, int]] = []
            for slot in filter(None, f.get("slots", "").split(",")):
                key, _, milli = slot.rpartition("=")
                slots.append((key, int(milli)))
            out.append(HistoryEntry(f["op"], f["job"], int(f["token"]), tuple(slots), _s(entry_id)))
        return out

    async def time_ms(self) -> int:
        """The store's clock (its history's ids are stamped with it)."""
        sec, usec = await self.r.time()
        return int(sec) * 1000 + int(usec) // 1000

    async def held_slots(self) -> dict[str, str]:
        """Whole-GPU key → holder, read straight from Redis (for audits and tests)."""
        out: dict[str, str] = {}
        async for key in self.r.scan_iter(match=self.ks.gpu_prefix() + "*", count=1000):
            val = await self.r.get(key)
            if val is not None:
                out[_s(key)] = _s(val)
        return out

    async def wipe(self) -> None:
        """Delete every key of this cluster (tests and `oneplus dev reset`)."""
        async for key in self.r.scan_iter(match=self.ks.tag + "*", count=1000):
            await self.r.delete(key)


def _conflict(res: Sequence[object]) -> Conflict:
    return Conflict(_s(res[1]), _s(res[2]) if len(res) > 2 else None, _s(res[3]) if len(res) > 3 else None)


def renew_status(reply: Sequence[object]) -> RenewStatus:
    if int(str(reply[0])) == 1:
        return "ok"
    why = _s(reply[1])
    return "reset" if why == STORE_RESET else "stale" if why == "stale token" else "gone"


def check_history(entries: Sequence[HistoryEntry]) -> list[str]:
    """Replay the reservation history; return every moment a GPU was held twice (empty: the invariant held)."""
    whole: dict[str, str] = {}
    shares: dict[str, dict[str, int]] = {}
    problems: list[str] = []
    for e in entries:
        holder = f"{e.job_id}|{e.token}"
        for key, milli in e.slots:
            if e.op in ("reserve", "restore"):
                if e.op == "restore" and (whole.get(key) == holder or holder in shares.get(key, {})):
                    continue  # put back what it already held (the audit saw no release in between)
                used = sum(shares.get(key, {}).values())
                if milli == 0:
                    if key in whole or used:
                        problems.append(f"{e.entry_id}: {key} taken by {holder} while held by {whole.get(key)}")
                    whole[key] = holder
                else:
                    if key in whole or used + milli > 1000:
                        problems.append(f"{e.entry_id}: share {key} over-committed by {holder}")
                    shares.setdefault(key, {})[holder] = milli
            elif e.op == "release":
                if milli == 0:
                    if whole.get(key) == holder:
                        del whole[key]
                else:
                    shares.get(key, {}).pop(holder, None)
    return problems


def _reservation(job_id: str, data: dict[Any, Any]) -> Reservation | None:
    """A gang's hash as read from Redis (empty: no such gang, or its lease ran out)."""
    if not data:
        return None
    d = {_s(k): _s(v) for k, v in data.items()}
    return Reservation(job_id, int(d["token"]), Allocation.model_validate_json(d["alloc"]), int(d.get("ts", "0")))
