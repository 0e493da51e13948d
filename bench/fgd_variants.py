"""Variants of the live FGD policy on the FGD protocol (openb, 130% demand): does any of them place more GPUs?

The live policy (`placement: fgd`, run here through `oneplus_sim.fgd_live.run_live`, as `oneplus sim fgd --policy
oneplus` runs it) sorts the nodes for a whole-GPU pod by FGD's score in whole points, then an untouched node last,
then the ring, then the seed's node order. Each variant below changes one thing, for this process only:

- tie-breaks among nodes of equal score (after "untouched last"):
  `tightest`: fewest whole GPUs left after the pod; `tightest-multi`: the same for pods of two GPUs or more only;
  `exact`: the least exact (unrounded) growth of fragmentation; `least-idle`: fewest milli-GPUs left after;
- `aligned`: among nodes of equal score, for whole GPUs and shares alike, the node whose free CPU, memory and GPU
  line up best with what the pod asks (Tetris' alignment, Grandl et al., SIGCOMM '14: the dot product of the two
  vectors, each part over the node's capacity); aimed at the capacity stranded on nodes whose CPU or memory runs out;
- the GPU a share takes on its node, among GPUs of equal score (the live rule: the lowest position):
  `tight-gpu`: the GPU the share leaves with the fewest milli-GPUs (best fit; the idle GPU capacity left at 130% is
  almost all such remainders of shared GPUs);
  `sum-squares`: the GPU, and among nodes of equal score the node, whose share grows least the sum over gap sizes
  of the squared count of the cluster's shared GPUs with that gap (Csirik, Johnson, Kenyon, Orlin, Shor and Weber's
  Sum-of-Squares rule for online bin packing, SIAM J. Comput. 2006: keep every gap size as rare as the items that
  fill it);
- what the live policy adds to FGD: `no-untouched` drops its rule "an untouched node last" (whole GPUs, shares and
  CPU-only pods); `no-memory` gives it the reference's measure, which does not read memory; with both, the live
  policy is FGD as the reference runs it;
- the typical pods FGD measures fragmentation against (the paper weighs each shape by how many pods have it):
  `weight-gpus`: by the GPUs its pods ask; `weight-sqrt`: by the square root of that; `popularity-100`: every
  shape, not the most frequent ones covering 95% of pods;
- the resolution of FGD's score, which decides how many nodes tie and so how much the tie-breaks pack (the live
  score is whole points of 0-100, as the FGD plugin hands it to kube-scheduler): `points-0.1`, `points-0.5`:
  tenths and halves of a point; `points-2`, `points-5`: steps of 2 and 5 points (for whole GPUs, shares and
  CPU-only pods alike).

None of these is in the product: the script swaps the fitter's sort key or the typical pods around each run. It
prints one JSON line a variant and pod list (mean `gpu_alloc_pct` over the seeds, and each seed's) and writes them
all to `--out`. About 5 s a seed and variant on the multi-GPU lists. `--reference` replays the reference simulator's
own workloads of seeds 42-51 instead of Python's draws (docs/simulator.md).

    uv run python bench/fgd_variants.py --pods multigpu40,multigpu50 --seeds 0-9 --out bench/results/fgd_variants.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import oneplus_placement.fitters as fitters
import oneplus_sim.fgd_live as fgd_live
from benchkit import git_commit
from oneplus_placement.fgd import FragMeter, WorkloadShape, after, typical_shapes
from oneplus_placement.fitters import FgdShareFitter, FgdState, FgdWholeGpuFitter, gpu_left
from oneplus_placement.snapshot import FULL_SHARE, Holdings
from oneplus_sim.fgd import Pod, PodRes, Workload, load_nodes, load_pods, parse_seeds, typical_pods
from oneplus_sim.fgd_reference import load_reference_workloads

ROOT = Path(__file__).resolve().parents[1]
OPENB = ROOT / "data/traces/openb"

TIE_BREAKS = ("tightest", "tightest-multi", "exact", "least-idle", "aligned")
SHARE_GPU = ("tight-gpu", "sum-squares")
WEIGHTS = ("weight-gpus", "weight-sqrt", "popularity-100")
RESOLUTIONS = {"points-0.1": 0.1, "points-0.5": 0.5, "points-2": 2.0, "points-5": 5.0}
RULES = ("no-untouched", "no-memory")
VARIANTS = ("live", *TIE_BREAKS, *SHARE_GPU, *WEIGHTS, *RESOLUTIONS, *RULES)


def tie_break_fit(variant: str) -> Callable[[FgdWholeGpuFitter, int, int], tuple[float, ...]]:
    """The live `FgdWholeGpuFitter.fit_part`, with one more key after "untouched last" (its last key is the ring)."""
    live = FgdWholeGpuFitter.fit_part

    def fit_part(self: FgdWholeGpuFitter, i: int, units: int) -> tuple[float, ...]:
        key = live(self, i, units)
        state = FgdState(self, self.meter, i)
        n = units * self.req.unit_gpus
        left_after = after(tuple(sorted(state.left, reverse=True)), WorkloadShape(0, FULL_SHARE, n))[0]
        extra: float = 0
        if variant == "tightest" or (variant == "tightest-multi" and n >= 2):
            extra = sum(1 for x in left_after if x == FULL_SHARE)
        elif variant == "exact":
            extra = state.growth(left_after, units)
        elif variant == "least-idle":
            extra = sum(left_after)
        elif variant == "aligned":
            extra = -alignment(self, i, units)
        return (*key[:-1], extra, key[-1])

    return fit_part


def alignment(fitter: FgdWholeGpuFitter | FgdShareFitter, i: int, units: int) -> float:
    """Tetris' alignment of `units` units of the request with node `i`'s free capacity, each part over capacity."""
    slot, snap, req = fitter.layout.slots[i], fitter.snap, fitter.req
    gpu_cap = slot.shape.n * FULL_SHARE
    gpu_ask = units * (req.milli if req.shared else req.unit_gpus * FULL_SHARE)
    return (
        (units * req.unit_cpus / slot.cpus) * (snap.cpu_free(i) / slot.cpus)
        + (units * req.unit_memory_mb / slot.memory_mb) * (snap.mem_free(i) / slot.memory_mb)
        + (gpu_ask / gpu_cap) * (sum(gpu_left(snap, i)) / gpu_cap)
    )


def aligned_share_fit(self: FgdShareFitter, i: int, units: int) -> tuple[float, ...]:
    """`FgdShareFitter.fit_part` for `aligned`: the live key (score, untouched last), then the alignment."""
    return (*LIVE_SHARE_FIT(self, i, units), -alignment(self, i, units))


LIVE_SHARE_FIT = FgdShareFitter.fit_part


def tight_gpu_order(self: FgdShareFitter, left: int, p: int) -> tuple[int, ...]:
    """`FgdShareFitter.gpu_order` for `tight-gpu`: the GPU the share leaves with the fewest milli-GPUs first."""
    return (left - self.req.milli, p)


def gap_counts(snap: Holdings) -> dict[int, int]:
    """How many shared GPUs of the cluster have each gap (milli-GPUs left), for `sum-squares`."""
    counts: dict[int, int] = {}
    for i, shares in enumerate(snap.shares):
        if shares is None:
            continue
        mask = snap.share_mask[i] & ~snap.blocked[i]
        for p, used in enumerate(shares):
            if mask >> p & 1:
                gap = FULL_SHARE - used
                counts[gap] = counts.get(gap, 0) + 1
    return counts


def ss_delta(counts: dict[int, int], gap: int, milli: int) -> int:
    """Growth of the sum of squares of the gap counts when a share of `milli` goes into a GPU with `gap` left
    (Csirik et al.'s Sum-of-Squares rule for online bin packing; a whole free GPU is a new bin)."""
    out = 0
    if gap < FULL_SHARE:
        out += 1 - 2 * counts.get(gap, 0)
    rest = gap - milli
    if rest > 0:
        out += 2 * counts.get(rest, 0) + 1
    return out


def ss_counts(self: FgdShareFitter) -> dict[int, int]:
    got = getattr(self, "_ss_counts", None)
    if got is None:
        got = gap_counts(self.snap)
        self._ss_counts = got  # type: ignore[attr-defined]
    return got


def ss_gpu_order(self: FgdShareFitter, left: int, p: int) -> tuple[int, ...]:
    """`FgdShareFitter.gpu_order` for `sum-squares`: the GPU whose share grows the sum of squares least."""
    return (ss_delta(ss_counts(self), left, self.req.milli), p)


def ss_share_fit(self: FgdShareFitter, i: int, units: int) -> tuple[float, ...]:
    """`FgdShareFitter.fit_part` for `sum-squares`: the live key, then the sum-of-squares growth of its GPU."""
    positions, score, state = self._positions(i, units)
    counts = ss_counts(self)
    extra = sum(ss_delta(counts, state.left[p], self.req.milli) for p in positions)
    return (score, state.untouched, float(extra))


def weighted_typical(variant: str) -> Callable[[Sequence[Pod]], list[tuple[PodRes, float]]]:
    def typical(pods: Sequence[Pod]) -> list[tuple[PodRes, float]]:
        if variant == "popularity-100":
            return typical_shapes((p.res for p in pods), 100.0)
        power = 1.0 if variant == "weight-gpus" else 0.5
        # A CPU-only shape asks no GPU, so a weight by GPUs leaves it out.
        weighted = [(s, f * (s.total_milli / FULL_SHARE) ** power) for s, f in typical_pods(pods) if s.total_milli]
        total = sum(w for _, w in weighted)
        return [(s, w / total) for s, w in weighted]

    return typical


def score_in_steps(step: float) -> Callable[[float], float]:
    """`oneplus_placement.fgd.gradient_score` in steps of `step` points instead of whole points."""

    def score(drop: float) -> float:
        x = drop / 1000
        points = 100.0 / (1.0 + math.exp(-x)) if x > -700 else 0.0
        return math.floor(points / step) * step

    return score


@contextlib.contextmanager
def variant_in_force(variant: str) -> Iterator[None]:
    # Patched by name: the variants are a measurement, not a policy the product offers.
    targets = (
        (FgdWholeGpuFitter, "fit_part"),
        (FgdShareFitter, "gpu_order"),
        (FgdShareFitter, "fit_part"),
        (fgd_live, "typical_pods"),
        (fitters, "gradient_score"),
        (fgd_live, "gradient_score"),
        (FgdState, "untouched"),
        (fgd_live, "untouched"),
        (fgd_live, "live_meter"),
    )
    originals = [(owner, name, getattr(owner, name)) for owner, name in targets]
    if variant in TIE_BREAKS:
        setattr(FgdWholeGpuFitter, "fit_part", tie_break_fit(variant))  # noqa: B010
        if variant == "aligned":
            setattr(FgdShareFitter, "fit_part", aligned_share_fit)  # noqa: B010
    elif variant in SHARE_GPU:
        if variant == "tight-gpu":
            setattr(FgdShareFitter, "gpu_order", tight_gpu_order)  # noqa: B010
        else:
            setattr(FgdShareFitter, "gpu_order", ss_gpu_order)  # noqa: B010
            setattr(FgdShareFitter, "fit_part", ss_share_fit)  # noqa: B010
    elif variant in WEIGHTS:
        setattr(fgd_live, "typical_pods", weighted_typical(variant))  # noqa: B010
    elif variant in RESOLUTIONS:
        for module in (fitters, fgd_live):
            setattr(module, "gradient_score", score_in_steps(RESOLUTIONS[variant]))  # noqa: B010
    elif variant == "no-untouched":
        setattr(FgdState, "untouched", property(lambda self: 0.0))  # noqa: B010
        setattr(fgd_live, "untouched", lambda left: False)  # noqa: B010
    elif variant == "no-memory":
        setattr(fgd_live, "live_meter", lambda pods: FragMeter(typical_pods(pods)))  # noqa: B010
    try:
        yield
    finally:
        for owner, name, value in originals:
            setattr(owner, name, value)


def run(variant: str, pod_list: str, seeds: Sequence[int], demand: float, reference: bool = False) -> dict[str, Any]:
    nodes_path, pods_path = OPENB / "openb_node_list_gpu_node.csv", OPENB / f"openb_pod_list_{pod_list}.csv"
    nodes, pods = load_nodes(nodes_path), load_pods(pods_path)
    works: dict[int, Workload] = {}
    if reference:
        arrivals = OPENB / "reference_arrivals" / f"openb_pod_list_{pod_list}_42-51.jsonl.gz"
        works = load_reference_workloads(arrivals, nodes_path, pods_path, nodes, pods, demand)
    t0 = time.monotonic()
    with variant_in_force(variant):
        per_seed = [fgd_live.run_live(nodes, pods, s, demand, work=works.get(s)).alloc_at(100 * demand) for s in seeds]
    return {
        "variant": variant,
        "pods": pod_list,
        "workloads": "the reference's own draws" if reference else "drawn by Python's random streams",
        "seeds": list(seeds),
        "gpu_alloc_pct": round(statistics.mean(per_seed), 3),
        "per_seed": [round(v, 3) for v in per_seed],
        "wall_s": round(time.monotonic() - t0, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pods", default="multigpu40,multigpu50", help="openb pod lists (the NN of openb_pod_list_NN)")
    ap.add_argument("--seeds", default="0-9")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"of {', '.join(VARIANTS)}")
    ap.add_argument("--demand", type=float, default=1.3)
    ap.add_argument(
        "--reference",
        action="store_true",
        help="replay the reference simulator's own workloads (seeds 42-51, data/traces/openb/reference_arrivals)",
    )
    ap.add_argument("--out", type=Path, default=ROOT / "bench/results/fgd_variants.json")
    args = ap.parse_args()
    variants = args.variants.split(",")
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        ap.error(f"unknown variant(s) {', '.join(unknown)}; choose from {', '.join(VARIANTS)}")
    rows = []
    for pod_list in args.pods.split(","):
        for variant in variants:
            row = run(variant, pod_list, parse_seeds(args.seeds), args.demand, args.reference)
            print(json.dumps(row), flush=True)
            rows.append(row)
    args.out.write_text(json.dumps({"commit": git_commit(), "demand": args.demand, "runs": rows}, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
