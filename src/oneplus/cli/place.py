"""CLI commands (being written)."""

import typer

app = typer.Typer()
