"""`oneplus place`: one placement decision on an offline cluster, by the same code the live solver runs."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from .render import error_console

# OR-Tools (pulled in by oneplus_placement) and pandas cost 2 s of CPU to import: only `oneplus place` pays it.
if TYPE_CHECKING:
    from oneplus_contracts import JobSpec
    from oneplus_topology.cluster import Cluster

app = typer.Typer(no_args_is_help=True)
console = Console()
err = error_console()


def _fail(message: str) -> typer.Exit:
    err.print(f"[red]error:[/] {escape(message)}", highlight=False)
    return typer.Exit(2)


def parse_fill(value: str) -> tuple[int, float]:
    """`SEED:PCT`, e.g. `7:60` holds 60% of the GPUs with seed 7."""
    seed_s, sep, pct_s = value.partition(":")
    try:
        if not sep:
            raise ValueError
        seed, pct = int(seed_s), float(pct_s)
    except ValueError:
        raise ValueError(f"--fill must be SEED:PCT (e.g. 7:60), got {value!r}") from None
    if not 0 <= pct <= 100:
        raise ValueError(f"--fill percentage must be between 0 and 100, got {pct:g}")
    return seed, pct


def load_job(path: Path) -> JobSpec:
    """A job file in any format `oneplus submit -f` takes (JobSpec, Kubeflow manifests, sbatch scripts)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ValueError(f"{path}: cannot read: {e.strerror}") from e
    from oneplus_jobformats.load import load_job_document

    return load_job_document(text, filename=str(path)).spec  # JobFormatError is a ValueError naming the problem


def job_from_gpus(cluster: Cluster, gpus: float, per_rank: float | None) -> JobSpec:
    """`--gpus N [--gpus-per-rank K]`: N/K ranks of K GPUs; K defaults to the largest divisor of N a node holds."""
    from oneplus_contracts import JobSpec

    if gpus <= 0:
        raise ValueError(f"--gpus must be positive, got {gpus:g}")
    if gpus < 1:
        if per_rank is not None and per_rank != gpus:
            raise ValueError("a GPU share (--gpus below 1) is one rank; leave out --gpus-per-rank")
        return JobSpec(name="place", resources={"gpus": gpus})
    if gpus != int(gpus):
        raise ValueError(f"--gpus {gpus:g}: more than one GPU must be a whole number")
    total = int(gpus)
    if per_rank is None:
        biggest = max(len(n.gpus) for n in cluster.nodes)
        k = max(d for d in range(1, min(total, biggest) + 1) if total % d == 0)
    else:
        if per_rank < 1 or per_rank != int(per_rank):
            raise ValueError(f"--gpus-per-rank must be a whole number of GPUs, got {per_rank:g}")
        k = int(per_rank)
        if total % k:
            raise ValueError(f"--gpus {total} is not a multiple of --gpus-per-rank {k}")
    return JobSpec(name="place", ranks=total // k, resources={"gpus": k})


def decide(cluster: Cluster, spec: JobSpec, fill: tuple[int, float] | None = None, seed: int = 0) -> dict[str, Any]:
    """The decision as the `--json` output prints it."""
    from oneplus_placement import ClusterSnapshot, place_gang, seeded_fill

    snap = ClusterSnapshot.from_cluster(cluster)
    if fill is not None:
        snap = seeded_fill(snap, fill[0], fill[1])
    started = time.perf_counter()
    result = place_gang(snap, spec, job_id=spec.name, seed=seed)
    out: dict[str, Any] = {"job": spec.name, "requested_gpus": spec.total_gpus}
    if result.allocation is not None:
        alloc = result.allocation
        out |= {
            "placed": True,
            "ranks": [
                {"rank": r.rank, "node": r.node, "gpus": r.gpus} | ({"gpu_milli": r.gpu_milli} if r.gpu_milli else {})
                for r in alloc.ranks
            ],
            "ring_gbps": alloc.ring_gbps,
            "domain": alloc.domain,
            "solver": alloc.solver,
            "score": alloc.score,
        }
    else:
        assert result.explanation is not None
        out |= {
            "placed": False,
            "explanation": result.explanation.message,
            "blocked": result.explanation.to_dict(),
        }
    out["decision_ms"] = round((time.perf_counter() - started) * 1000, 3)
    if fill is not None:
        out["fill"] = {"seed": fill[0], "pct": fill[1], "free_gpus": snap.total_free_gpus()}
    return out


@app.command()
def place(
    cluster: Annotated[Path, typer.Option("--cluster", help="Cluster YAML (see docs/topology.md)")],
    job: Annotated[Path | None, typer.Option("--job", help="JobSpec as YAML or JSON")] = None,
    gpus: Annotated[float | None, typer.Option("--gpus", help="GPUs of the gang (instead of --job)")] = None,
    gpus_per_rank: Annotated[float | None, typer.Option("--gpus-per-rank", help="GPUs per rank (with --gpus)")] = None,
    fill: Annotated[str | None, typer.Option("--fill", help="SEED:PCT: first hold PCT% of GPUs at random")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Tie-break seed among equally good nodes")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the decision as JSON")] = False,
) -> None:
    """Place one job on an offline cluster and print the decision (or why it cannot be placed)."""
    from oneplus_topology.cluster import load_cluster
    from oneplus_topology.errors import ClusterConfigError

    if (job is None) == (gpus is None):
        raise _fail("give exactly one of --job JOB.yaml or --gpus N")
    if gpus_per_rank is not None and gpus is None:
        raise _fail("--gpus-per-rank goes with --gpus")
    try:
        topo = load_cluster(cluster)
    except ClusterConfigError as e:
        raise _fail(str(e)) from None
    try:
        spec = load_job(job) if job is not None else job_from_gpus(topo, float(gpus or 0), gpus_per_rank)
        filled = parse_fill(fill) if fill is not None else None
    except ValueError as e:
        raise _fail(str(e)) from None
    out = decide(topo, spec, filled, seed)
    if as_json:
        typer.echo(json.dumps(out))
        return
    _render(out)


def _render(out: dict[str, Any]) -> None:
    from rich.table import Table

    from .render import print_whole

    if not out["placed"]:
        console.print(f"[yellow]not placed:[/] {escape(out['explanation'])}", highlight=False)
        return
    table = Table(title=f"{out['job']}: {out['requested_gpus']:g} GPUs, domain {out['domain']}")
    for col in ("rank", "node", "gpus"):
        table.add_column(col)
    for r in out["ranks"]:
        share = f" x {r['gpu_milli'] / 1000:g}" if r.get("gpu_milli") else ""
        table.add_row(str(r["rank"]), r["node"], ",".join(map(str, r["gpus"])) + share)
    print_whole(console, table)
    score = out["score"]
    console.print(
        f"ring {out['ring_gbps']:g} GB/s (ideal {score.get('ideal_ring_gbps', 0):g}), solver {out['solver']}, "
        f"{out['decision_ms']:g} ms",
        highlight=False,
    )
