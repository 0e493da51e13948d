"""`task bench`: a small version of the four benchmarks of BENCHMARKS.md, in well under 10 minutes on 2 cores.

1. trace replay: Philly's first jobs (`--philly-jobs`, default 4,000) on 512 H100 GPUs, all five policies;
2. FGD protocol: openb_pod_list_default at 130% demand, seeds 42-43 (the full protocol uses 42-51);
3. solver latency: bench/solver_bench.py with `--quick`, or with smaller sizes through its own flags;
4. end to end: bench/e2e_bench.py when it exists.
Writes bench/results/{trace_replay,fgd,solver_quick,e2e_quick}.json and the tables in bench/results/README.md
(the full-size solver.json and e2e.json of `task bench:solver` / `task bench:e2e` are left alone).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
TRACES = ROOT / "data" / "traces"
REPLAY_COLUMNS = (
    "jobs",
    "avg_jct_s",
    "p50_wait_s",
    "p95_wait_s",
    "p95_wait_large_s",
    "makespan_s",
    "gpu_alloc_pct",
    "frag_pct",
    "tightest_domain_pct",
    "comm_slowdown_avg",
    "preemptions",
    "lost_gpu_hours",
    "solver_p50_ms",
    "solver_p99_ms",
)


def _write(name: str, data: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / name
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return path


def trace_replay(jobs: int) -> dict[str, Any]:
    from oneplus_sim.policies import POLICY_NAMES
    from oneplus_sim.replay import ReplaySpec, run_replay

    spec = ReplaySpec(ROOT / "bench/clusters/h100_512.yaml", TRACES / "philly/philly.csv", POLICY_NAMES, max_jobs=jobs)
    report = run_replay(spec).report
    report["command"] = (
        "uv run oneplus sim run --cluster bench/clusters/h100_512.yaml --trace data/traces/philly/philly.csv "
        f"--max-jobs {jobs} --json bench/results/trace_replay.json"
    )
    return report


def fgd(seeds: list[int]) -> dict[str, Any]:
    from oneplus_sim.fgd import run_protocol

    report = run_protocol(
        TRACES / "openb/openb_node_list_gpu_node.csv",
        TRACES / "openb/openb_pod_list_default.csv",
        ["oneplus", "fgd", "bestfit", "random"],
        seeds,
        1.3,
    )
    report["published_130pct"] = {"Random": 87.47, "BestFit": 93.08, "FGD": 95.39}
    report["command"] = (
        "uv run oneplus sim fgd --nodes data/traces/openb/openb_node_list_gpu_node.csv "
        f"--pods data/traces/openb/openb_pod_list_default.csv --seeds {seeds[0]}-{seeds[-1]} "
        "--policy oneplus,fgd,bestfit,random --json bench/results/fgd.json"
    )
    return report


def _run(cmd: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False)


def solver(timeout: float) -> dict[str, Any]:
    script = ROOT / "bench" / "solver_bench.py"
    if not script.exists():
        return {"skipped": "bench/solver_bench.py is not there"}
    out = RESULTS / "solver_quick.json"
    help_text = _run([sys.executable, str(script), "--help"], 60).stdout
    if "--quick" in help_text:
        args = ["--quick", "--out", str(out)]
    elif "--single-decisions" in help_text:
        args = [
            "--single-nodes",
            "1024",
            "--single-fills",
            "1",
            "--single-decisions",
            "100",
            "--batch-nodes",
            "1024",
            "--batch-gangs",
            "50",
            "--out",
            str(out),
        ]
    else:
        return {"skipped": "bench/solver_bench.py has neither --quick nor size flags"}
    done = _run([sys.executable, str(script), *args], timeout)
    if done.returncode != 0 or not out.exists():
        return {"failed": done.returncode, "stderr_tail": done.stderr[-2000:]}
    data: dict[str, Any] = json.loads(out.read_text())
    data["command"] = "uv run python bench/solver_bench.py " + " ".join(args).replace(str(ROOT) + "/", "")
    return data


def e2e(timeout: float) -> dict[str, Any]:
    script = ROOT / "bench" / "e2e_bench.py"
    if not script.exists():
        return {"skipped": "bench/e2e_bench.py is not there yet"}
    help_text = _run([sys.executable, str(script), "--help"], 60).stdout
    args = ["--quick"] if "--quick" in help_text else []
    out = RESULTS / "e2e_quick.json"
    if "--out" in help_text:
        args += ["--out", str(out)]
    done = _run([sys.executable, str(script), *args], timeout)
    if done.returncode != 0:
        return {"failed": done.returncode, "stderr_tail": done.stderr[-2000:]}
    try:
        data: dict[str, Any] = json.loads(out.read_text()) if out.exists() else json.loads(done.stdout)
    except json.JSONDecodeError:
        data = {"stdout_tail": done.stdout[-2000:]}
    data["command"] = "uv run python bench/e2e_bench.py " + " ".join(args).replace(str(ROOT) + "/", "")
    return data


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:,.2f}" if abs(v) >= 100 else f"{v:.4g}"
    return str(v)


def markdown(sections: dict[str, dict[str, Any]], wall: dict[str, float]) -> str:
    lines = [
        "# Benchmark results",
        "",
        "Written by `task bench` (`uv run python bench/run_all.py`): a small version of the four benchmarks of",
        "BENCHMARKS.md. Compare policies within one run, as ratios; machines here are shared and noisy.",
        "",
        f"Machine: {os.cpu_count()} CPUs, {platform.processor() or platform.machine()}, Python "
        f"{platform.python_version()}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.",
        "",
    ]
    rep = sections["trace_replay"]
    lines += [f"## 1. Trace replay ({wall.get('trace_replay', 0):.0f} s)", "", f"`{rep.get('command', '')}`", ""]
    if "policies" in rep:
        lines += ["| policy | " + " | ".join(REPLAY_COLUMNS) + " |", "|---" * (len(REPLAY_COLUMNS) + 1) + "|"]
        for name, figs in rep["policies"].items():
            lines.append(f"| {name} | " + " | ".join(_fmt(figs.get(k)) for k in REPLAY_COLUMNS) + " |")
        lines += ["", f"Trace rules: {json.dumps(rep.get('rules', {}))}", ""]
    f = sections["fgd"]
    lines += [f"## 2. FGD protocol at 130% demand ({wall.get('fgd', 0):.0f} s)", "", f"`{f.get('command', '')}`", ""]
    if "policies" in f:
        lines += ["| policy | gpu_alloc_pct (mean) | per seed | failed pods |", "|---|---|---|---|"]
        for name, figs in f["policies"].items():
            lines.append(
                f"| {name} | {figs['gpu_alloc_pct']} | {figs['gpu_alloc_pct_by_seed']} | {figs['failed_pods_mean']} |"
            )
        lines += ["", f"Published means of seeds 42-51: {f.get('published_130pct')}", ""]
    for key, title in (("solver", "3. Solver latency"), ("e2e", "4. End to end")):
        s = sections[key]
        lines += [f"## {title} ({wall.get(key, 0):.0f} s)", ""]
        if "command" in s:
            lines += [f"`{s['command']}`", ""]
        lines += ["| figure | value |", "|---|---|"]
        for k, v in s.items():
            if k != "command" and not isinstance(v, (dict, list)):
                lines.append(f"| {k} | {_fmt(v)} |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--philly-jobs", type=int, default=4000)
    p.add_argument("--fgd-seeds", default="42-43")
    p.add_argument("--solver-timeout", type=float, default=180)
    p.add_argument("--e2e-timeout", type=float, default=180)
    args = p.parse_args()
    lo, _, hi = args.fgd_seeds.partition("-")
    seeds = list(range(int(lo), int(hi or lo) + 1))
    steps: dict[str, Callable[[], dict[str, Any]]] = {
        "trace_replay": lambda: trace_replay(args.philly_jobs),
        "fgd": lambda: fgd(seeds),
        "solver": lambda: solver(args.solver_timeout),
        "e2e": lambda: e2e(args.e2e_timeout),
    }
    files: dict[str, str | None] = {"trace_replay": "trace_replay.json", "fgd": "fgd.json", "solver": None, "e2e": None}
    sections: dict[str, dict[str, Any]] = {}
    wall: dict[str, float] = {}
    for name, step in steps.items():
        t0 = time.perf_counter()
        print(f"[bench] {name} ...", flush=True)
        sections[name] = step()
        wall[name] = time.perf_counter() - t0
        out = files[name]
        if out and "skipped" not in sections[name]:
            _write(out, sections[name])
        print(f"[bench] {name} done in {wall[name]:.0f} s", flush=True)
    (RESULTS / "README.md").write_text(markdown(sections, wall) + "\n", encoding="utf-8")
    print((RESULTS / "README.md").read_text())


if __name__ == "__main__":
    main()
