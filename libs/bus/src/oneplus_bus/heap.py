"""Giving the heap a burst left free back to the OS.

A service that folds thousands of jobs a second allocates records, events and message buffers by the megabyte and
frees them once the jobs move to the archive; CPython keeps the freed memory in its allocator (glibc's arenas) and
the resident size stays at the burst's peak. `trim_heap` asks glibc to return what is free (malloc_trim, a few ms):
the working set, not the busiest moment of the past, is what the process then holds. It does not run a full garbage
collection first: on a solver's heap that took 100 ms, a stall a paced submission saw (p99 146 ms in one run);
cyclic garbage is left to CPython's own collector.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from functools import cache


@cache
def _malloc_trim() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        fn = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to trim with
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


def trim_heap() -> bool:
    """Return free heap to the OS; False where the C library cannot (not glibc)."""
    fn = _malloc_trim()
    if fn is None:
        return False
    fn(0)
    return True
