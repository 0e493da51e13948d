"""One error line and one client call for the CLI's sub-apps (queues, reservation), which cannot import cli.app."""

from __future__ import annotations

from typing import Any

import typer

from .render import error_console


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print `error: message` on stderr; the Exit to raise."""
    from rich.markup import escape

    error_console().print(f"[red]error:[/] {escape(message)}", highlight=False)
    return typer.Exit(code)


def call(nats: str | None, fn: Any, refusals: tuple[type[Exception], ...] = ()) -> Any:
    """`fn(client)` against the platform; a PlatformError (or one of `refusals`) becomes one error line."""
    from ..client import PlatformError, run_with_client

    caught: tuple[type[Exception], ...] = (PlatformError, *refusals)
    try:
        return run_with_client(nats, None, fn)
    except caught as exc:
        raise fail(str(exc)) from None
