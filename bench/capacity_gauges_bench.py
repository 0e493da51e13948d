"""What the solver's per-node, per-leaf and per-NVLink-domain capacity gauges cost once a second under load.

Builds the holdings of `--nodes` 8-GPU nodes, counts them all once (the first pass sets every series), then
`--rounds` times changes `--changed` nodes' free GPUs and times the next pass (`SolverMetrics.capacity`), as a
busy second does. Prints the first full count, a full recount that sets nothing, and the median changed pass.

    uv run python bench/capacity_gauges_bench.py --nodes 4096 --changed 205
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from oneplus_placement.snapshot import ClusterState
from oneplus_placement_solver.metrics import SolverMetrics
from oneplus_topology.cluster import synthetic_cluster
from prometheus_client import CollectorRegistry


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=4096)
    ap.add_argument("--changed", type=int, default=205, help="nodes whose free GPUs change between two passes")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    state = ClusterState.from_cluster(synthetic_cluster(a.nodes, nodes_per_leaf=16))
    metrics = SolverMetrics(CollectorRegistry())
    t = time.perf_counter()
    metrics.capacity(state, force=True)
    first = time.perf_counter() - t
    rng = random.Random(a.seed)
    now, passes = time.monotonic(), []
    for _ in range(a.rounds):
        for i in rng.sample(range(a.nodes), a.changed):
            state.free[i] ^= 1  # one GPU taken or given back
        now += 2.0
        t = time.perf_counter()
        metrics.capacity(state, now)
        passes.append(time.perf_counter() - t)
    t = time.perf_counter()
    metrics.capacity(state, force=True)
    again = time.perf_counter() - t
    print(
        f"{a.nodes} nodes: first count {first * 1e3:.1f} ms, a full recount {again * 1e3:.1f} ms, "
        f"a pass after {a.changed} nodes changed {statistics.median(passes) * 1e3:.1f} ms (median of {a.rounds})"
    )


if __name__ == "__main__":
    main()
