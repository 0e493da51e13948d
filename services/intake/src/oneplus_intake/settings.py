"""The intake's HTTP and webhook settings, from the environment."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from oneplus_bus.tenancy import PLATFORM_ACCOUNTS

DEFAULT_HTTP_PORT = 8080


class SettingsError(ValueError):
    """An environment variable that cannot be used; the message names it."""


@dataclass(frozen=True)
class IntakeSettings:
    http_host: str = "127.0.0.1"
    http_port: int | None = DEFAULT_HTTP_PORT  # None: no HTTP listener
    http_port_explicit: bool = False  # a port someone asked for must bind; the default may be taken
    mlflow_secret: str = ""
    mlflow_templates: Path | None = None
    replay_window_s: int = 300
    platform_accounts: frozenset[str] = PLATFORM_ACCOUNTS

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> IntakeSettings:
        env = os.environ if env is None else env
        raw_port = env.get("ONEPLUS_HTTP_PORT", "").strip()
        port: int | None = DEFAULT_HTTP_PORT
        if raw_port.lower() in ("off", "none", "disabled"):
            port = None
        elif raw_port:
            port = _int(env, "ONEPLUS_HTTP_PORT", 0, 65535)
        templates = env.get("ONEPLUS_MLFLOW_TEMPLATES", "").strip()
        accounts = env.get("ONEPLUS_PLATFORM_ACCOUNTS", "").strip()
        return cls(
            http_host=env.get("ONEPLUS_HTTP_HOST", "").strip() or "127.0.0.1",
            http_port=port,
            http_port_explicit=bool(raw_port),
            mlflow_secret=env.get("ONEPLUS_MLFLOW_SECRET", ""),
            mlflow_templates=Path(templates) if templates else None,
            replay_window_s=_int(env, "ONEPLUS_MLFLOW_REPLAY_WINDOW_S", 1, 86400, default=300),
            platform_accounts=frozenset(a.strip() for a in accounts.split(",") if a.strip()) or PLATFORM_ACCOUNTS,
        )


def _int(env: Mapping[str, str], name: str, low: int, high: int, default: int | None = None) -> int:
    raw = env.get(name, "").strip()
    if not raw and default is not None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not a whole number") from None
    if not low <= value <= high:
        raise SettingsError(f"{name}={value} must be between {low} and {high}")
    return value
