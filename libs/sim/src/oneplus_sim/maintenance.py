"""Issue 43's maintenance-window scenario: a window announced 2 hours ahead on a busy cluster, planned as an advance
reservation (backfill keeps using its nodes only with jobs whose time limits end them by its start) against an
immediate drain at the announcement (no new job on its nodes from then on).

Both runs use the `oneplus` policy, the live solver's cycle; the drain is the same reservation starting at the
announcement. Figures: jobs still running on the window's nodes when it starts (they would be killed), and the
GPU-hours those nodes idle between the announcement and the start."""

from __future__ import annotations

import random
from dataclasses import dataclass

from oneplus_contracts.advance import AdvanceReservation

from .cluster import SimCluster, uniform_cluster
from .engine import SimResult, Simulation
from .policies.oneplus import OnePlusPolicy
from .trace import PRIORITY_CLASSES, SimJob

HOUR = 3600.0


@dataclass(frozen=True)
class WindowFigures:
    mode: str  # "reservation" or "drain"
    running_at_start: int  # jobs on the window's nodes when it starts: killed by a real maintenance
    started_after: int  # of those, the ones started after the announcement (the scheduler could have kept them off)
    idle_gpu_h: float  # GPU-hours the window's nodes stood idle between the announcement and the start
    window_gpu_h: float  # those nodes' GPU-hours over the same span (the most that could idle)
    finished: int
    mean_wait_s: float


def busy_jobs(
    seed: int, cluster_gpus: int, hours: float, load: float = 1.3, longest_s: float = 4 * HOUR
) -> list[SimJob]:
    """Single-node jobs of 1-8 GPUs, 10 min to `longest_s`, with time limits 1-1.33x their run time, arriving at
    `load` times the cluster's capacity."""
    rng = random.Random(seed)
    jobs: list[SimJob] = []
    t, n = 0.0, 0
    mean_gpu_s = 4.5 * (sum(rng.uniform(600, longest_s) for _ in range(1000)) / 1000)
    gap = mean_gpu_s / (cluster_gpus * load)
    while t < hours * HOUR:
        gpus = rng.choice((1, 2, 4, 8))
        duration = rng.uniform(600, longest_s)
        j = SimJob(f"j{n:05d}", t, duration, float(gpus))
        j.ranks, j.gpus_per_rank = 1, gpus
        j.priority_class, j.priority = "normal", PRIORITY_CLASSES["normal"]
        j.time_limit_s = duration * rng.uniform(1.0, 4 / 3)
        j.order = n
        jobs.append(j)
        n += 1
        t += rng.expovariate(1.0 / gap)
    return jobs


def run_window(
    mode: str,
    *,
    seed: int = 0,
    nodes: int = 16,
    window_nodes: int = 4,
    announce_s: float = 4 * HOUR,
    ahead_s: float = 2 * HOUR,
    length_s: float = 2 * HOUR,
    hours: float = 10.0,
    longest_s: float = 4 * HOUR,
) -> tuple[WindowFigures, SimResult]:
    cluster: SimCluster = uniform_cluster(nodes, "h100_sxm_8gpu_nvswitch_nv18", 8)
    names = [s.name for s in cluster.layout.slots[:window_nodes]]
    start = announce_s + ahead_s
    res = AdvanceReservation(
        name="maint",
        nodes=names,
        start_ts=start if mode == "reservation" else announce_s,
        end_ts=start + length_s,
        teams=["ops"],
        maint=True,
        created_ts=announce_s,
    )
    jobs = busy_jobs(seed, cluster.total_gpus, hours, longest_s=longest_s)
    result = Simulation(cluster, jobs, OnePlusPolicy(seed, reservations=[res])).run()
    return window_figures(mode, result, cluster, names, announce_s, start), result


def window_figures(
    mode: str, result: SimResult, cluster: SimCluster, names: list[str], announce_s: float, start_s: float
) -> WindowFigures:
    index = {cluster.layout.slots[i].name: i for i in range(len(cluster.layout.slots))}
    window = {index[n] for n in names}
    gpus_per_node = {i: cluster.layout.slots[i].shape.n for i in window}
    busy_gpu_s = 0.0
    running_at_start = started_after = 0
    waits: list[float] = []
    for rec in result.records.values():
        if rec.first_start_s is None:
            continue
        waits.append(rec.first_start_s - rec.job.submit_s)
        if not rec.placements:
            continue
        ranks = rec.placements[-1]
        on = sum(len(g) for node, g in ranks if node in window)
        if not on:
            continue
        begin, end = rec.first_start_s, rec.finish_s if rec.finish_s is not None else float("inf")
        if begin < start_s < end:
            running_at_start += 1
            started_after += begin >= announce_s
        overlap = max(0.0, min(end, start_s) - max(begin, announce_s))
        busy_gpu_s += on * overlap
    span_gpu_s = sum(gpus_per_node.values()) * (start_s - announce_s)
    return WindowFigures(
        mode,
        running_at_start,
        started_after,
        (span_gpu_s - busy_gpu_s) / HOUR,
        span_gpu_s / HOUR,
        sum(1 for r in result.records.values() if r.finish_s is not None),
        sum(waits) / len(waits) if waits else 0.0,
    )
