"""How long the scheduler rests after a cycle before an event may start the next one.

Event-driven cycles run back to back under a burst: every fold that frees GPUs wakes the next. Each cycle costs
time that grows with the pending jobs and the holders, and the job owner (which folds the facts that free capacity)
shares the solver's event loop, so unpaced cycles starve it and each one finds a single gang to place. Resting in
proportion to the last cycle's length (Slurm's `sched_min_interval`, relative rather than fixed) caps the share of
time cycles take; wake-ups during the rest are served together by the next cycle, which places all that piled up.
An idle scheduler's cycles are short, so its rests are too: latency at low load is unchanged.
"""

from __future__ import annotations

MAX_REST_S = 0.25  # a very long cycle still lets the next one follow within this


def cycle_rest(duration_s: float, duty: float) -> float:
    """Seconds to rest after a cycle of `duration_s` so that cycles take at most `duty` of the time (0 < duty <= 1)."""
    if not 0.0 < duty <= 1.0:
        raise ValueError(f"duty {duty}: a share of the time, above 0 and at most 1")
    return min(MAX_REST_S, max(0.0, duration_s) * (1.0 - duty) / duty)
