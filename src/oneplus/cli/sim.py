"""`oneplus sim`: replay a job trace on a modelled cluster (`run`) and the FGD anti-fragmentation protocol (`fgd`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from .render import error_console, print_whole

# The simulator (numpy, pandas, OR-Tools, matplotlib) is imported by the commands, never by `oneplus --help`.
if TYPE_CHECKING:
    from oneplus_queueing.config import QueueConfig
    from rich.progress import Progress

# oneplus_sim.policies.POLICY_NAMES and oneplus_sim.fgd.POLICIES, for the help texts (tests/cli keeps them equal).
POLICY_NAMES = (
    "oneplus",
    "k8s-default",
    "slurm-tree",
    "kueue-tas",
    "fifo-firstfit",
    "slurm-block",
    "kueue-tas-slices",
)
TIME_LIMIT_MODELS = ("user", "oracle")  # oneplus_sim.estimates.TIME_LIMIT_MODELS
ELASTIC_RULES = ("half",)  # oneplus_sim.elastic.ELASTIC_RULES
SCORERS = ("fgd", "bestfit", "random", "dotprod", "gpuclustering", "gpupacking", "oneplus")

app = typer.Typer(no_args_is_help=True)
console = Console()
err = error_console()

SHOWN = (
    "jobs",
    "avg_jct_s",
    "p95_wait_s",
    "p95_wait_large_s",
    "gpu_alloc_pct",
    "frag_pct",
    "tightest_domain_pct",
    "comm_slowdown_avg",
    "preemptions",
    "solver_p99_ms",
)


@app.callback()
def _sim() -> None:
    """Replay traces on a modelled cluster."""


def _fail(message: str) -> typer.Exit:
    err.print(f"[red]error:[/] {message}", highlight=False)
    return typer.Exit(2)


def _progress() -> Progress:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=True,
    )


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


@app.command()
def run(
    cluster: Annotated[Path, typer.Option(help="Cluster YAML, Tiresias spec CSV or openb node list")],
    trace: Annotated[Path, typer.Option(help="philly.csv, a Tiresias job CSV or an openb pod list")],
    json_out: Annotated[Path, typer.Option("--json", help="Where to write the report")],
    policy: Annotated[str, typer.Option(help=f"Comma list of {', '.join(POLICY_NAMES)}")] = ",".join(POLICY_NAMES),
    window: Annotated[str | None, typer.Option(help="START:END, jobs in submit order, e.g. 60000:80000")] = None,
    max_jobs: Annotated[int | None, typer.Option(help="At most this many jobs (after --window)")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the trace rules and the policies")] = 0,
    load: Annotated[float, typer.Option(help="Scale the arrival rate (2 = twice as fast)")] = 1.0,
    plot: Annotated[Path | None, typer.Option(help="Directory for PNG plots")] = None,
    queue_config: Annotated[
        Path | None,
        typer.Option(help="Queue-config YAML merged over the oneplus policy's own, e.g. `job_size: {weight: 500}`"),
    ] = None,
    time_limits: Annotated[
        str,
        typer.Option(
            help="Jobs' time limits: `user` (seeded model of user requests: round values, several times the run "
            "time; docs/simulator.md) or `oracle` (the exact run time)"
        ),
    ] = "user",
    tp_groups: Annotated[
        bool,
        typer.Option(
            "--tp-groups",
            help="Give jobs of >= 8 GPUs tensor-parallel groups of 8, 16 or 32 GPUs (seeded rule, docs/simulator.md); "
            "the report adds the share of TP groups inside one NVLink domain",
        ),
    ] = False,
    elastic: Annotated[
        str | None,
        typer.Option(
            help="Make trace jobs elastic gangs by this rule (`half`: multi-GPU jobs, min = half their ranks; "
            "docs/simulator.md) and run `oneplus-elastic` beside `oneplus` (the same jobs fixed at max)"
        ),
    ] = None,
) -> None:
    """Replay a trace with several policies in one process and write their figures as JSON."""
    from oneplus_sim.cluster import ClusterError
    from oneplus_sim.replay import ReplaySpec, run_replay
    from oneplus_sim.trace import TraceError, parse_window

    names = [p.strip() for p in policy.split(",") if p.strip()]
    unknown = [p for p in names if p not in POLICY_NAMES]
    if unknown or not names:
        raise _fail(f"--policy: unknown {', '.join(unknown) or '(empty)'}; choose from {', '.join(POLICY_NAMES)}")
    if time_limits not in TIME_LIMIT_MODELS:
        raise _fail(f"--time-limits: unknown {time_limits!r}; choose from {', '.join(TIME_LIMIT_MODELS)}")
    if elastic is not None and elastic not in ELASTIC_RULES:
        raise _fail(f"--elastic: unknown rule {elastic!r}; choose from {', '.join(ELASTIC_RULES)}")
    if elastic is not None and "oneplus" not in names:
        raise _fail("--elastic compares oneplus with and without elasticity: --policy must include oneplus")
    oneplus_config = _oneplus_config(queue_config) if queue_config is not None else None
    try:
        spec = ReplaySpec(
            cluster,
            trace,
            names,
            parse_window(window),
            max_jobs,
            seed,
            load,
            oneplus_config=oneplus_config,
            time_limits=time_limits,
            tp_groups=tp_groups,
            elastic=elastic,
        )
        with _progress() as bar:
            tasks: dict[str, Any] = {}

            def tick(name: str, done: int, total: int) -> None:
                if name not in tasks:
                    tasks[name] = bar.add_task(name, total=total)
                bar.update(tasks[name], completed=done)

            replay = run_replay(spec, on_progress=tick)
    except (TraceError, ClusterError) as e:
        raise _fail(str(e)) from None
    _write_json(json_out, replay.report)
    _table(replay.report)
    limits: dict[str, Any] = replay.report["time_limits"]  # type: ignore[assignment]
    seed_note = f", seed {limits['seed']}" if "seed" in limits else ""
    ratio = limits.get("median_limit_over_runtime")
    console.print(
        f"time limits: {limits['model']}{seed_note}" + (f" (median limit / run time {ratio})" if ratio else "")
    )
    if elastic is not None:
        _elastic_line(replay.report)
    console.print(f"report: {json_out}")
    if plot is not None:
        from oneplus_sim.plots import write_plots

        for p in write_plots(replay.results, plot):
            console.print(f"plot: {p}")


def _elastic_line(report: dict[str, Any]) -> None:
    """The comparison the --elastic run is for: the same jobs fixed at max (oneplus) and elastic."""
    figs = report["policies"]
    fixed, el = figs["oneplus"], figs["oneplus-elastic"]
    info = report["trace"]["elastic"]
    console.print(
        f"elastic ({info['rule']}, {info['jobs']} elastic jobs): avg JCT {fixed['avg_jct_s']} -> {el['avg_jct_s']} s, "
        f"p95 wait of big jobs (>= 8 GPUs) {fixed['p95_wait_large_s']} -> {el['p95_wait_large_s']} s, "
        f"GPU allocation {fixed['gpu_alloc_pct']} -> {el['gpu_alloc_pct']} %, "
        f"{el['elastic_grows']} grows, {el['elastic_shrinks']} shrinks",
        highlight=False,
    )


def _oneplus_config(path: Path) -> QueueConfig:
    import yaml
    from oneplus_queueing.config import QueueConfigError
    from oneplus_sim.policies.oneplus import sim_queue_config

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise _fail(f"--queue-config: cannot read {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise _fail(f"--queue-config: {path} is not valid YAML: {exc}") from None
    if data is not None and not isinstance(data, dict):
        raise _fail(f"--queue-config: {path} must hold a mapping of queue-config keys, got {type(data).__name__}")
    try:
        return sim_queue_config(data)
    except QueueConfigError as exc:
        raise _fail(f"--queue-config: {path}: {exc}") from None


def _table(report: dict[str, Any]) -> None:
    t = Table(title="trace replay")
    t.add_column("policy")
    shown = list(SHOWN)
    if any("tp_groups" in figs for figs in report["policies"].values()):
        shown[shown.index("comm_slowdown_avg") + 1 : shown.index("comm_slowdown_avg") + 1] = ["tp_in_nvlink_domain_pct"]
    for k in shown:
        t.add_column(k, justify="right")
    for name, figs in report["policies"].items():
        t.add_row(name, *(str(figs.get(k, "-")) for k in shown))
    print_whole(console, t)  # every column whole even when piped (rich assumes 80): a cut figure is worse


@app.command()
def fgd(
    nodes: Annotated[Path, typer.Option(help="openb_node_list_gpu_node.csv")],
    pods: Annotated[Path, typer.Option(help="openb_pod_list_*.csv")],
    json_out: Annotated[Path, typer.Option("--json", help="Where to write the report")],
    demand: Annotated[float, typer.Option(help="Inflate requested GPUs to this share of capacity")] = 1.3,
    seeds: Annotated[str, typer.Option(help="FIRST-LAST or a comma list")] = "42-51",
    policy: Annotated[str, typer.Option(help=f"Comma list of {', '.join(SCORERS)}")] = "oneplus,fgd,bestfit,random",
    arrivals: Annotated[
        Path | None,
        typer.Option(
            help="Replay the reference simulator's own workloads for these seeds (a file of bench/fgd_reference, "
            "e.g. data/traces/openb/reference_arrivals/openb_pod_list_default_42-51.jsonl.gz) instead of drawing "
            "them with Python's random streams"
        ),
    ] = None,
) -> None:
    """The FGD protocol: pods arrive until `demand` x capacity was asked for; GPU allocation and fragmentation."""
    from oneplus_sim.fgd import IDLE_KINDS, FgdInputError, parse_seeds, run_protocol

    names = [p.strip() for p in policy.split(",") if p.strip()]
    unknown = [p for p in names if p not in SCORERS]
    if unknown or not names:
        raise _fail(f"--policy: unknown {', '.join(unknown) or '(empty)'}; choose from {', '.join(SCORERS)}")
    try:
        seed_list = parse_seeds(seeds)
        with _progress() as bar:
            tasks: dict[tuple[str, int], Any] = {}

            def tick(name: str, s: int, done: int, total: int) -> None:
                if (name, s) not in tasks:
                    tasks[(name, s)] = bar.add_task(f"{name} seed {s}", total=total)
                if done % 200 == 0 or done == total:
                    bar.update(tasks[(name, s)], completed=done)

            report = run_protocol(nodes, pods, names, seed_list, demand, on_pod=tick, arrivals=arrivals)
    except FgdInputError as e:
        raise _fail(str(e)) from None
    per_policy: dict[str, dict[str, Any]] = report["policies"]  # type: ignore[assignment]
    report = {"gpu_alloc_pct": per_policy[names[0]]["gpu_alloc_pct"], "policy": names[0], **report}
    _write_json(json_out, report)
    drawn = "the reference's workloads" if arrivals is not None else "workloads drawn here"
    t = Table(title=f"FGD protocol at {demand:.0%} demand, seeds {seeds}, {drawn}")
    t.add_column("policy")
    t.add_column("gpu_alloc_pct", justify="right")
    t.add_column("failed pods (mean)", justify="right")
    t.add_column("idle at the end, % of GPUs: in shared GPUs / whole GPUs / stranded", justify="right")
    for name, figs in per_policy.items():
        idle = figs["idle_at_end_pct"]
        where = " / ".join(f"{idle.get(k, 0.0):.3f}" for k in IDLE_KINDS)
        t.add_row(name, str(figs["gpu_alloc_pct"]), str(figs["failed_pods_mean"]), where)
    print_whole(console, t)
    console.print(f"report: {json_out}")
