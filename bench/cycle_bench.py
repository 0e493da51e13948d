"""One scheduling cycle's time when jobs arrive one by one (`task bench:cycle`), at 512 and at 4,096 nodes.

Each cycle sees one pending one-GPU job on a cluster a seeded fill has half taken, places it (`schedule_cycle`, the
decision code of the live solver and the simulator), and the live state takes the placement, as the binder does.
Timed twice: with capacity indexes kept from one cycle to the next (the solver's way since 2026-12-07: each cycle
recounts the nodes that changed since the last) and with new indexes every cycle (each cycle counts every node).
Prints the median and p90 cycle in milliseconds per cluster size.

    uv run python bench/cycle_bench.py --cycles 200
"""

from __future__ import annotations

import argparse
import statistics
import time

from oneplus_contracts import JobSpec
from oneplus_placement.capacity import CapacityIndexes
from oneplus_placement.fill import seeded_fill
from oneplus_placement.snapshot import ClusterSnapshot
from oneplus_queueing.config import default_config
from oneplus_queueing.cycle import schedule_cycle
from oneplus_queueing.fairshare import UsageHistory
from oneplus_queueing.model import PendingJob, RunningJob
from oneplus_topology.cluster import synthetic_cluster


def cycles(nodes: int, count: int, keep: bool) -> list[float]:
    live = seeded_fill(ClusterSnapshot.from_cluster(synthetic_cluster(nodes, nodes_per_leaf=16)), 1, 0.5).thaw()
    config, usage = default_config(), UsageHistory()
    indexes = CapacityIndexes() if keep else None
    running: list[RunningJob] = []
    out = []
    for k in range(count):
        now = 1_000.0 + k
        job = PendingJob(f"j{k}", JobSpec(name=f"j{k}", resources={"gpus": 1}), now)
        t = time.perf_counter()
        decision = schedule_cycle(now, live, [job], running, config, usage, indexes=indexes)
        out.append(time.perf_counter() - t)
        alloc = decision.placements[job.job_id]
        live.apply(alloc)  # bound
        running.append(RunningJob(job.job_id, job.spec, alloc, now))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=200)
    ap.add_argument("--nodes", type=int, nargs="+", default=[512, 4096])
    a = ap.parse_args()
    for nodes in a.nodes:
        for keep in (True, False):
            got = sorted(cycles(nodes, a.cycles, keep)[5:])  # the first cycles count every node either way
            p50, p90 = statistics.median(got), got[int(len(got) * 0.9)]
            kind = "indexes kept across cycles" if keep else "new indexes every cycle"
            print(f"{nodes:>5} nodes, {kind:<27}: cycle p50 {p50 * 1e3:6.2f} ms, p90 {p90 * 1e3:6.2f} ms")


if __name__ == "__main__":
    main()
