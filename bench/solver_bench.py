"""Placement solver benchmark (`task bench:solver`): single-gang latency and one CP-SAT batch beside greedy.

Single: gangs of 1-256 GPUs placed one at a time on a 1,024-node cluster fragmented by a seeded fill (decisions are
timed, not applied, so every decision sees the same kind of fragmentation); p50 and p99 in milliseconds.
Batch: 200 pending gangs on 4,096 nodes placed jointly under the CP-SAT time bound; wall time, the solver's gap,
and the share of requested GPUs placed by the batch and by greedy alone.
Contested: windows that compete for the same nodes (more GPUs asked than free, on a cluster fragmented by a seeded
fill, gangs in arrival order), several seeds per family: GPUs placed, tightest-domain share and the objective of
CP-SAT against greedy (greedy in priority-then-arrival order, as the live cycle places), under the same bound.
NVL72: gangs of 1-144 GPUs in 4-GPU tray ranks, many with TP groups of 8-32 GPUs, on 144 GB200 trays (576 GPUs,
eight NVL72 racks) and on 2,048 trays (8,192 GPUs): p50/p99, and whether every TP group sat inside one NVLink domain.
Model: building the 1,024- and 4,096-node synthetic clusters, and one ring-bandwidth query on an 8-GPU board (these
were timed assertions in the tests once; a shared CI core made them flaky, so the figures live here).
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
from oneplus_placement import ClusterSnapshot, PendingGang, PlacementResult, place_batch, place_gang, seeded_fill
from oneplus_topology import analysis
from oneplus_topology.cluster import Cluster, synthetic_cluster
from oneplus_topology.smi import parse_topo_matrix

RESULTS = Path(__file__).parent / "results" / "solver.json"
TOPOLOGIES = Path(__file__).parents[1] / "data" / "topologies"
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


# Contested window families: gang sizes (GPUs) and their weights. Sizes above 8 are ranks of 8 GPUs.
CONTESTED = {
    # Mostly 1-8 GPU jobs with some multi-node ones, the shape of the Philly trace's multi-GPU jobs.
    "philly-like": {1: 30, 2: 15, 4: 20, 8: 20, 16: 10, 32: 5},
    # Widths that are not powers of two (3, 5, 6: data-parallel widths fitted to a model, MPI worker counts).
    "odd-widths": {1: 10, 2: 15, 3: 20, 5: 20, 6: 25, 8: 10},
    # Small jobs queued ahead of whole-node jobs on a half-full cluster: the repack case.
    "small-then-whole": {1: 25, 2: 25, 3: 10, 8: 40},
}


def contested_window(rng: random.Random, family: str, free_gpus: int, oversubscribe: float) -> list[PendingGang]:
    sizes, weights = zip(*CONTESTED[family].items(), strict=True)
    jobs: list[PendingGang] = []
    asked = 0
    while asked < free_gpus * oversubscribe:
        gpus = rng.choices(sizes, weights)[0]
        ranks, per_rank = (gpus // 8, 8) if gpus > 8 else (1, gpus)
        spec = JobSpec(
            name=f"c{len(jobs)}",
            ranks=ranks,
            resources={"gpus": per_rank, "cpus": 2 * per_rank, "memory_mb": 16 * 1024 * per_rank},
        )
        jobs.append(PendingGang(f"c{len(jobs)}", spec))
        asked += gpus
    if family == "small-then-whole":
        jobs.sort(key=lambda g: g.spec.total_gpus == 8)  # the small ones arrived first
    return jobs


def tightest_share(decisions: dict[str, PlacementResult], jobs: list[PendingGang]) -> float:
    """Of the placed gangs, the share in the tightest domain that could hold them (a node, or a leaf for 16-32)."""
    placed = tight = 0
    for g in jobs:
        alloc = decisions[g.job_id].allocation
        if alloc is None:
            continue
        placed += 1
        tight += alloc.domain == ("node" if g.spec.ranks == 1 else "leaf")
    return 100.0 * tight / placed if placed else 100.0


def bench_contested(args: argparse.Namespace, fill_pct: float) -> dict[str, dict[str, float]]:
    cluster = synthetic_cluster(args.contested_nodes, preset=args.preset, nodes_per_leaf=8, leaves_per_spine=8)
    empty = ClusterSnapshot.from_cluster(cluster)
    out: dict[str, dict[str, float]] = {}
    for family in CONTESTED:
        rows = []
        sizes = []
        for k in range(args.contested_seeds):
            seed = args.seed + 100 * k
            snap = seeded_fill(empty, seed, fill_pct)
            jobs = contested_window(random.Random(seed), family, snap.total_free_gpus(), args.contested_oversubscribe)
            sizes.append(len(jobs))
            r = place_batch(snap, jobs, time_limit_s=args.batch_time_limit, seed=args.seed, workers=args.workers)
            rows.append(
                {
                    "placed": r.placed_gpu_pct,
                    "greedy_placed": r.greedy_placed_gpu_pct,
                    "tightest": tightest_share(r.decisions, jobs),
                    "greedy_tightest": tightest_share(r.greedy, jobs),
                    "objective_ratio": r.objective / r.greedy_objective if r.greedy_objective else 1.0,
                    "won": float(r.objective > r.greedy_objective * 1.0001),
                    "cp_sat": float(r.solver == "cp-sat"),
                    "wall_s": r.wall_s,
                }
            )
        out[family] = {
            "windows": float(len(rows)),
            "gangs_per_window": round(statistics.mean(sizes), 1),
            "placed_gpu_pct": round(statistics.mean(r["placed"] for r in rows), 2),
            "greedy_placed_gpu_pct": round(statistics.mean(r["greedy_placed"] for r in rows), 2),
            "tightest_pct": round(statistics.mean(r["tightest"] for r in rows), 2),
            "greedy_tightest_pct": round(statistics.mean(r["greedy_tightest"] for r in rows), 2),
            "objective_vs_greedy": round(statistics.mean(r["objective_ratio"] for r in rows), 4),
            "windows_cp_sat_won": sum(r["won"] for r in rows),
            "windows_cp_sat_answered": sum(r["cp_sat"] for r in rows),
            "wall_s_max": round(max(r["wall_s"] for r in rows), 3),
        }
    return out


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


# NVL72 gangs: GPUs, in ranks of one 4-GPU tray (fewer for small gangs), and the TP groups they may carry.
NVL72_GANG_GPUS = (1, 2, 4, 4, 8, 8, 16, 16, 32, 32, 64, 72, 128, 144)
NVL72_TP = (None, 8, 16, 32)


def nvl72_gang(rng: random.Random, name: str) -> JobSpec:
    gpus = rng.choice(NVL72_GANG_GPUS)
    per_rank = min(4, gpus)
    tp = rng.choice([g for g in NVL72_TP if g is None or (per_rank < g <= min(gpus, 72) and gpus % g == 0)])
    return JobSpec(
        name=name,
        ranks=gpus // per_rank,
        resources={"gpus": per_rank, "cpus": 4 * per_rank, "memory_mb": 32 * 1024 * per_rank},
        topology={"group_gpus": tp} if tp else {},
        priority=rng.choice(PRIORITIES),
    )


def bench_nvl72(args: argparse.Namespace, trays: int, label: str) -> dict[str, float]:
    """Single-gang decisions on GB200 NVL72 racks (18 trays of 4 GPUs a multi-node NVLink domain, two racks a leaf,
    2:1 oversubscribed): latency, and whether every TP group sits inside one domain and every 72-GPU gang in one
    whole domain."""
    cluster = synthetic_cluster(
        trays,
        preset="gb200_nvl72_compute_tray_4gpu",
        nodes_per_leaf=36,
        leaves_per_spine=2,
        oversubscription=2.0,
        nodes_per_nvlink_domain=18,
        prefix="tray",
    )
    domain_of = {n.node: n.nvlink_domain for n in cluster.nodes}
    racks: dict[str | None, int] = {}
    for tray in cluster.nodes:
        racks[tray.nvlink_domain] = racks.get(tray.nvlink_domain, 0) + 1
    empty = ClusterSnapshot.from_cluster(cluster)
    rng = random.Random(args.seed)
    times: list[float] = []
    cpu: list[float] = []
    tp_groups = tp_inside = refused_with_room = whole_rack = rack_gangs = placed = 0
    for round_ in range(args.single_fills):
        snap = seeded_fill(empty, args.seed + round_, args.nvl72_fill_pct)
        for n in range(args.single_warmup):
            place_gang(snap, nvl72_gang(rng, f"warm{n}"))
        # Free whole trays per domain: what a TP group of whole-tray ranks can use.
        free_trays: dict[str | None, int] = {}
        for slot in snap.layout.slots:
            if snap.free_count[slot.index] == slot.shape.n:
                free_trays[slot.nvlink_domain] = free_trays.get(slot.nvlink_domain, 0) + 1
        for n in range(args.single_decisions):
            spec = nvl72_gang(rng, f"g{round_}-{n}")
            t, c = time.perf_counter(), time.thread_time()
            result = place_gang(snap, spec, seed=args.seed)
            times.append((time.perf_counter() - t) * 1000)
            cpu.append((time.thread_time() - c) * 1000)
            placed += result.placed
            tp = spec.topology.group_gpus
            alloc = result.allocation
            if tp and alloc is not None:
                per_group = tp // int(spec.resources.gpus)
                for g in range(spec.ranks // per_group):
                    tp_groups += 1
                    tp_inside += len({domain_of[r.node] for r in alloc.ranks[g * per_group : (g + 1) * per_group]}) == 1
            elif tp and max(free_trays.values(), default=0) * 4 >= spec.total_gpus:
                refused_with_room += 1  # one domain had whole trays for every group, yet it was refused
            if spec.total_gpus == 72 and spec.resources.gpus == 4 and alloc is not None:
                rack_gangs += 1
                used = {domain_of[r.node] for r in alloc.ranks}
                whole_rack += len(used) == 1 and len(alloc.ranks) == racks[next(iter(used))]
    whole_when_free, gangs_when_free = _nvl72_stream(args, cluster, domain_of, racks)
    return {
        f"{label}_stream_72gpu_gangs_with_a_whole_domain_free": float(gangs_when_free),
        f"{label}_stream_72gpu_gangs_in_one_whole_domain": float(whole_when_free),
        f"{label}_cpu_p50_ms": round(statistics.median(cpu), 3),
        f"{label}_gpus": float(4 * trays),
        f"{label}_p50_ms": round(statistics.median(times), 3),
        f"{label}_p99_ms": round(percentile(times, 99), 3),
        f"{label}_cpu_p99_ms": round(percentile(cpu, 99), 3),
        f"{label}_decisions": float(len(times)),
        f"{label}_placed_pct": round(100 * placed / len(times), 1),
        f"{label}_tp_groups_placed": float(tp_groups),
        f"{label}_tp_groups_inside_one_domain_pct": round(100 * tp_inside / tp_groups, 2) if tp_groups else 100.0,
        f"{label}_tp_refused_with_room": float(refused_with_room),
        f"{label}_72gpu_gangs_placed": float(rack_gangs),
        f"{label}_72gpu_gangs_in_one_whole_domain": float(whole_rack),
    }


def _nvl72_stream(
    args: argparse.Namespace, cluster: Cluster, domain_of: dict[str, str | None], racks: dict[str | None, int]
) -> tuple[int, int]:
    """Gangs placed one after another on the empty cluster, each kept, until one does not fit: of the 72-GPU gangs
    placed while some domain was wholly free, how many took exactly one whole domain."""
    rng = random.Random(args.seed + 1000)
    state = ClusterSnapshot.from_cluster(cluster).thaw()
    whole = gangs = 0
    for n in range(10_000):
        spec = nvl72_gang(rng, f"s{n}")
        free_trays: dict[str | None, int] = {}
        for slot in state.layout.slots:
            if state.free_count[slot.index] == slot.shape.n:
                free_trays[slot.nvlink_domain] = free_trays.get(slot.nvlink_domain, 0) + 1
        result = place_gang(state, spec, seed=args.seed)
        if result.allocation is None:
            break
        if spec.total_gpus == 72 and any(free_trays.get(d, 0) == size for d, size in racks.items()):
            gangs += 1
            used = {domain_of[r.node] for r in result.allocation.ranks}
            whole += len(used) == 1 and len(result.allocation.ranks) == racks[next(iter(used))]
        state.apply(result.allocation)
    return whole, gangs


def bench_model(args: argparse.Namespace) -> dict[str, float]:
    out: dict[str, float] = {}
    for n in (1024, 4096):
        t = time.perf_counter()
        synthetic_cluster(n, preset=args.preset)
        out[f"cluster_build_{n}_ms"] = round((time.perf_counter() - t) * 1000, 1)
    topo = parse_topo_matrix((TOPOLOGIES / "dgx1_v100.txt").read_text(encoding="utf-8"), node="dgx1_v100")
    rng = random.Random(args.seed)
    sets = [rng.sample(range(8), rng.randint(2, 8)) for _ in range(20_000)]
    t = time.perf_counter()
    for s in sets:
        analysis.ring_gbps(topo, s)
    out["ring_query_us"] = round((time.perf_counter() - t) / len(sets) * 1e6, 2)
    return out


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
    p.add_argument("--contested-nodes", type=int, default=64, help="nodes of the contested windows' cluster")
    p.add_argument("--contested-seeds", type=int, default=10, help="windows per contested family")
    p.add_argument(
        "--contested-fill-pct",
        type=lambda t: [float(x) for x in t.split(",")],
        default=[0.0, 50.0],
        help="comma list: GPUs held (seeded fill) before a contested window",
    )
    p.add_argument("--contested-oversubscribe", type=float, default=1.25, help="GPUs asked / GPUs free")
    p.add_argument("--nvl72-trays", type=int, default=144, help="GB200 trays of the NVL72 cluster (144: 576 GPUs)")
    p.add_argument("--nvl72-large-trays", type=int, default=2048, help="trays of the large NVL72 cluster (8,192 GPUs)")
    p.add_argument("--nvl72-fill-pct", type=float, default=40.0, help="share of GPUs held before NVL72 decisions")
    p.add_argument("--only-nvl72", action="store_true", help="only the NVL72 single-gang runs")
    p.add_argument("--only-contested", action="store_true", help="skip the single-gang and 4,096-node runs")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)

    nvl72 = {**bench_nvl72(args, args.nvl72_trays, "nvl72"), **bench_nvl72(args, args.nvl72_large_trays, "nvl72_large")}
    for label in ("nvl72", "nvl72_large"):
        print(
            f"NVL72 {nvl72[f'{label}_gpus']:g} GPUs ({args.nvl72_fill_pct:g}% held): single-gang p50 "
            f"{nvl72[f'{label}_p50_ms']:g} ms (CPU {nvl72[f'{label}_cpu_p50_ms']:g}), "
            f"p99 {nvl72[f'{label}_p99_ms']:g} ms (target <= 20), CPU p99 "
            f"{nvl72[f'{label}_cpu_p99_ms']:g} ms; TP groups inside one NVLink domain "
            f"{nvl72[f'{label}_tp_groups_inside_one_domain_pct']:g}% of {nvl72[f'{label}_tp_groups_placed']:g}, "
            f"refused while a domain had room {nvl72[f'{label}_tp_refused_with_room']:g}; gangs kept one after "
            f"another from empty: 72-GPU gangs in one whole domain "
            f"{nvl72[f'{label}_stream_72gpu_gangs_in_one_whole_domain']:g} of "
            f"{nvl72[f'{label}_stream_72gpu_gangs_with_a_whole_domain_free']:g} placed while one was free"
        )
    if args.only_nvl72:
        return 0
    contested: dict[str, dict[str, dict[str, float]]] = {}
    for fill in args.contested_fill_pct:
        contested[f"{fill:g}% held"] = found = bench_contested(args, fill)
        print(
            f"contested windows ({args.contested_nodes} nodes, {fill:g}% held, {args.contested_oversubscribe:g}x "
            f"the free GPUs asked, {args.batch_time_limit:g} s bound): CP-SAT | greedy"
        )
        print(f"{'family':<18} {'GPUs placed %':>17} {'tightest %':>15} {'objective':>10} {'won':>6}")
        for family, f in found.items():
            print(
                f"{family:<18} {f['placed_gpu_pct']:>7.1f} | {f['greedy_placed_gpu_pct']:<7.1f} "
                f"{f['tightest_pct']:>6.1f} | {f['greedy_tightest_pct']:<6.1f} {f['objective_vs_greedy']:>9.3f}x "
                f"{f['windows_cp_sat_won']:>2g}/{f['windows']:g}"
            )
    if args.only_contested:
        return 0
    model = bench_model(args)
    single = bench_single(args)
    batch = bench_batch(args)
    figures = {**model, **single, **batch, **nvl72, "contested": contested}
    rows = [
        ("1,024-node cluster build (ms)", model["cluster_build_1024_ms"], "synthetic_cluster, well under 500"),
        ("4,096-node cluster build (ms)", model["cluster_build_4096_ms"], "synthetic_cluster, well under 500"),
        ("ring query (µs)", model["ring_query_us"], "ring_gbps on a DGX-1 board, about 2"),
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
