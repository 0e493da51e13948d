"""trim_heap gives freed heap back to the OS (glibc), which the solver does once a burst's jobs are archived."""

from __future__ import annotations

import ctypes.util
import platform

import pytest
from oneplus_bus.heap import trim_heap


def rss_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


@pytest.mark.skipif(platform.system() != "Linux" or ctypes.util.find_library("c") is None, reason="glibc only")
def test_memory_freed_by_python_goes_back_to_the_os() -> None:
    trim_heap()
    before = rss_kib()
    # Many small blocks (not one mmap'd buffer, which free() returns by itself), then all freed but one at the end.
    blocks = [bytearray(4000) for _ in range(50_000)]
    keep = blocks[-1]
    grown = rss_kib()
    del blocks
    assert trim_heap() is True
    after = rss_kib()
    assert grown - before > 150_000, "the blocks took about 200 MB"
    assert after - before < (grown - before) / 2, f"RSS {before} → {grown} → {after} KiB: not given back"
    assert len(keep) == 4000
