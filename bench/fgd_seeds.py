"""Pool the per-seed results of `oneplus sim fgd` runs on one openb pod list and put them beside FGD's published mean.

A ten-seed mean of the FGD protocol moves by a few hundredths between seed sets, as much as the gaps it is used to
judge. This reads every `--json` report given (each one list, seeds that do not overlap), pools their seeds, and
prints for each policy the mean, the seed-to-seed standard deviation and the standard error; the paired difference
between two policies on the same seeds; the range of the means of consecutive blocks of ten seeds; and the published
mean at the same demand (`data/traces/openb/FGD_summary_tables.md`, the reference's seeds 42-51).

    uv run python bench/fgd_seeds.py bench/results/fgd_openb_multigpu40_*.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SUMMARY = ROOT / "data/traces/openb/FGD_summary_tables.md"


def published_fgd(pod_list: str, demand_pct: int) -> float | None:
    """FGD's published mean GPU allocation for `pod_list` (e.g. openb_pod_list_multigpu40) at `demand_pct`."""
    table = None
    for line in SUMMARY.read_text().splitlines():
        if line.startswith("## "):
            table = line.startswith("## GPU allocation ratio") and f"= {demand_pct}% of cluster" in line
        elif table and line.split() and line.split()[0] == pod_list:
            return float(line.split()[-1])  # the last column is 06-FGD
    return None


def pooled(reports: list[dict[str, Any]], policy: str) -> dict[int, float]:
    seeds: dict[int, float] = {}
    for rep in reports:
        for seed, value in rep["policies"][policy]["gpu_alloc_pct_by_seed"].items():
            if int(seed) in seeds:
                raise SystemExit(f"seed {seed} is in more than one report: give reports of disjoint seeds")
            seeds[int(seed)] = float(value)
    return seeds


def summary(values: list[float]) -> dict[str, float]:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return {"mean": round(statistics.mean(values), 4), "sd": round(sd, 4), "se": round(sd / len(values) ** 0.5, 4)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("reports", nargs="+", type=Path, help="`oneplus sim fgd --json` reports of one pod list")
    ap.add_argument("--against", default="fgd", help="the policy the others are paired with (default: fgd)")
    ap.add_argument("--block", type=int, default=10, help="seeds a block (the protocol's ten)")
    args = ap.parse_args()
    reports = [json.loads(p.read_text()) for p in args.reports]
    lists = {Path(r["pods"]).stem for r in reports}
    demands = {round(100 * float(r["demand"])) for r in reports}
    if len(lists) != 1 or len(demands) != 1:
        raise SystemExit(f"reports of one pod list at one demand, please (got {sorted(lists)} at {sorted(demands)}%)")
    pod_list, demand = lists.pop(), demands.pop()
    policies = sorted(set.intersection(*(set(r["policies"]) for r in reports)))
    out: dict[str, Any] = {"pods": pod_list, "demand_pct": demand, "published_fgd": published_fgd(pod_list, demand)}
    by_policy = {p: pooled(reports, p) for p in policies}
    base = by_policy.get(args.against)
    for policy, seeds in by_policy.items():
        order = sorted(seeds)
        blocks = [
            statistics.mean(seeds[s] for s in order[i : i + args.block])
            for i in range(0, len(order) - args.block + 1, args.block)
        ]
        row: dict[str, Any] = {"seeds": len(seeds), **summary(list(seeds.values()))}
        if blocks:
            row[f"{args.block}_seed_blocks"] = {
                "n": len(blocks),
                "min": round(min(blocks), 3),
                "max": round(max(blocks), 3),
            }
        if base is not None and policy != args.against:
            common = sorted(set(seeds) & set(base))
            diff = summary([seeds[s] - base[s] for s in common])
            row[f"minus_{args.against}"] = {"mean": diff["mean"], "se": diff["se"], "seeds": len(common)}
        out[policy] = row
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
