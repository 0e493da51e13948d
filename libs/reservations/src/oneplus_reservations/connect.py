"""How every service reaches Redis: one factory, a plain URL or Redis Sentinel.

    REDIS_URL=redis://[user:password@]host:port/db           one Redis (the embedded default, compose's single Redis)
    REDIS_SENTINELS=host:port,host:port,host:port             Redis with failover: the sentinels name the primary
    REDIS_SENTINEL_SERVICE=oneplus                            the name in `sentinel monitor <name> ...`
    REDIS_USERNAME / REDIS_PASSWORD / REDIS_DB                the ACL user the services connect as (any mode; a URL's
                                                              own user and password win in URL mode)
    REDIS_SENTINEL_USERNAME / REDIS_SENTINEL_PASSWORD         when the sentinels themselves require a password
    REDIS_WAIT_REPLICAS (default 1 with sentinels, else 0)    replicas that must acknowledge a gang commit (WAIT)
    REDIS_WAIT_TIMEOUT_MS (default 500)                       how long a commit waits for them

With sentinels set, REDIS_URL is ignored. The Sentinel client (redis-py's own `master_for`) asks the sentinels for
the primary on every new connection and drops connections to a primary that was demoted, so a service follows a
failover by itself: the commands of the failover's few seconds fail (the callers retry next cycle), the next ones
reach the promoted replica. Why a gang commit waits for a replica: docs/reliability.md, "Redis failover".
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import MasterNotFoundError, Sentinel
from redis.backoff import NoBackoff

DEFAULT_URL = "redis://127.0.0.1:6379/0"
DEFAULT_SERVICE = "oneplus"
DEFAULT_WAIT_TIMEOUT_MS = 500
CONNECT_TIMEOUT_S = 2.0  # a dead host is given up on this fast; the next sentinel or the next cycle tries again
# Commands beyond this many at once wait for a connection (up to POOL_WAIT_S) instead of failing with redis-py's
# "Too many connections": a fleet launching on hundreds of nodes at once, or a batch of releases, queues briefly.
MAX_CONNECTIONS = 64
POOL_WAIT_S = 10.0
_HOST = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?")  # a DNS name or an IPv4 address
SOCKET_TIMEOUT_S = 10.0  # a command blocked this long (a primary gone silent, not closed) fails instead of hanging


def parse_sentinels(text: str) -> tuple[tuple[str, int], ...]:
    """`host:port,host:port,...` (IPv6 as `[addr]:port`) → ((host, port), ...); a clear ValueError otherwise."""
    out: list[tuple[str, int]] = []
    for raw in text.split(","):
        part = raw.strip()
        if not part:
            continue
        host, sep, port = part.rpartition(":")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]  # [IPv6]
            ok = bool(host) and all(c in "0123456789abcdefABCDEF:." for c in host)
        else:
            ok = _HOST.fullmatch(host) is not None
        if not sep or not ok or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"REDIS_SENTINELS={text!r}: {part!r} is not host:port (e.g. redis-sentinel-0:26379)")
        out.append((host, int(port)))
    if not out:
        raise ValueError(f"REDIS_SENTINELS={text!r} names no sentinel (host:port,host:port,...)")
    if len(set(out)) != len(out):
        raise ValueError(f"REDIS_SENTINELS={text!r} names a sentinel twice")
    return tuple(out)


def _whole(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    if not raw.isdigit():
        raise ValueError(f"{name}={raw!r}: a whole number (0 or more)")
    return int(raw)


@dataclass(frozen=True)
class SentinelSettings:
    sentinels: tuple[tuple[str, int], ...]
    service: str = DEFAULT_SERVICE
    db: int = 0
    sentinel_username: str | None = None
    sentinel_password: str | None = None

    def describe(self) -> str:
        return ",".join(f"{h}:{p}" for h, p in self.sentinels)


class BusRedis(Protocol):
    """What a service's bus settings say of Redis (oneplus_bus.settings.BusSettings)."""

    @property
    def redis_url(self) -> str: ...

    @property
    def redis_from_env(self) -> bool: ...


@dataclass(frozen=True)
class RedisSettings:
    """Where Redis is and the commit rule: `wait_replicas` replicas acknowledge a gang commit (0: none waited for)."""

    url: str = DEFAULT_URL
    sentinel: SentinelSettings | None = None
    username: str | None = None
    password: str | None = None
    wait_replicas: int = 0
    wait_timeout_ms: int = DEFAULT_WAIT_TIMEOUT_MS

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RedisSettings:
        env = os.environ if env is None else env
        sentinel: SentinelSettings | None = None
        if env.get("REDIS_SENTINELS", "").strip():
            service = env.get("REDIS_SENTINEL_SERVICE", "").strip() or DEFAULT_SERVICE
            if any(c.isspace() for c in service):
                raise ValueError(f"REDIS_SENTINEL_SERVICE={service!r}: a name without spaces (sentinel monitor <name>)")
            sentinel = SentinelSettings(
                sentinels=parse_sentinels(env["REDIS_SENTINELS"]),
                service=service,
                db=_whole(env, "REDIS_DB", 0),
                sentinel_username=env.get("REDIS_SENTINEL_USERNAME") or None,
                sentinel_password=env.get("REDIS_SENTINEL_PASSWORD") or None,
            )
        return cls(
            url=env.get("REDIS_URL") or DEFAULT_URL,
            sentinel=sentinel,
            username=env.get("REDIS_USERNAME") or None,
            password=env.get("REDIS_PASSWORD") or None,
            wait_replicas=_whole(env, "REDIS_WAIT_REPLICAS", 1 if sentinel else 0),
            wait_timeout_ms=_whole(env, "REDIS_WAIT_TIMEOUT_MS", DEFAULT_WAIT_TIMEOUT_MS),
        )

    @classmethod
    def of_bus(cls, settings: BusRedis) -> RedisSettings:
        """A service's Redis: REDIS_* read now when its bus settings came from the environment, else just its URL
        (a harness that names the servers it started). Raises ValueError naming a bad REDIS_* value."""
        if settings.redis_from_env:
            return cls.from_env()
        return cls(url=settings.redis_url)

    def describe(self) -> str:
        """Where, without the password (for logs)."""
        if self.sentinel:
            return f"Redis Sentinel {self.sentinel.describe()} service {self.sentinel.service!r}"
        head, at, tail = self.url.rpartition("@")
        return self.url if not at else head.split("//", 1)[0] + "//***@" + tail


class _ExplainingSentinel(Sentinel):
    """redis-py's Sentinel, with one clear line when no primary is found (a wrong name, no sentinel answering)."""

    async def discover_master(self, service_name: str) -> Any:
        try:
            return await super().discover_master(service_name)
        except MasterNotFoundError as exc:
            raise MasterNotFoundError(await self._explain(service_name)) from exc

    async def _explain(self, service_name: str) -> str:
        known: set[str] = set()
        answered: list[str] = []
        unreachable: list[str] = []
        for s in self.sentinels:
            kw = s.connection_pool.connection_kwargs
            where = f"{kw.get('host')}:{kw.get('port')}"
            try:
                masters = await s.sentinel_masters()
            except Exception as exc:  # the reason is reported, not handled
                unreachable.append(f"{where} ({type(exc).__name__}: {' '.join(str(exc).split())})")
                continue
            answered.append(where)
            known.update(str(m) for m in masters)
        if not answered:
            return "Redis Sentinel: no sentinel of REDIS_SENTINELS answers: " + "; ".join(unreachable)
        if service_name not in known:
            names = ", ".join(repr(n) for n in sorted(known)) or "nothing"
            return (
                f"Redis Sentinel: no primary named {service_name!r} (REDIS_SENTINEL_SERVICE); "
                f"the sentinels at {', '.join(answered)} monitor {names}"
            )
        return (
            f"Redis Sentinel: the primary of {service_name!r} is down and no replica is promoted yet "
            f"(a failover in progress, or too few sentinels agree); asked {', '.join(answered)}"
        )


def client_for_url(url: str, **extra: Any) -> aioredis.Redis:
    """A client on a bounded pool that waits for a free connection rather than failing when all are busy."""
    pool = aioredis.BlockingConnectionPool.from_url(url, max_connections=MAX_CONNECTIONS, timeout=POOL_WAIT_S, **extra)
    return aioredis.Redis.from_pool(pool)  # closing the client closes its pool


def redis_client(settings: RedisSettings) -> aioredis.Redis:
    """The one place a service builds its Redis client: a plain URL, or the Sentinel client that follows failovers."""
    if settings.sentinel is None:
        extra: dict[str, Any] = {}
        if settings.username:
            extra["username"] = settings.username
        if settings.password:
            extra["password"] = settings.password
        return client_for_url(settings.url, **extra)  # the URL's own user and password win
    s = settings.sentinel
    sentinel_kwargs: dict[str, Any] = {
        "socket_connect_timeout": CONNECT_TIMEOUT_S,
        "socket_timeout": CONNECT_TIMEOUT_S,
        "retry": Retry(NoBackoff(), 0),  # the next sentinel is the retry (redis-py's default backs off for seconds)
    }
    if s.sentinel_username:
        sentinel_kwargs["username"] = s.sentinel_username
    if s.sentinel_password:
        sentinel_kwargs["password"] = s.sentinel_password
    sentinel = _ExplainingSentinel(list(s.sentinels), sentinel_kwargs=sentinel_kwargs)  # type: ignore[no-untyped-call]
    data_kwargs: dict[str, Any] = {
        "db": s.db,
        "socket_connect_timeout": CONNECT_TIMEOUT_S,
        # A WAIT blocks up to its timeout: the socket must wait longer than that.
        "socket_timeout": max(SOCKET_TIMEOUT_S, settings.wait_timeout_ms / 1000 + 5),
        "check_connection": True,  # PING a new connection: a primary that is not there fails at once
    }
    if settings.username:
        data_kwargs["username"] = settings.username
    if settings.password:
        data_kwargs["password"] = settings.password
    client: aioredis.Redis = sentinel.master_for(s.service, **data_kwargs)
    return client
