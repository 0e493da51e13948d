"""The intake's HTTP and webhook settings, from the environment."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from oneplus_bus.tenancy import PLATFORM_ACCOUNTS

from .auth import TokenBook, TokenError, is_loopback

DEFAULT_HTTP_PORT = 8080


class SettingsError(ValueError):
    """An environment variable that cannot be used; the message names it."""


# Submissions are answered concurrently: each waits for the job owner's fold, so a burst is served only as fast as
# this many folds are in flight. 32 capped a 2,000-gang burst near 330/s on 2 cores; 128 gave 415; 256 cost more CPU.
SUBMIT_WORKERS = 128


@dataclass(frozen=True)
class IntakeSettings:
    http_host: str = "127.0.0.1"
    http_port: int | None = DEFAULT_HTTP_PORT  # None: no HTTP listener
    http_port_explicit: bool = False  # a port someone asked for must bind; the default may be taken
    mlflow_secret: str = ""
    mlflow_templates: Path | None = None
    replay_window_s: int = 300
    platform_accounts: frozenset[str] = PLATFORM_ACCOUNTS
    http_tokens: TokenBook = field(default_factory=TokenBook)  # empty: no authentication (loopback only)
    http_insecure: bool = False  # ONEPLUS_HTTP_INSECURE=1: listen beyond loopback without tokens all the same
    submit_workers: int = SUBMIT_WORKERS  # ONEPLUS_SUBMIT_WORKERS: submissions handled at once

    def check_listen(self) -> str | None:
        """Refuse an HTTP listener anyone on the network could use as any team; a warning to log, if any."""
        if self.http_port is None or self.http_tokens or is_loopback(self.http_host):
            return None
        if not self.http_insecure:
            raise SettingsError(
                f"ONEPLUS_HTTP_HOST={self.http_host} is not a loopback address and no HTTP tokens are configured: "
                "set ONEPLUS_HTTP_TOKENS_FILE or ONEPLUS_HTTP_TOKENS (docs/http-api.md#authentication), "
                "or ONEPLUS_HTTP_INSECURE=1 to serve every team to anyone who reaches the port"
            )
        return (
            f"HTTP intake on {self.http_host} WITHOUT authentication (ONEPLUS_HTTP_INSECURE=1): anyone who reaches "
            "the port acts for any team"
        )

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
        try:
            tokens = TokenBook.from_env(env)
        except TokenError as exc:
            raise SettingsError(str(exc)) from None
        insecure = env.get("ONEPLUS_HTTP_INSECURE", "").strip().lower()
        if insecure not in ("", "0", "1", "true", "false", "yes", "no"):
            raise SettingsError(f"ONEPLUS_HTTP_INSECURE={insecure!r} must be 1 or 0")
        return cls(
            http_host=env.get("ONEPLUS_HTTP_HOST", "").strip() or "127.0.0.1",
            http_port=port,
            http_port_explicit=bool(raw_port),
            mlflow_secret=env.get("ONEPLUS_MLFLOW_SECRET", ""),
            mlflow_templates=Path(templates) if templates else None,
            replay_window_s=_int(env, "ONEPLUS_MLFLOW_REPLAY_WINDOW_S", 1, 86400, default=300),
            platform_accounts=frozenset(a.strip() for a in accounts.split(",") if a.strip()) or PLATFORM_ACCOUNTS,
            http_tokens=tokens,
            http_insecure=insecure in ("1", "true", "yes"),
            submit_workers=submit_workers_from_env(env),
        )


def submit_workers_from_env(env: Mapping[str, str] | None = None) -> int:
    return _int(os.environ if env is None else env, "ONEPLUS_SUBMIT_WORKERS", 1, 4096, default=SUBMIT_WORKERS)


def submit_workers(settings: IntakeSettings | None) -> int:
    """The submission subscriber's concurrency, fixed when the service is built (settings, else the environment)."""
    return settings.submit_workers if settings is not None else submit_workers_from_env()


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
