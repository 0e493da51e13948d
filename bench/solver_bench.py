"""Placement solver benchmark (`task bench:solver`): single-gang latency and one CP-SAT batch beside greedy.

Single: gangs of 1-256 GPUs placed one at a time on a 1,024-node cluster fragmented by a seeded fill (decisions are
timed, not applied, so every decision sees the same kind of fragmentation); p50 and p99 in milliseconds.
Batch: 200 pending gangs on 4,096 nodes placed jointly under the CP-SAT time bound; wall time, the solver's gap,
and the share of requested GPUs placed by the batch and by greedy alone.
Writes bench/results/solver.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

from oneplus_contracts import JobSpec
from oneplus_placement import ClusterSnapshot, PendingGang, place_batch, place_gang, seeded_fill
from oneplus_topology.cluster import synthetic_cluster

RESULTS = Path(__file__).parent / "results" / "solver.json"
GANG_GPUS = (1, 1, 2, 2, 4, 4, 8, 8, 16, 16, 32, 64, 128, 256)
PRIORITIES = (0, 0, 10, 10, 100)


def random_gang(rng: random.Random, name: str) -> JobSpec:
    """A gang of 1-256 GPUs in ranks of 1, 2, 4 or 8 GPUs (never more per rank than the gang has)."""
    gpus = rng.choice(GANG_GPUS)
    per_rank = rng.choice([k for k in (1, 2, 4, 8) if k <= gpus])
    return JobSpec(
        name=name,
        ranks=gpus // per_rank,
        resources={"gpus": per_rank, "cpus": 4 * per_rank, "memory_mb": 32 * 1024 * per_rank},
        priority=rng.choice(PRIORITIES),
    )


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def bench_single(args: argparse.Namespace) -> dict[str, float]:
    cluster = synthetic_cluster(args.single_nodes, preset=args.preset, nodes_per_leaf=8, leaves_per_spine=8)
    empty = ClusterSnapshot.from_cluster(cluster)
    rng = random.Random(args.seed)
    times: list[float] = []
    cpu: list[float] = []
    placed = 0
    for round_ in range(args.single_fills):
        snap = seeded_fill(empty, args.seed + round_, args.fill_pct)
        for n in range(args.single_warmup):  # first sight of each free-GPU pattern fills per-board caches
            place_gang(snap, random_gang(rng, f"warm{n}"))
        for n in range(args.single_decisions):
            spec = random_gang(rng, f"g{round_}-{n}")
            t, c = time.perf_counter(), time.thread_time()
            result = place_gang(snap, spec, seed=args.seed)
            times.append((time.perf_counter() - t) * 1000)
            cpu.append((time.thread_time() - c) * 1000)
            placed += result.placed
    return {
        "single_p50_ms": round(statistics.median(times), 3),
        "single_p99_ms": round(percentile(times, 99), 3),
        "single_max_ms": round(max(times), 3),
        # CPU time of the deciding thread: the same decisions without other processes' share of the cores.
        "single_cpu_p50_ms": round(statistics.median(cpu), 3),
        "single_cpu_p99_ms": round(percentile(cpu, 99), 3),
        "single_decisions": float(len(times)),
        "single_placed_pct": round(100 * placed / len(times), 1),
    }


def bench_batch(args: argparse.Namespace) -> dict[str, float | str | None]:
    cluster = synthetic_cluster(args.batch_nodes, preset=args.preset, nodes_per_leaf=8, leaves_per_spine=8)
    snap = seeded_fill(ClusterSnapshot.from_cluster(cluster), args.seed, args.batch_fill_pct)
    rng = random.Random(args.seed + 1)
    jobs = [PendingGang(f"b{n}", random_gang(rng, f"b{n}")) for n in range(args.batch_gangs)]
    result = place_batch(snap, jobs, time_limit_s=args.batch_time_limit, seed=args.seed, workers=args.workers)
    return {
        "batch_wall_s": round(result.wall_s, 3),
        "batch_gap": None if result.gap is None else round(result.gap, 6),
        "batch_placed_gpu_pct": round(result.placed_gpu_pct, 2),
        "greedy_placed_gpu_pct": round(result.greedy_placed_gpu_pct, 2),
        "batch_solver": result.solver,
        "batch_status": result.status,
        "batch_objective": round(result.objective, 3),
        "batch_greedy_objective": round(result.greedy_objective, 3),
        "batch_upper_bound": round(result.upper_bound, 3),
        "batch_requested_gpus": result.requested_gpus,
        "batch_free_gpus": float(snap.total_free_gpus()),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="h100_sxm_8gpu_nvswitch_nv18", help="node board of the synthetic clusters")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--fill-pct", type=float, default=60.0, help="share of GPUs held before single decisions")
    p.add_argument("--single-nodes", type=int, default=1024)
    p.add_argument("--single-fills", type=int, default=4, help="distinct seeded fills, one after another")
    p.add_argument("--single-decisions", type=int, default=250, help="timed decisions per fill")
    p.add_argument("--single-warmup", type=int, default=25, help="untimed decisions per fill")
    p.add_argument("--batch-nodes", type=int, default=4096)
    p.add_argument("--batch-gangs", type=int, default=200)
    p.add_argument("--batch-fill-pct", type=float, default=75.0)
    p.add_argument("--batch-time-limit", type=float, default=0.2, help="CP-SAT bound in seconds")
    p.add_argument("--workers", type=int, default=1, help="CP-SAT search workers")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)

    single = bench_single(args)
    batch = bench_batch(args)
    figures = {**single, **batch}
    rows = [
        ("single-gang p50 (ms)", single["single_p50_ms"], "1,024 nodes, 1-256 GPUs"),
        ("single-gang p99 (ms)", single["single_p99_ms"], "target <= 20"),
        ("single-gang p99 CPU (ms)", single["single_cpu_p99_ms"], "thread CPU time, same decisions"),
        ("batch wall (s)", batch["batch_wall_s"], f"{args.batch_gangs} gangs on {args.batch_nodes} nodes, <= 2"),
        ("batch gap", batch["batch_gap"], f"{batch['batch_solver']} ({batch['batch_status']})"),
        ("batch placed GPU %", batch["batch_placed_gpu_pct"], f"of {batch['batch_requested_gpus']:g} requested"),
        ("greedy placed GPU %", batch["greedy_placed_gpu_pct"], "greedy alone, same window"),
        ("batch objective", batch["batch_objective"], f"greedy {batch['batch_greedy_objective']:g}"),
    ]
    width = max(len(r[0]) for r in rows)
    print(f"{'figure':<{width}}  {'value':>10}  note")
    for name, value, note in rows:
        shown = "n/a" if value is None else f"{value:g}" if isinstance(value, float) else str(value)
        print(f"{name:<{width}}  {shown:>10}  {note}")
    record = {
        **figures,
        "command": "uv run python bench/solver_bench.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "host": {"python": platform.python_version(), "cpus": os.cpu_count(), "machine": platform.machine()},
        "ts": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
