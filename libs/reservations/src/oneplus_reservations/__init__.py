"""Redis gang reservations: one Lua commit for a whole gang, leases and fencing tokens."""

from .connect import RedisSettings, SentinelSettings, parse_sentinels, redis_client
from .keys import KeySpace
from .scripts import EPOCH_SPAN
from .store import (
    DEFAULT_LEASE_S,
    NOT_REPLICATED,
    STORE_RESET,
    Conflict,
    HistoryEntry,
    RenewStatus,
    Reservation,
    ReservationStore,
    Token,
    check_history,
    store_order,
)

__all__ = [
    "DEFAULT_LEASE_S",
    "EPOCH_SPAN",
    "NOT_REPLICATED",
    "STORE_RESET",
    "Conflict",
    "HistoryEntry",
    "KeySpace",
    "RedisSettings",
    "RenewStatus",
    "Reservation",
    "ReservationStore",
    "SentinelSettings",
    "Token",
    "check_history",
    "parse_sentinels",
    "redis_client",
    "store_order",
]
