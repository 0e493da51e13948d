"""Cycle cost under load (not a test): `uv run python tests/queueing/cycle_speed.py NODES CYCLES`.

A synthetic H100 cluster, 8 nodes per leaf; jobs of 1-64 GPUs arrive at about 110% of capacity with time limits of
1.5x their run time; one cycle per arrival or end. Prints the cycle wall-time percentiles.
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from oneplus_queueing.config import default_config
from oneplus_queueing.model import PendingJob
from queueing_world import Loop, World, spec


def main(n_nodes: int, cycles: int, seed: int = 1) -> None:
    rng = random.Random(seed)
    world = World(n_nodes=n_nodes, nodes_per_leaf=8)
    loop = Loop(world, default_config())
    gpus_total = 8 * n_nodes
    t = 0.0
    for i in range(cycles * 2):
        g = rng.choice([1, 1, 1, 1, 2, 4, 8, 8, 16, 32, 64])
        ranks, per = (g // 8, 8) if g > 8 else (1, g)
        run = rng.uniform(100, 3000)
        t += rng.expovariate(1.0) * (g * 1550) / (gpus_total * 1.1)
        loop.submit(t, PendingJob(f"j{i}", spec(f"j{i}", per, ranks=ranks, time_limit_s=int(run * 1.5)), t), run)
    walls: list[float] = []
    t0 = time.perf_counter()
    while len(walls) < cycles:
        walls.append(loop.step().stats.wall_s)
        nxt = loop.next_event()
        if nxt is None:
            break
        loop.now = nxt
    total = time.perf_counter() - t0
    walls.sort()
    p99 = walls[max(0, int(0.99 * len(walls)) - 1)]
    print(
        f"nodes={n_nodes} cycles={len(walls)} pending={len(loop.pending)} running={len(world.running)} "
        f"cycle_p50_ms={1000 * statistics.median(walls):.1f} cycle_p99_ms={1000 * p99:.1f} "
        f"max_ms={1000 * walls[-1]:.1f} loop_total_s={total:.1f}"
    )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 64, int(sys.argv[2]) if len(sys.argv) > 2 else 1000)
