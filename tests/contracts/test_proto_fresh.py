"""proto/ is generated from the contracts: a stale checked-in file fails here (run `task proto`)."""

from __future__ import annotations

from pathlib import Path

from oneplus.proto import render

PROTO = Path(__file__).resolve().parents[2] / "proto"


def test_checked_in_schemas_and_asyncapi_match_the_contracts() -> None:
    stale = [rel for rel, text in render().items() if not (PROTO / rel).exists() or (PROTO / rel).read_text() != text]
    assert stale == [], f"proto/ is stale for {stale}: run `uv run task proto`"


def test_asyncapi_names_every_channel_and_message() -> None:
    import json

    doc = json.loads((PROTO / "asyncapi.json").read_text())
    assert doc["asyncapi"] == "3.0.0"
    assert "oneplus.jobs.submit" in {c["address"] for c in doc["channels"].values()}
    assert set(doc["components"]["messages"]) >= {"JobSpec", "JobEvent", "NodeCommand", "NodeHeartbeat"}
