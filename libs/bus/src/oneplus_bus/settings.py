"""Where the bus and the reservation store are, from the environment.

Transport only: how to reach Redis beyond its URL (Sentinel, credentials, the commit rule) is the reservation
store's to read (`oneplus_reservations.connect.RedisSettings.of_bus`), so that this package depends on no domain
library."""

from __future__ import annotations

import os
from dataclasses import dataclass

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


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
    # True: Sentinel, credentials and the commit rule come from REDIS_* (`RedisSettings.of_bus`); False: just the URL.
    redis_from_env: bool = False

    @property
    def nats_servers(self) -> list[str]:
        """Every server NATS_URL names (comma-separated), for a client that fails over between them."""
        return nats_servers(self.nats_url)

    @classmethod
    def from_env(cls) -> BusSettings:
        return cls(
            nats_url=os.environ.get("NATS_URL", "nats://127.0.0.1:4222"),
            redis_url=os.environ.get("REDIS_URL") or DEFAULT_REDIS_URL,
            redis_from_env=True,
            cluster=os.environ.get("ONEPLUS_CLUSTER", "default"),
            max_deliver=_max_deliver(os.environ.get("ONEPLUS_MAX_DELIVER", "").strip() or "5"),
            inbox_prefix=os.environ.get("ONEPLUS_INBOX_PREFIX", "_INBOX"),
        )


def _max_deliver(raw: str) -> int:
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"ONEPLUS_MAX_DELIVER={raw!r}: a whole number of deliveries, 1 or more")
    return int(raw)
