"""sbatch's where-and-when options: `--nodelist`/`--exclude` (placement filters) and `--begin` (not before a time)."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Any

from oneplus_contracts.jobspec import host_names

from .sbatch_options import Option, SbatchJob

_UNITS = {"": 1, "s": 1, "sec": 1, "second": 1, "seconds": 1, "m": 60, "min": 60, "minute": 60, "minutes": 60,
          "h": 3600, "hour": 3600, "hours": 3600, "d": 86400, "day": 86400, "days": 86400, "w": 604800,
          "week": 604800, "weeks": 604800}  # fmt: skip
_RELATIVE = re.compile(r"^now(?:\+(\d{1,9})([a-z]*))?$")
_CLOCK = re.compile(r"^(\d{1,2}):(\d{2})(?::(\d{2}))?$")
_DATE = re.compile(r"^(\d{4})-(\d{2})-(\d{2})(?:T(\d{1,2}):(\d{2})(?::(\d{2}))?)?$")
_NAMED = {"midnight": (0, 0), "noon": (12, 0), "teatime": (16, 0)}
BEGIN_FORMS = "now+N[seconds|minutes|hours|days|weeks], HH:MM[:SS], YYYY-MM-DD[THH:MM[:SS]], today, tomorrow, "
BEGIN_FORMS += "midnight, noon or teatime"


def where_fields(job: SbatchJob, fields: dict[str, Any], now: float) -> None:
    """`--nodelist`/`-w`, `--exclude`/`-x`, `--reservation` and `--begin`/`-b` into the spec's nodelist,
    exclude_nodes, reservation and begin_at."""
    for option, key in (("nodelist", "nodelist"), ("exclude", "exclude_nodes")):
        opt = job.raw(option)
        if opt is None:
            continue
        try:
            fields[key] = host_names(option, (opt.value or "").strip())
        except ValueError as exc:
            raise job.fail(opt, str(exc).split(": ", 1)[-1]) from None
        if not fields[key]:
            raise job.fail(opt, "names no node")
    opt = job.raw("reservation")
    if opt is not None:
        name = (opt.value or "").strip()
        if not name or "," in name:
            raise job.fail(opt, "names one reservation (OnePlus takes no list)")
        fields["reservation"] = name
    opt = job.raw("begin")
    if opt is not None:
        fields["begin_at"] = begin_time(job, opt, now)


def begin_time(job: SbatchJob, opt: Option, now: float) -> float:
    """Slurm's --begin forms, in this machine's local time; a clock time already past today is tomorrow's."""
    text = (opt.value or "").strip().lower()
    today = datetime.fromtimestamp(now).replace(hour=0, minute=0, second=0, microsecond=0)
    m = _RELATIVE.match(text)
    if m:
        count, unit = m[1], m[2] or ""
        if unit not in _UNITS:
            raise job.fail(opt, f"unknown time unit {unit!r}; use seconds, minutes, hours, days or weeks")
        return now + int(count or 0) * _UNITS[unit]
    if text in ("today", "tomorrow"):
        return (today + timedelta(days=1 if text == "tomorrow" else 0)).timestamp()
    clock = _CLOCK.match(text)
    hm = _NAMED.get(text)
    if clock or hm:
        h, mi, s = (int(clock[1]), int(clock[2]), int(clock[3] or 0)) if clock else (*(hm or (0, 0)), 0)
        if h > 23 or mi > 59 or s > 59:
            raise job.fail(opt, f"{opt.value!r} is not a time of day")
        at = today.replace(hour=h, minute=mi, second=s)
        return (at if at.timestamp() > now else at + timedelta(days=1)).timestamp()
    d = _DATE.match(text.upper())
    if d:
        try:
            y, mo, day, h, mi, sec = (int(x or 0) for x in d.groups())
            at = datetime(y, mo, day, h, mi, sec)
        except ValueError:
            raise job.fail(opt, f"{opt.value!r} is not a date") from None
        return at.timestamp()
    raise job.fail(opt, f"{opt.value!r} is not a time sbatch --begin takes here ({BEGIN_FORMS})")
