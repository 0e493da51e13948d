"""Every service collects its young generation after ONEPLUS_GC_GEN0 allocations (5,000 unless set)."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
from oneplus_bus.service import GC_GEN0, gc_gen0_from_env, young_collection_after


@pytest.fixture
def thresholds() -> Iterator[None]:
    before = gc.get_threshold()
    try:
        yield
    finally:
        gc.set_threshold(*before)


def test_the_default_and_a_chosen_threshold(monkeypatch: pytest.MonkeyPatch, thresholds: None) -> None:
    monkeypatch.delenv("ONEPLUS_GC_GEN0", raising=False)
    assert gc_gen0_from_env() == GC_GEN0 == 5000
    monkeypatch.setenv("ONEPLUS_GC_GEN0", "700")
    older = gc.get_threshold()[1:]
    young_collection_after(gc_gen0_from_env())
    assert gc.get_threshold() == (700, *older), "the older generations keep their ratios"


@pytest.mark.parametrize(
    ("raw", "says"), [("lots", "not a whole number"), ("50", "below 100"), ("", "not a whole number")]
)
def test_a_bad_threshold_is_refused_by_name(monkeypatch: pytest.MonkeyPatch, raw: str, says: str) -> None:
    monkeypatch.setenv("ONEPLUS_GC_GEN0", raw)
    with pytest.raises(ValueError, match=says) as err:
        gc_gen0_from_env()
    assert "ONEPLUS_GC_GEN0" in str(err.value)


def test_a_service_started_with_a_bad_threshold_exits_saying_why() -> None:
    env = {
        **os.environ,
        "ONEPLUS_GC_GEN0": "lots",
        "NATS_URL": "nats://127.0.0.1:1",
        "REDIS_URL": "redis://127.0.0.1:1",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "oneplus_preemption"], env=env, capture_output=True, text=True, timeout=60
    )
    # Checked with the service's settings at start, before anything connects: one line, exit status 2.
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["error: ONEPLUS_GC_GEN0='lots' is not a whole number of allocations"]
