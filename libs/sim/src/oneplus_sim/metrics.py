"""The per-policy figures of BENCHMARKS.md §1, computed from one `SimResult`."""

from __future__ import annotations

import math
from collections.abc import Sequence

from .engine import SimResult

LARGE_GPUS = 8


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default); 0 for no values."""
    if not values:
        return 0.0
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _r(x: float, nd: int = 3) -> float:
    return round(x, nd) if math.isfinite(x) else x


def figures(res: SimResult) -> dict[str, object]:
    done = [r for r in res.records.values() if r.finish_s is not None]
    jct = [r.finish_s - r.job.submit_s for r in done if r.finish_s is not None]
    waits = [r.wait_s for r in done]
    large = [r.wait_s for r in done if r.job.gpus >= LARGE_GPUS]
    by_prio: dict[int, list[float]] = {}
    for r in done:
        by_prio.setdefault(r.job.priority, []).append(r.wait_s)
    weight = slowed = 0.0
    multi = tight = 0
    for r in done:
        if not r.job.is_multi_gpu:
            continue
        for w, s, _b, _bs, is_tight in r.segments:
            weight += w
            slowed += w * s
            multi += 1
            tight += is_tight
    tp_inside = sum(i for r in done for i, _ in r.tp_groups)
    tp_total = sum(n for r in done for _, n in r.tp_groups)
    tp_weight = tp_slowed = 0.0
    for r in done:
        if r.tp_groups:
            tp_weight += sum(w for w, *_ in r.segments)
            tp_slowed += sum(w * s for w, s, *_ in r.segments)
    span = max(res.end_s - res.start_s, 1e-9)
    ms = res.cycle_ms
    return {
        "jobs": len(done),
        "unplaced": len(res.unplaced),
        "avg_jct_s": _r(sum(jct) / len(jct)) if jct else 0.0,
        "p50_wait_s": _r(percentile(waits, 50)),
        "p95_wait_s": _r(percentile(waits, 95)),
        "p95_wait_large_s": _r(percentile(large, 95)),
        "makespan_s": _r(res.end_s - res.start_s),
        "gpu_alloc_pct": _r(100 * res.alloc_gpu_s / (res.total_gpus * span)),
        "frag_pct": _r(100 * res.unusable_free_gpu_s / res.free_gpu_s) if res.free_gpu_s else 0.0,
        "tightest_domain_pct": _r(100 * tight / multi) if multi else 100.0,
        "comm_slowdown_avg": _r(slowed / weight, 4) if weight else 1.0,
        **(
            {
                "tp_groups": tp_total,
                "tp_in_nvlink_domain_pct": _r(100 * tp_inside / tp_total),
                "comm_slowdown_tp_avg": _r(tp_slowed / tp_weight, 4) if tp_weight else 1.0,
            }
            if tp_total
            else {}
        ),
        "p95_wait_by_priority": {str(p): _r(percentile(v, 95)) for p, v in sorted(by_prio.items())},
        "preemptions": res.preemptions,
        "lost_gpu_hours": _r(sum(r.lost_gpu_s for r in done) / 3600),
        "solver_p50_ms": _r(percentile(ms, 50), 4),
        "solver_p99_ms": _r(percentile(ms, 99), 4),
        "cycles": len(ms),
        "batch_plans": res.counters.get("batch_plans", 0),
        # Elastic gangs (oneplus-elastic): restarts at a larger size, and victims that shrank instead of going.
        "elastic_grows": res.counters.get("elastic_grows", 0),
        "elastic_shrinks": res.counters.get("elastic_shrinks", 0),
    }
