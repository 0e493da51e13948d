"""Durable JetStream appends per one-GPU job, submission to archive, per stream (issue 42, item 1).

Fresh embedded NATS and Redis, the demo's 4 simulated nodes, `--jobs` one-GPU jobs through the public submit path;
every stream's last sequence read before and after, the idle rate of each stream (heartbeats, liveness beats, the
owner lease) subtracted (`oneplus.writecount`). Prints the per-stream table and writes bench/results/writes.json.

    uv run task bench:writes                     # 100 jobs (~1 min)
    uv run python bench/writes_bench.py --jobs 300
    uv run python bench/writes_bench.py --duration 10 --out /tmp/w.json   # jobs that run long enough to be saved live
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from pathlib import Path

from benchkit import git_commit

from oneplus.writecount import LABELS, measure

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=100, help="one-GPU jobs to run (default 100)")
    ap.add_argument(
        "--duration", type=float, default=0.2, help="seconds each job runs (default 0.2; longer jobs get saved live)"
    )
    ap.add_argument("--idle", type=float, default=10.0, help="seconds of idle platform for the background rate")
    ap.add_argument("--out", type=Path, default=ROOT / "bench/results/writes.json")
    args = ap.parse_args()
    if args.jobs < 1:
        ap.error(f"--jobs must be at least 1, not {args.jobs}")
    if args.duration < 0:
        ap.error(f"--duration must be 0 or more seconds, not {args.duration}")
    with tempfile.TemporaryDirectory(prefix="oneplus-writes-") as tmp:
        count = asyncio.run(measure(args.jobs, Path(tmp), idle_s=args.idle, duration_s=args.duration))
    print(count.table())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "commit": git_commit(),
                "jobs": count.jobs,
                "duration_s": args.duration,
                "span_s": round(count.span_s, 2),
                "per_job": {LABELS.get(s, s): v for s, v in count.per_job().items()},
                "total_per_job": count.total,
                "appends": count.appends,
                "background_per_s": {s: round(v, 3) for s, v in count.background.items() if v},
            },
            indent=2,
        )
        + "\n"
    )
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
