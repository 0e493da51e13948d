"""Issue 43's maintenance-window scenario on the simulator (the live cycle's code): planned as an advance
reservation 2 hours ahead, its nodes are empty when it starts, no job on them started after the announcement, and
they idle fewer GPU-hours before it than with an immediate drain."""

from __future__ import annotations

from oneplus_sim.maintenance import HOUR, run_window


def test_a_window_planned_ahead_empties_its_nodes_and_idles_less_than_a_drain() -> None:
    planned, _ = run_window("reservation", seed=1, longest_s=1.5 * HOUR, hours=8)
    drain, _ = run_window("drain", seed=1, longest_s=1.5 * HOUR, hours=8)
    assert planned.running_at_start == 0 and drain.running_at_start == 0
    assert planned.idle_gpu_h < drain.idle_gpu_h, (planned, drain)
    assert planned.idle_gpu_h < planned.window_gpu_h


def test_jobs_started_before_the_announcement_are_the_only_ones_left_on_its_nodes() -> None:
    planned, _ = run_window("reservation", seed=0, longest_s=4 * HOUR, hours=8)
    assert planned.started_after == 0
