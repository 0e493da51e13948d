"""Issue 43's target: a maintenance window 2 hours ahead on a busy simulated cluster. Prints, for the window
planned as an advance reservation and for an immediate drain at the announcement: jobs on its nodes when it
starts (killed by the maintenance), and GPU-hours its nodes idle before it.

    uv run python bench/maintenance_window.py [SEEDS]
"""

from __future__ import annotations

import sys
import time

from oneplus_sim.maintenance import run_window


def main() -> None:
    seeds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    print("16 H100 nodes (128 GPUs), load 1.3, window on 4 nodes announced at t=4h, starting at t=6h for 2h;")
    print("time limits 1-1.33x run time. 'at start': jobs on its nodes when it starts (would be killed), of which")
    print("'after': started after the announcement. 'idle': GPU-hours its nodes idle from announcement to start.")
    for longest in (1.5, 4.0):
        print(f"\njobs of 10 min to {longest:g} h (longest time limit {longest * 4 / 3:g} h)")
        print(f"{'seed':>4} {'mode':<12} {'at start':>8} {'after':>5} {'idle GPU-h':>10} {'of':>5} "
              f"{'finished':>8} {'mean wait':>9} {'wall':>6}")  # fmt: skip
        for seed in range(seeds):
            for mode in ("reservation", "drain"):
                t0 = time.perf_counter()
                f, _ = run_window(mode, seed=seed, longest_s=longest * 3600)
                print(f"{seed:>4} {mode:<12} {f.running_at_start:>8} {f.started_after:>5} {f.idle_gpu_h:>10.1f} "
                      f"{f.window_gpu_h:>5.0f} {f.finished:>8} {f.mean_wait_s / 60:>7.1f}m "
                      f"{time.perf_counter() - t0:>5.1f}s")  # fmt: skip


if __name__ == "__main__":
    main()
