"""`oneplus_gc_pause_seconds`: the wall time of each garbage collection, by generation, while a service runs."""

from __future__ import annotations

import gc

from oneplus_bus.gcpause import GcPauses
from prometheus_client import CollectorRegistry


def count(registry: CollectorRegistry, generation: str) -> float:
    value = registry.get_sample_value("oneplus_gc_pause_seconds_count", {"generation": generation})
    return value or 0.0


def test_each_collection_is_timed_under_its_generation_while_installed() -> None:
    registry = CollectorRegistry()
    pauses = GcPauses(registry)
    assert count(registry, "2") == 0.0, "every generation is exported from the start, at zero"
    pauses.install()
    pauses.install()  # twice: still one callback, one observation a collection
    try:
        gc.collect(2)
        gc.collect(0)
    finally:
        pauses.uninstall()
    assert count(registry, "2") == 1.0 and count(registry, "0") >= 1.0
    full = registry.get_sample_value("oneplus_gc_pause_seconds_sum", {"generation": "2"})
    assert full is not None and 0.0 < full < 10.0
    gc.collect(2)
    assert count(registry, "2") == 1.0, "uninstalled: collections are no longer observed"
    pauses.uninstall()  # a second uninstall is harmless
