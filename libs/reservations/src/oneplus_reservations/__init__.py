"""Redis gang reservations: one Lua commit for a whole gang, leases and fencing tokens."""

from .keys import KeySpace
from .scripts import EPOCH_SPAN
from .store import (
    DEFAULT_LEASE_S,
    STORE_RESET,
    Conflict,
    HistoryEntry,
    RenewStatus,
    Reservation,
    ReservationStore,
    check_history,
)

__all__ = [
    "DEFAULT_LEASE_S",
    "EPOCH_SPAN",
    "STORE_RESET",
    "Conflict",
    "HistoryEntry",
    "KeySpace",
    "RenewStatus",
    "Reservation",
    "ReservationStore",
    "check_history",
]
