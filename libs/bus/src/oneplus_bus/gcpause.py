"""How long Python's cyclic garbage collector holds a service's event loop, as a Prometheus histogram.

Every message in flight waits out a collection, and a full one walks every tracked object. prometheus_client's GC
collector counts collections and objects, not the time they take, so a stall in submit→placed could not be told
apart from a busy machine. `gc.callbacks` brackets each collection; the wall time between is what the loop lost.
"""

from __future__ import annotations

import contextlib
import gc
import time
from typing import Any

from prometheus_client import CollectorRegistry, Histogram

GENERATIONS = ("0", "1", "2")
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class GcPauses:
    """`oneplus_gc_pause_seconds{generation}` in `registry`, observed while installed."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.histogram = Histogram(
            "oneplus_gc_pause_seconds",
            "Wall time of each cyclic garbage collection (the event loop waits it out), by generation",
            ["generation"],
            registry=registry,
            buckets=BUCKETS,
        )
        # Children made now: `labels()` allocates under a lock, and a collection may start inside any allocation.
        self._children = {g: self.histogram.labels(g) for g in GENERATIONS}
        self._started: float | None = None

    def install(self) -> None:
        if self._on_gc not in gc.callbacks:
            gc.callbacks.append(self._on_gc)

    def uninstall(self) -> None:
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        started, self._started = self._started, None
        child = self._children.get(str(info.get("generation")))
        if started is not None and child is not None:
            child.observe(time.perf_counter() - started)
