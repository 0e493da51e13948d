"""Where the bus and the reservation store are, from the environment."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class BusSettings:
    nats_url: str
    redis_url: str
    cluster: str = "default"
    max_deliver: int = 5
    # Replies and push deliveries arrive under this prefix; a user allowed only its own prefix cannot read others'.
    inbox_prefix: str = "_INBOX"

    @classmethod
    def from_env(cls) -> BusSettings:
        return cls(
            nats_url=os.environ.get("NATS_URL", "nats://127.0.0.1:4222"),
            redis_url=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
            cluster=os.environ.get("ONEPLUS_CLUSTER", "default"),
            max_deliver=int(os.environ.get("ONEPLUS_MAX_DELIVER", "5")),
            inbox_prefix=os.environ.get("ONEPLUS_INBOX_PREFIX", "_INBOX"),
        )
