"""Where the bus and the reservation store are, from the environment."""

from __future__ import annotations

import os
from dataclasses import dataclass

from oneplus_reservations.connect import RedisSettings


def nats_servers(url: str) -> list[str]:
    """The servers of a NATS_URL: one URL, or a comma-separated list (every server of a cluster).

    nats-py and FastStream take the list as their `servers`; handed the whole string they fail to connect.
    """
    servers = [part.strip() for part in url.split(",") if part.strip()]
    if not servers:
        raise ValueError(f"NATS_URL={url!r} names no server")
    return servers


@dataclass(frozen=True)
class BusSettings:
    nats_url: str
    redis_url: str
    cluster: str = "default"
    max_deliver: int = 5
    # Replies and push deliveries arrive under this prefix; a user allowed only its own prefix cannot read others'.
    inbox_prefix: str = "_INBOX"
    # Sentinel, credentials and the commit rule (REDIS_SENTINELS, ...); None: just `redis_url`.
    redis_options: RedisSettings | None = None

    @property
    def redis(self) -> RedisSettings:
        """How to reach Redis: hand it to `ReservationStore.connect` / `oneplus_reservations.redis_client`."""
        return self.redis_options if self.redis_options is not None else RedisSettings(url=self.redis_url)

    @property
    def nats_servers(self) -> list[str]:
        """Every server NATS_URL names (comma-separated), for a client that fails over between them."""
        return nats_servers(self.nats_url)

    @classmethod
    def from_env(cls) -> BusSettings:
        redis = RedisSettings.from_env()
        return cls(
            nats_url=os.environ.get("NATS_URL", "nats://127.0.0.1:4222"),
            redis_url=redis.url,
            redis_options=redis,
            cluster=os.environ.get("ONEPLUS_CLUSTER", "default"),
            max_deliver=_max_deliver(os.environ.get("ONEPLUS_MAX_DELIVER", "").strip() or "5"),
            inbox_prefix=os.environ.get("ONEPLUS_INBOX_PREFIX", "_INBOX"),
        )


def _max_deliver(raw: str) -> int:
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"ONEPLUS_MAX_DELIVER={raw!r}: a whole number of deliveries, 1 or more")
    return int(raw)
