"""The reservation audit: what the solver did to the reservation store, kept in JetStream where a reset of Redis
cannot erase it."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .events import RankPlacement
from .jobspec import Strict


class ReservationAudit(Strict):
    """One reservation taken (`reserve`), put back after a store reset (`restore`) or freed (`release`)."""

    op: Literal["reserve", "restore", "release"]
    job_id: str
    token: int
    ranks: list[RankPlacement] = Field(default_factory=list, description="What it holds (empty for a release)")
    reason: str = ""
    epoch: int = 0
    ts: float
    store_at: str = Field(
        default="",
        description="Where the operation sits in the store's own order (`<epoch>:<history stream id>`); the audit "
        "is replayed in this order, since several solver replicas' entries reach JetStream in any order. Empty when "
        "unknown (a restore, or a release the store did not confirm).",
    )
