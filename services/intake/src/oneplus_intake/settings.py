"""The intake's settings: built once at bootstrap from the environment, one clear error for a bad value."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

from oneplus_bus.config import ServiceSettings, SettingsError
from oneplus_bus.tenancy import PLATFORM_ACCOUNTS
from pydantic import Field, field_validator, model_validator
from pydantic_settings import NoDecode

from .auth import TokenBook, TokenError, is_loopback

__all__ = ["DEFAULT_HTTP_PORT", "SUBMIT_WORKERS", "IntakeSettings", "SettingsError", "submit_workers"]

DEFAULT_HTTP_PORT = 8080
_NO_PORT = ("off", "none", "disabled")

# Submissions are answered concurrently: each waits for the job owner's fold, so a burst is served only as fast as
# this many folds are in flight. 32 capped a 2,000-gang burst near 330/s on 2 cores; 128 gave 415; 256 cost more CPU.
SUBMIT_WORKERS = 128


class IntakeSettings(ServiceSettings):
    """`ONEPLUS_<FIELD>` sets each field (docs/configuration.md); the aliased ones read the names shown."""

    http_host: str = "127.0.0.1"
    http_port: int | None = Field(DEFAULT_HTTP_PORT, ge=0, le=65535)  # None ("off"): no HTTP listener
    http_port_explicit: bool = False  # a port someone asked for must bind; the default may be taken
    mlflow_secret: str = Field("", repr=False)
    mlflow_templates: Path | None = None
    replay_window_s: int = Field(300, ge=1, le=86400, alias="ONEPLUS_MLFLOW_REPLAY_WINDOW_S")
    platform_accounts: Annotated[frozenset[str], NoDecode] = PLATFORM_ACCOUNTS  # comma-separated
    # Who may use the HTTP API: ONEPLUS_HTTP_TOKENS (team=token,...), ONEPLUS_HTTP_TOKENS_FILE and
    # ONEPLUS_HTTP_ADMIN_TOKEN make one book; empty: no authentication (loopback only).
    http_tokens: Annotated[TokenBook, NoDecode] = Field(default_factory=TokenBook, repr=False)
    http_tokens_file: Path | None = None
    http_admin_token: str = Field("", repr=False)
    http_insecure: bool = False  # ONEPLUS_HTTP_INSECURE=1: listen beyond loopback without tokens all the same
    submit_workers: int = Field(SUBMIT_WORKERS, ge=1, le=4096)  # submissions handled at once
    min_job_age_s: float = Field(300.0, ge=0)  # Slurm's MinJobAge: how long a finished job stays in the hot view
    accept_wait_s: float = Field(2.0, ge=0)  # how long a submission waits for the owner's fold before answering

    @model_validator(mode="before")
    @classmethod
    def _derived(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        port = data.get("http_port")
        if "http_port_explicit" not in data:
            data["http_port_explicit"] = port is not None and str(port).strip() != ""
        if isinstance(port, str) and port.strip().lower() in _NO_PORT:
            data["http_port"] = None
        tokens = data.get("http_tokens")
        if not isinstance(tokens, TokenBook):
            try:
                data["http_tokens"] = TokenBook.from_env(
                    {
                        "ONEPLUS_HTTP_TOKENS": str(tokens or ""),
                        "ONEPLUS_HTTP_TOKENS_FILE": str(data.get("http_tokens_file") or ""),
                        "ONEPLUS_HTTP_ADMIN_TOKEN": str(data.get("http_admin_token") or ""),
                    }
                )
            except TokenError as exc:
                raise ValueError(str(exc)) from None
        return data

    @field_validator("platform_accounts", mode="before")
    @classmethod
    def _accounts(cls, value: Any) -> Any:
        if isinstance(value, str):
            return frozenset(a.strip() for a in value.split(",") if a.strip()) or PLATFORM_ACCOUNTS
        return value

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
        return cls.load(env)


def submit_workers(settings: IntakeSettings | None) -> int:
    """The submission subscriber's concurrency, fixed when the service is built (settings, else the environment)."""
    return (settings if settings is not None else IntakeSettings.load()).submit_workers
