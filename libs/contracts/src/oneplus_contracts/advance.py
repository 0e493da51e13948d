"""An advance reservation (Slurm's `scontrol create reservation`): nodes set aside for a time window.

Named "advance" to keep it apart from the Redis gang reservations (`oneplus_reservations`) and the head-of-line
block (`oneplus_queueing.model.Reservation`)."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import Field, field_validator, model_validator

from .jobspec import Strict, host_names

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class AdvanceReservation(Strict):
    name: str
    nodes: list[str] = Field(description="The nodes set aside (names or a hostlist 'gpu[01-04]')")
    start_ts: Annotated[float, Field(ge=0)] = Field(description="When it starts (Unix seconds)")
    end_ts: Annotated[float, Field(ge=0)] = Field(description="When it ends (Unix seconds)")
    users: list[str] = Field(default_factory=list, description="Users admitted (a job's spec.user)")
    teams: list[str] = Field(default_factory=list, description="Teams admitted (a job's spec.team)")
    accounts: list[str] = Field(default_factory=list, description="Slurm accounts admitted (a job's --account)")
    maint: bool = Field(default=False, description="A maintenance window (Slurm's MAINT flag)")
    created_ts: float = 0.0

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME_RE.match(v):
            raise ValueError(f"reservation name {v!r} must be 1-64 letters, digits, '.', '_' or '-'")
        return v

    @field_validator("nodes", mode="before")
    @classmethod
    def _nodes(cls, v: object) -> object:
        return host_names("nodes", v)

    @model_validator(mode="after")
    def _coherent(self) -> AdvanceReservation:
        if not self.nodes:
            raise ValueError(f"reservation {self.name}: names no node")
        if self.end_ts <= self.start_ts:
            raise ValueError(f"reservation {self.name}: ends before it starts")
        if not (self.users or self.teams or self.accounts):
            raise ValueError(f"reservation {self.name}: admits nobody; give users, teams or accounts")
        return self

    def active(self, now: float) -> bool:
        return self.start_ts <= now < self.end_ts

    def admits(self, user: str, team: str, account: str | None) -> bool:
        return user in self.users or team in self.teams or (account is not None and account in self.accounts)
