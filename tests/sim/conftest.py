"""Fixtures of the simulator tests: a small slice of the Philly trace, cut once per session."""

from __future__ import annotations

from pathlib import Path

import pytest
from sim_helpers import DATA


@pytest.fixture(scope="session")
def philly_small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The header and first 400 jobs of philly.csv (file order), as its own trace file."""
    lines = (DATA / "philly" / "philly.csv").read_text().splitlines()[:401]
    out = tmp_path_factory.mktemp("philly") / "philly_400.csv"
    out.write_text("\n".join(lines) + "\n")
    return out
