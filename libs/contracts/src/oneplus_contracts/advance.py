"""An advance reservation (Slurm's `scontrol create reservation`): nodes set aside for a time window.

Named "advance" to keep it apart from the Redis gang reservations (`oneplus_reservations`) and the head-of-line
block (`oneplus_queueing.model.Reservation`)."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import Field, field_validator, model_validator

from .jobspec import Strict, _unset, host_names

MAX_TS = 253402300799.0  # 9999-12-31T23:59:59Z: a later time is no date (and no `time.gmtime` can write it)
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def check_name(v: str) -> str:
    if not _NAME_RE.match(v):
        raise ValueError(f"reservation name {v!r} must be 1-64 letters, digits, '.', '_' or '-'")
    return v


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
    gpus: Annotated[int, Field(ge=1)] | None = Field(
        default=None,
        exclude_if=_unset,
        description="The GPUs asked for (Slurm's TRES=gres/gpu=N): its nodes were picked to hold them at creation",
    )

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return check_name(v)

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


class AdvanceReservationRequest(Strict):
    """What `oneplus reservation create` and `POST /v1/reservations` send: nodes, or a GPU count the intake turns
    into whole nodes free for the window (`oneplus_queueing.advance.pick_nodes`)."""

    name: str
    nodes: list[str] = Field(default_factory=list, description="The nodes to set aside (names or a hostlist)")
    gpus: Annotated[int, Field(ge=1, le=1_000_000)] | None = Field(
        default=None, description="Or how many GPUs: whole nodes holding at least that many are picked"
    )
    start_ts: Annotated[float, Field(ge=0, le=MAX_TS)] = Field(description="When it starts (Unix seconds)")
    end_ts: Annotated[float, Field(ge=0, le=MAX_TS)] = Field(description="When it ends (Unix seconds)")
    users: list[str] = Field(default_factory=list)
    teams: list[str] = Field(default_factory=list)
    accounts: list[str] = Field(default_factory=list)
    maint: bool = False

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return check_name(v)

    @field_validator("nodes", mode="before")
    @classmethod
    def _nodes(cls, v: object) -> object:
        return host_names("nodes", v) if v else []

    @model_validator(mode="after")
    def _one_of(self) -> AdvanceReservationRequest:
        if bool(self.nodes) == (self.gpus is not None):
            raise ValueError(f"reservation {self.name}: give nodes or a GPU count, one of them")
        if self.end_ts <= self.start_ts:
            raise ValueError(f"reservation {self.name}: ends before it starts")
        if not (self.users or self.teams or self.accounts):
            raise ValueError(f"reservation {self.name}: admits nobody; give users, teams or accounts")
        return self

    def reservation(self, nodes: list[str], created_ts: float) -> AdvanceReservation:
        """The reservation to store, on `nodes` (the request's, or those picked for its GPU count)."""
        return AdvanceReservation(
            name=self.name,
            nodes=nodes,
            start_ts=self.start_ts,
            end_ts=self.end_ts,
            users=self.users,
            teams=self.teams,
            accounts=self.accounts,
            maint=self.maint,
            created_ts=created_ts,
            gpus=self.gpus,
        )
