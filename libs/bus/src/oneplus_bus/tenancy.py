"""Who is asking: the team a request acts for, and whether the caller could have chosen another.

In production each team is its own NATS account that imports the platform's services with `share: true`
(deploy/nats/accounts.conf); the server then stamps every request with `Nats-Request-Info`, naming the
account and user, and overwrites any such header the client sent. That account name is the team. Inside the
platform account (operators, the dev stack) nothing is stamped and the `Oneplus-Team` header, set by the
client, is taken as given; without it the caller is an operator who sees every team.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from oneplus_contracts import JobSpec
from pydantic import ValidationError

TEAM_HEADER = "Oneplus-Team"
REQUEST_INFO_HEADER = "Nats-Request-Info"
# Accounts whose requests are the platform's own: `$G` is the account of a server without accounts.
PLATFORM_ACCOUNTS = frozenset({"PLATFORM", "$G"})
# The contract's defaults; a spec that keeps them takes the caller's team and user instead.
DEFAULT_TEAM = JobSpec.model_fields["team"].default
DEFAULT_USER = JobSpec.model_fields["user"].default


class TenancyError(ValueError):
    """A request that acts for a team it does not belong to, or names its team unreadably."""

    def __init__(self, message: str, code: int = 403) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Caller:
    team: str | None  # None: an operator of the platform, who sees and may cancel every team's jobs
    user: str | None = None
    account: str | None = None  # set when the NATS server named the caller's account

    @property
    def bound(self) -> bool:
        """True when the team comes from the caller's NATS account and cannot be chosen."""
        return self.account is not None

    def sees(self, team: str) -> bool:
        return self.team is None or self.team == team


def _header(headers: Mapping[str, str], name: str) -> str | None:
    wanted = name.lower()
    for key, value in headers.items():
        if key.lower() == wanted:
            return value
    return None


def _request_info(raw: str) -> dict[str, Any]:
    try:
        info = json.loads(raw)
    except (json.JSONDecodeError, RecursionError, ValueError):
        raise TenancyError(f"header {REQUEST_INFO_HEADER} is not JSON", 400) from None
    if not isinstance(info, dict):
        raise TenancyError(f"header {REQUEST_INFO_HEADER} must be a JSON object", 400)
    return info


def caller_of(
    headers: Mapping[str, str] | None,
    claimed: Any = None,
    *,
    platform_accounts: frozenset[str] = PLATFORM_ACCOUNTS,
) -> Caller:
    """The caller of one request: `claimed` is a team named in the payload (older clients put it there)."""
    headers = headers or {}
    header_team = _header(headers, TEAM_HEADER)
    if claimed is not None and not isinstance(claimed, str):
        raise TenancyError(f"team must be a string, got {type(claimed).__name__}", 400)
    if header_team and claimed and header_team != claimed:
        raise TenancyError(f"header {TEAM_HEADER} says {header_team!r} but the request names team {claimed!r}", 400)
    wanted = header_team or claimed or None
    raw_info = _header(headers, REQUEST_INFO_HEADER)
    if raw_info:
        info = _request_info(raw_info)
        account = info.get("acc")
        if isinstance(account, str) and account and account not in platform_accounts:
            user = info.get("user")
            if wanted and wanted != account:
                raise TenancyError(f"NATS account {account!r} acts for team {account!r} only, not {wanted!r}")
            return Caller(team=account, user=user if isinstance(user, str) else None, account=account)
    return Caller(team=wanted)


def bind_team(spec: JobSpec, caller: Caller) -> JobSpec:
    """The spec as the caller may submit it: its team is the caller's (the contract default is replaced)."""
    if caller.team is None:
        return spec
    if spec.team not in (DEFAULT_TEAM, caller.team):
        raise TenancyError(f"the job names team {spec.team!r} but the request comes from team {caller.team!r}")
    fields = spec.model_dump()
    fields["team"] = caller.team
    if caller.user and spec.user == DEFAULT_USER:
        fields["user"] = caller.user
    try:
        return JobSpec.model_validate(fields)
    except ValidationError as exc:  # an account or user name that is not a valid team or user name
        problem = exc.errors()[0]["msg"]
        raise TenancyError(f"the caller's team {caller.team!r} or user is not a valid name: {problem}", 400) from None
