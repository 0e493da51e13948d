"""Each service's settings: one typed object built once at bootstrap from the `ONEPLUS_*` environment.

A service's class derives from `ServiceSettings` (pydantic-settings, prefix `ONEPLUS_`: field `min_job_age_s` is
`ONEPLUS_MIN_JOB_AGE_S`). `load()` turns a bad value into one `SettingsError` line naming the variable and the value;
`load_or_exit()` is what a service's `main` calls, so a bad value stops it at start with that line and nothing else.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Self

from pydantic import AfterValidator, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

ENV_PREFIX = "ONEPLUS_"


class SettingsError(ValueError):
    """An environment variable that cannot be used; the message names it and its value."""


# What a value failed to be, in the words an operator reads (pydantic's error types).
_PLAIN = {
    "int_parsing": "not an integer",
    "int_from_float": "not an integer",
    "float_parsing": "not a number",
    "bool_parsing": "not a boolean (1/0, true/false, yes/no)",
    "missing": "required",
}


def _readable_file(path: str) -> str:
    if not Path(path).is_file():
        raise ValueError("no such file")
    return path


# A file the service reads at start (a config): one that is not there is a bad value, not a later traceback.
ReadableFile = Annotated[str, AfterValidator(_readable_file)]


class ServiceSettings(BaseSettings):
    # An empty variable counts as unset (compose files and manifests write `ONEPLUS_X: ""` for "the default").
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, extra="ignore", frozen=True, populate_by_name=True, env_ignore_empty=True
    )

    @classmethod
    def load(cls, env: Mapping[str, str] | None = None) -> Self:
        """From `env` (a mapping of `ONEPLUS_*` names; default the process environment); a bad value raises one
        `SettingsError` line: `ONEPLUS_X='value': what it must be`."""
        try:
            if env is None:
                return cls()  # pydantic-settings reads the process environment
            # A given mapping is validated alone, not mixed with the process environment.
            return cls.model_validate(cls._by_field({k.upper(): v for k, v in env.items() if v}))
        except ValidationError as exc:
            raise SettingsError(_one_line(cls, exc)) from None

    @classmethod
    def _by_field(cls, values: dict[str, str]) -> dict[str, Any]:
        """The mapping's values under the fields that read them."""
        return {field: values[env_name(cls, field)] for field in cls.model_fields if env_name(cls, field) in values}

    @classmethod
    def load_or_exit(cls) -> Self:
        """At a service's start: the settings, or the bad value's one line on stderr and exit status 2 (the
        scaffold's own variables, ONEPLUS_STREAM_REPLICAS and the rest, are checked first)."""
        try:
            problem = scaffold_problem()
            if problem is not None:
                raise SettingsError(problem)
            return cls.load()
        except SettingsError as exc:
            print(f"error: {exc}", file=sys.stderr)
            raise SystemExit(2) from None


def scaffold_problem() -> str | None:
    """The first bad value among the variables the bus scaffold of every service reads (streams, metrics, logs,
    GC, NATS/Redis), in its reader's own words, or None: checked at start rather than when first read."""
    from .logs import log_settings_from_env
    from .metrics import metrics_host_from_env, metrics_port_from_env
    from .service import gc_gen0_from_env
    from .settings import BusSettings
    from .streams import stream_replicas

    readers = (stream_replicas, metrics_port_from_env, metrics_host_from_env, log_settings_from_env, gc_gen0_from_env)
    for read in (*readers, BusSettings.from_env):
        try:
            read()
        except ValueError as exc:
            return str(exc)
    return None


def env_name(cls: type[BaseSettings], field_name: str) -> str:
    """The environment variable a field of `cls` reads: its alias (a whole name, as pydantic-settings takes it),
    else the prefix and its name."""
    info = cls.model_fields.get(field_name)
    return (info.alias if info is not None and info.alias else ENV_PREFIX + field_name).upper()


_RANGE_ERRORS = {"greater_than", "greater_than_equal", "less_than", "less_than_equal"}


def _bounds(cls: type[BaseSettings], field_name: str) -> str | None:
    """A field's range in words (`between 1 and 4096`, `at least 0`), from its Field(ge=..., le=...)."""
    info = next((i for n, i in cls.model_fields.items() if field_name in (n, i.alias)), None)
    if info is None:
        return None
    low = high = None
    for rule in info.metadata:
        low = getattr(rule, "ge", None) if getattr(rule, "ge", None) is not None else low
        high = getattr(rule, "le", None) if getattr(rule, "le", None) is not None else high
        if getattr(rule, "gt", None) is not None:
            return f"must be above {rule.gt}" + (f" and at most {high}" if high is not None else "")
    if low is not None and high is not None:
        return f"must be between {low} and {high}"
    if low is not None:
        return f"must be at least {low}"
    return f"must be at most {high}" if high is not None else None


def _one_line(cls: type[BaseSettings], exc: ValidationError) -> str:
    err = exc.errors()[0]
    # pydantic's own words for a custom check start "Value error, "; the rest is ours.
    what = _PLAIN.get(err["type"], str(err["msg"])).removeprefix("Value error, ")
    if not err["loc"]:
        return what  # a check across fields: its message names the variables
    field = str(err["loc"][0])
    name = field.upper() if field.upper().startswith(ENV_PREFIX) else env_name(cls, field)
    if err["type"] in _RANGE_ERRORS:
        what = _bounds(cls, field) or what
    return f"{name}={err.get('input')!r}: {what}"
