"""Redis gang reservations: one Lua commit for a whole gang, leases and fencing tokens."""

from .keys import KeySpace
from .store import DEFAULT_LEASE_S, Conflict, HistoryEntry, Reservation, ReservationStore, check_history

__all__ = [
    "DEFAULT_LEASE_S",
    "Conflict",
    "HistoryEntry",
    "KeySpace",
    "Reservation",
    "ReservationStore",
    "check_history",
]
