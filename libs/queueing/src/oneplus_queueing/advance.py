"""Advance reservations in the cycle and at their creation (pure).

A job with `--reservation R` runs only on R's nodes and only while R is active. Every other job stays off R's nodes
while R is active, and, before R starts, off them unless its time limit ends it by R's start: so a maintenance
window's nodes empty in time (backfill plans around it with time limits) instead of being drained at its start.
Both are node filters on the job's spec (`nodelist` / `exclude_nodes`), read by placement's eligibility."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

from oneplus_contracts import JobSpec
from oneplus_contracts.advance import AdvanceReservation
from oneplus_contracts.slurm import compress_hostlist

from .explain import fmt_ts
from .model import PendingJob, PendingReason

START_SLACK_S = 60.0  # a start this far in the past still counts as "now" (a clock skew, a slow command)


class AdvanceReservationError(ValueError):
    """A reservation that cannot be created, or a job that cannot use the one it names; one line, naming it.
    `code`: the HTTP-like status of the refusal (400 a bad value, 409 a conflict with what exists)."""

    def __init__(self, message: str, code: int = 400) -> None:
        super().__init__(message)
        self.code = code


def _wait(seconds: float) -> str:
    h, rest = divmod(int(max(0.0, seconds) + 0.999), 3600)
    return f"{h}h {rest // 60:02d}m" if h else f"{rest // 60}m {rest % 60:02d}s"


def check_window(name: str, start_ts: float, end_ts: float, now: float) -> None:
    """Refuse a window that has ended or that starts in the past (beyond a minute's slack)."""
    if end_ts <= now:
        raise AdvanceReservationError(f"reservation {name} ends at {fmt_ts(end_ts)}, which is in the past")
    if start_ts < now - START_SLACK_S:
        raise AdvanceReservationError(
            f"reservation {name} starts at {fmt_ts(start_ts)}, which is in the past; start it now or later"
        )


def check_new(
    new: AdvanceReservation,
    existing: Iterable[AdvanceReservation],
    now: float,
    known_nodes: Iterable[str] | None = None,
) -> None:
    """Refuse a reservation in the past, on nodes the cluster does not have, with a taken name, or overlapping in
    time one that holds any of the same nodes."""
    check_window(new.name, new.start_ts, new.end_ts, now)
    if known_nodes is not None:
        known = set(known_nodes)
        unknown = [n for n in new.nodes if n not in known]
        if known and unknown:
            have = compress_hostlist(known)
            raise AdvanceReservationError(
                f"reservation {new.name}: node {unknown[0]!r} is not in this cluster (it has {have})"
            )
    for other in existing:
        if other.name == new.name:
            raise AdvanceReservationError(f"reservation {new.name} already exists; delete it first", 409)
        shared = set(other.nodes) & set(new.nodes)
        if shared and new.start_ts < other.end_ts and other.start_ts < new.end_ts:
            raise AdvanceReservationError(
                f"reservation {new.name} overlaps reservation {other.name} on {compress_hostlist(shared)} "
                f"({fmt_ts(other.start_ts)} to {fmt_ts(other.end_ts)})",
                409,
            )


def pick_nodes(
    name: str,
    gpus: int,
    start_ts: float,
    end_ts: float,
    gpus_of: Mapping[str, int],
    existing: Iterable[AdvanceReservation],
) -> list[str]:
    """Whole nodes holding at least `gpus` GPUs that no other reservation holds in [start_ts, end_ts) (Slurm's
    `TRES=gres/gpu=N`). Deterministic: the smallest node that holds them all, else the largest nodes first (by
    name on ties) until the count is reached, the last one swapped for the smallest that still reaches it; so a
    reservation takes few nodes and few spare GPUs."""
    held: dict[str, str] = {}
    for other in existing:
        if other.name != name and other.start_ts < end_ts and start_ts < other.end_ts:
            for n in other.nodes:
                held.setdefault(n, other.name)
    free = {n: g for n, g in gpus_of.items() if n not in held and g > 0}
    whole = sorted((g, n) for n, g in free.items() if g >= gpus)
    if whole:
        return [whole[0][1]]
    picked: list[str] = []
    total = 0
    for n, g in sorted(free.items(), key=lambda kv: (-kv[1], kv[0])):
        picked.append(n)
        total += g
        if total >= gpus:
            # The last node only tops the count up: the smallest free node that still does it (fewer spare GPUs).
            need = gpus - (total - g)
            last = min((free[m], m) for m in free if m not in picked[:-1] and free[m] >= need)[1]
            return sorted([*picked[:-1], last])
    in_all = sum(g for g in gpus_of.values() if g > 0)
    held_note = ""
    if held:
        by = sorted(set(held.values()))
        held_note = f"; {compress_hostlist(held)} held by reservation {', '.join(by)}"
    raise AdvanceReservationError(
        f"reservation {name}: {gpus} GPUs asked but only {total} are free of other reservations from "
        f"{fmt_ts(start_ts)} to {fmt_ts(end_ts)} (the cluster has {in_all}{held_note})",
        409,
    )


def account_of(spec: JobSpec) -> str | None:
    return spec.slurm.account if spec.slurm is not None else None


def check_job(spec: JobSpec, reservations: Iterable[AdvanceReservation], now: float) -> None:
    """At submission: `--reservation` names one that exists, has not ended and admits the job's user or team."""
    if spec.reservation is None:
        return
    found = next((r for r in reservations if r.name == spec.reservation), None)
    if found is None:
        raise AdvanceReservationError(f"--reservation {spec.reservation}: no such reservation")
    if found.end_ts <= now:
        raise AdvanceReservationError(f"--reservation {spec.reservation}: it ended at {fmt_ts(found.end_ts)}")
    if not found.admits(spec.user, spec.team, account_of(spec)):
        raise AdvanceReservationError(
            f"--reservation {spec.reservation} does not admit user {spec.user} (team {spec.team})"
        )


def steer(
    now: float,
    pending: Sequence[PendingJob],
    reservations: Sequence[AdvanceReservation],
    default_time_limit_s: float | None,
    reasons: dict[str, PendingReason],
) -> list[PendingJob]:
    """The pending jobs the cycle may place, their specs kept to the nodes the reservations leave them; a job whose
    reservation is missing, not admitting it, not started or over waits with `Reservation` and is not ranked."""
    live = [r for r in reservations if r.end_ts > now]
    if not live and not any(p.spec.reservation is not None for p in pending):
        return list(pending)
    by_name = {r.name: r for r in reservations}
    out: list[PendingJob] = []
    for p in pending:
        spec = p.spec
        if spec.reservation is not None:
            res = by_name.get(spec.reservation)
            why = _why_not_inside(spec, res, now)
            if why is not None:
                reasons[p.job_id] = PendingReason(p.job_id, "Reservation", why)
                continue
            assert res is not None
            inside = [n for n in res.nodes if not spec.nodelist or n in spec.nodelist]
            out.append(_with(p, nodelist=inside, exclude=spec.exclude_nodes))
            continue
        limit = spec.time_limit_s if spec.time_limit_s is not None else default_time_limit_s
        end = None if limit is None else now + limit
        keep_off = {n for r in live if r.active(now) or end is None or end > r.start_ts for n in r.nodes}
        if keep_off - set(spec.exclude_nodes):
            out.append(_with(p, nodelist=spec.nodelist, exclude=sorted(keep_off | set(spec.exclude_nodes))))
        else:
            out.append(p)
    return out


def _why_not_inside(spec: JobSpec, res: AdvanceReservation | None, now: float) -> str | None:
    name = spec.reservation
    if res is None:
        return f"reservation {name} does not exist (deleted?)"
    if not res.admits(spec.user, spec.team, account_of(spec)):
        return f"reservation {name} does not admit user {spec.user} (team {spec.team})"
    if now < res.start_ts:
        return f"waiting for reservation {name} to start at {fmt_ts(res.start_ts)} (in {_wait(res.start_ts - now)})"
    if now >= res.end_ts:
        return f"reservation {name} ended at {fmt_ts(res.end_ts)}"
    return None


def _with(p: PendingJob, *, nodelist: list[str], exclude: list[str]) -> PendingJob:
    spec = p.spec.model_copy(update={"nodelist": nodelist, "exclude_nodes": exclude})
    return PendingJob(p.job_id, spec, p.submitted_ts, p.preemptions, p.checkpoint_ts)


def window_rows(now: float, reservations: Iterable[AdvanceReservation]) -> list[dict[str, object]]:
    """What `oneplus reservation list` and `queue` show of each: name, state, nodes, window, who is admitted."""
    rows: list[dict[str, object]] = []
    for r in sorted(reservations, key=lambda r: (r.start_ts, r.name)):
        state = "ACTIVE" if r.active(now) else ("ENDED" if now >= r.end_ts else "WAITING")
        rows.append(
            {
                "name": r.name,
                "state": state,
                "nodes": compress_hostlist(r.nodes),
                "start": fmt_ts(r.start_ts),
                "end": fmt_ts(r.end_ts),
                "users": ",".join(r.users),
                "teams": ",".join(r.teams),
                "accounts": ",".join(r.accounts),
                "maint": r.maint,
                "gpus": r.gpus,
            }
        )
    return rows


_WAITS_ON = re.compile(r"\breservation (\S+?)[ ,:;)]")  # the name in a pending job's Reservation message


def waiting_on(queue_rows: Iterable[Mapping[str, object]]) -> dict[str, int]:
    """How many pending jobs of the queue's rows wait on each reservation (their reason is `Reservation` and its
    message names it): what `oneplus queue` and the dashboard show beside each reservation."""
    counts: dict[str, int] = {}
    for row in queue_rows:
        if row.get("reason") == "Reservation":
            found = _WAITS_ON.search(f"{row.get('message') or ''} ")
            if found:
                counts[found.group(1)] = counts.get(found.group(1), 0) + 1
    return counts


def live_rows(
    reservations: Iterable[Mapping[str, object]], queue_rows: Iterable[Mapping[str, object]]
) -> list[dict[str, object]]:
    """The reservations active or to come (`window_rows` rows, not ENDED), each with `waiting`: its pending jobs."""
    waiting = waiting_on(queue_rows)
    return [dict(r) | {"waiting": waiting.get(str(r["name"]), 0)} for r in reservations if r.get("state") != "ENDED"]


class AdvanceBook:
    """The reservations a service follows from the `advance_reservations` bucket (key: the name)."""

    def __init__(self) -> None:
        self.by_name: dict[str, AdvanceReservation] = {}

    def apply(self, key: str, value: bytes | None) -> str | None:
        """Take one change of the bucket; the reason when a stored entry is unreadable (it is then left out)."""
        if not value:
            self.by_name.pop(key, None)
            return None
        try:
            self.by_name[key] = AdvanceReservation.model_validate_json(value)
        except ValueError as exc:
            self.by_name.pop(key, None)
            return f"advance reservation {key!r} is unreadable, left out: {exc}"
        return None

    @property
    def all(self) -> list[AdvanceReservation]:
        return list(self.by_name.values())
