"""Only a weaker board is free: run slower now, or wait for a strong one? Decided by expected completion time.

A gang whose best allocation now has a ring below `BOARD_PAR` of the cluster's best for its shape (say four V100s
on NV3 pairs, 13.8 GB/s, while H100 boards give 150 GB/s) would run `slowdown(f, B*, B)` times longer there: the
simulator's communication model (`oneplus_placement.bandwidth.slowdown`). If a strong board is expected free
soon enough (the running jobs on it end by their time limits) that waiting and running at full speed finishes
first, the gang waits, with the reason in `jobs explain`; otherwise it runs now. The job's own time limit is its
length (users overestimate, so both sides are pessimistic alike); f is the queue config's `boards.comm_fraction`
(default the middle of the simulator's range for one-node jobs: no job says how much it communicates). Gangs of
several nodes, and jobs without a time limit, run now.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from oneplus_contracts import Allocation, JobSpec
from oneplus_contracts.features import parse_constraint
from oneplus_placement.bandwidth import BOARD_PAR, board_shortfall, slowdown
from oneplus_placement.hosts import HostFilter
from oneplus_placement.snapshot import Holdings

from .model import RunningJob

# The middle of the simulator's range for one-node jobs (oneplus_sim.trace: f ~ U(0.1, 0.3)).
COMM_FRACTION_ONE_NODE = 0.2


@dataclass(frozen=True, slots=True)
class BoardClaim:
    """A job that chose to wait for `node`: from `start_ts` it expects `gpus` GPUs there until `end_ts`."""

    node: str
    start_ts: float
    end_ts: float
    gpus: int


@dataclass(frozen=True, slots=True)
class BoardChoice:
    wait: bool
    now_s: float  # expected seconds to finish if placed now, on the weaker board
    strong_s: float  # expected seconds to finish on a strong board, waiting for it first
    strong_node: str
    start_ts: float  # when the strong board is expected to have room for it
    gpus: int
    ring_gbps: float
    best_gbps: float

    def message(self, node: str) -> str:
        if self.wait:
            return (
                f"waits for a faster board: expected to finish in {self.strong_s / 3600:.1f} h on {self.strong_node} "
                f"({self.best_gbps:g} GB/s ring) against {self.now_s / 3600:.1f} h now on {node} "
                f"({self.ring_gbps:g} GB/s ring)"
            )
        return (
            f"runs now on a slower board ({node}, {self.ring_gbps:g} GB/s ring): {self.now_s / 3600:.1f} h expected "
            f"against {self.strong_s / 3600:.1f} h waiting for {self.strong_node}"
        )


def weigh_boards(
    now: float,
    spec: JobSpec,
    alloc: Allocation,
    state: Holdings,
    running: Sequence[RunningJob],
    default_time_limit_s: float | None = None,
    comm_fraction: float = COMM_FRACTION_ONE_NODE,
    claims: Sequence[BoardClaim] = (),
) -> BoardChoice | None:
    """The choice for a one-node gang whose allocation is on a weaker board; None when there is nothing to weigh
    (the board is at par, the gang spans nodes or needs no ring, it has no time limit, or no strong board would
    ever hold it). `claims`: jobs ahead of it in this cycle that chose to wait for a strong board; their GPUs
    there count as taken from when they start, so two jobs do not both wait for the same GPUs."""
    ring = float(alloc.score.get("ring_gbps", alloc.ring_gbps or 0.0))
    best = float(alloc.score.get("ideal_ring_gbps", 0.0))
    if best <= 0 or ring >= BOARD_PAR * best or spec.ranks != 1 or len(alloc.ranks) != 1:
        return None
    limit = spec.time_limit_s if spec.time_limit_s is not None else default_time_limit_s
    if limit is None or ring <= 0:
        return None
    need = len(alloc.ranks[0].gpus)
    layout = state.layout
    features = parse_constraint(spec.constraint) if spec.constraint else None
    hosts = HostFilter.of(spec)
    ends: dict[str, list[tuple[float, int]]] = {}
    for r in running:
        end = r.end_ts(default_time_limit_s)
        for rank in r.allocation.ranks:
            ends.setdefault(rank.node, []).append((math.inf if end is None else end, len(rank.gpus)))
    claimed: dict[str, list[BoardClaim]] = {}
    for c in claims:
        claimed.setdefault(c.node, []).append(c)
    start, where = math.inf, ""
    for slot in layout.slots:
        i = slot.index
        if slot.shape.n < need or not state.schedulable[i] or board_shortfall(layout, slot.shape, need) > 0:
            continue
        if not slot.matches_model(spec.resources.gpu_models) or not slot.matches_features(features):
            continue  # a board the job could never run on is no reason to wait
        if hosts is not None and not hosts.allows(slot.name):
            continue
        at = _room_from(now, state.free_count[i], need, ends.get(slot.name, []), claimed.get(slot.name, []))
        if at < start:
            start, where = at, slot.name
    if not where or math.isinf(start):
        return None
    now_s = limit * slowdown(comm_fraction, best, ring)
    strong_s = (start - now) + limit
    return BoardChoice(strong_s < now_s, now_s, strong_s, where, start, need, ring, best)


def _room_from(now: float, free: int, need: int, ends: list[tuple[float, int]], claims: list[BoardClaim]) -> float:
    """The first time a node has `need` GPUs free: its holders leave by their ends, waiting jobs' claims come in
    at their starts and leave at their ends (inf: never)."""
    changes = [(end, gpus) for end, gpus in ends]
    for c in claims:
        changes += [(c.start_ts, -c.gpus), (c.end_ts, c.gpus)]
    at = now
    for when, delta in sorted(changes, key=lambda t: (t[0], -t[1])):
        if free >= need and when > at:
            return at
        if math.isinf(when):
            break
        free += delta
        at = max(at, when)
    return at if free >= need else math.inf
