"""An exclusive gang in the simulator holds its whole node, through the same placement code as the live solver."""

from __future__ import annotations

from sim_helpers import h100, job, simulate, start_times


def test_no_job_starts_beside_an_exclusive_gang_until_it_ends() -> None:
    excl = job("excl", 0.0, 2, 100.0)
    excl.exclusive = True
    small = job("small", 1.0, 1, 10.0)
    res = simulate(h100(1), [excl, small], "oneplus")
    starts = start_times(res)
    assert starts["excl"] is not None and starts["excl"] < 1.0
    # Six GPUs of the node stay unused by the exclusive job; the small one still waits for it to end.
    assert starts["small"] is not None and starts["small"] >= 100.0


def test_without_exclusive_the_small_job_shares_the_node() -> None:
    res = simulate(h100(1), [job("big", 0.0, 2, 100.0), job("small", 1.0, 1, 10.0)], "oneplus")
    starts = start_times(res)
    assert starts["small"] is not None and starts["small"] < 100.0
