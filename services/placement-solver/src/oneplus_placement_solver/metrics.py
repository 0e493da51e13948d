"""The solver's Prometheus metrics (in its service's registry; docs/observability.md lists them).

Per-cycle work stays small: the pending gauge is one pass over the cycle's pending jobs, the histograms are one
observation each, and the per-node, per-leaf and per-NVLink-domain GPU gauges are recomputed at most once a second.

"Fragmented" GPUs are free GPUs inside a node (or an NVLink domain of a node) that some gang already partly
holds: a gang that needs the whole node (or the whole NVLink domain) cannot use them. Leaves add up their nodes.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from oneplus_contracts import Allocation, JobRecord
from oneplus_placement.layout import Layout
from oneplus_placement.shape import popcount
from oneplus_placement.snapshot import Holdings
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

if TYPE_CHECKING:
    from oneplus_queueing.model import CycleDecision

LEVELS = ("node", "leaf", "spine", "cluster")
GPU_STATES = ("allocated", "free", "fragmented", "unavailable")
CAPACITY_EVERY_S = 1.0
WAIT_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400)
CYCLE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
_GPU_STATE_HELP = (
    "allocated: held by gangs (whole or shared); free: offered to new gangs; fragmented: the free GPUs of a "
    "{unit} that a gang already partly holds (a gang needing the whole {unit} cannot use them; also counted in "
    "free); unavailable: unhealthy, on a cordoned, draining or lost node, or still reported busy by the node"
)


PRIORITY_BANDS = ((100, "1-99"), (1000, "100-999"), (10000, "1000-9999"))  # (upper bound, band) above 0


def priority_band(priority: int) -> str:
    """The `priority` label of the pending gauge: a band, so a job's free-form priority cannot make a new series."""
    if priority <= 0:
        return "0" if priority == 0 else "<0"
    return next((band for upper, band in PRIORITY_BANDS if priority < upper), "10000+")


class SolverMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        # Counted where victims are recorded preempting: by the job owner (the preemption service's names, kept).
        self.preemptions = Counter(
            "oneplus_preemptions",
            "Gangs asked to stand aside (checkpoint, then stop) for a higher-priority gang, by the victim's queue",
            ["queue"],
            registry=registry,
        )
        self.lost_gpu_hours = Counter(
            "oneplus_preemption_lost_gpu_hours",
            "GPU-hours of work since their last checkpoint that preempted gangs lose, by the preemptor's queue",
            ["queue"],
            registry=registry,
        )
        self.escalations = Counter(
            "oneplus_preemption_escalations",
            "Victims killed because they neither checkpointed nor stopped within their grace period",
            registry=registry,
        )
        self.pending = Gauge(
            "oneplus_pending_jobs",
            "Jobs waiting to be placed after the last scheduling cycle, by queue, priority band (0, 1-99, 100-999, "
            "1000-9999, 10000+, <0) and the cycle's reason code (Priority, Resources, Topology, QuotaExceeded, "
            "Preempting, InvalidQueue; None when it gave none)",
            ["queue", "priority", "reason"],
            registry=registry,
        )
        self.wait = Histogram(
            "oneplus_job_submit_to_placed_seconds",
            "Seconds from a job's submission to its first placement (requeued attempts are not observed)",
            ["queue"],
            buckets=WAIT_BUCKETS,
            registry=registry,
        )
        self.cycle = Histogram(
            "oneplus_scheduling_cycle_seconds",
            "Seconds one scheduling cycle takes: decision, reservations, the placed records and launch commands",
            buckets=CYCLE_BUCKETS,
            registry=registry,
        )
        self.placed = Counter(
            "oneplus_gangs_placed",
            "Gangs placed, by the domain level that holds them (node, leaf, spine, cluster) and whether that is "
            "the tightest level that could hold such a gang on the empty cluster",
            ["domain", "tightest"],
            registry=registry,
        )
        self.conflicts = Counter(
            "oneplus_reservation_conflicts",
            "Reservation commits the store refused: 'taken' (another replica holds part of it: decided again next "
            "cycle), 'store_reset' (the store lost its state: placing stops until it is rebuilt) or 'not_replicated' "
            "(no Redis replica acknowledged it in time, REDIS_WAIT_REPLICAS: released, placing resumes next cycle)",
            ["kind"],
            registry=registry,
        )
        self.leading = Gauge(
            "oneplus_solver_leading",
            "1 while this solver replica holds the owner lease (it folds facts and writes job records), else 0",
            registry=registry,
        )
        self.replicas = Gauge(
            "oneplus_solver_replicas",
            "Solver replicas this one counts alive (each places the pending jobs it wins by rendezvous hashing)",
            registry=registry,
        )
        self.node_gpus = Gauge(
            "oneplus_node_gpus",
            "GPUs of a node by state. " + _GPU_STATE_HELP.format(unit="node"),
            ["node", "leaf", "state"],
            registry=registry,
        )
        self.leaf_gpus = Gauge(
            "oneplus_leaf_gpus",
            "GPUs of a leaf switch's nodes by state (the sum of its nodes' oneplus_node_gpus)",
            ["leaf", "state"],
            registry=registry,
        )
        self.domain_gpus = Gauge(
            "oneplus_nvlink_domain_gpus",
            "GPUs of a node's NVLink domain (GPUs joined by NVLink; `domain` is <node>/nvl<i>) by state. "
            + _GPU_STATE_HELP.format(unit="NVLink domain"),
            ["node", "domain", "state"],
            registry=registry,
        )
        self._pending_keys: set[tuple[str, str, str]] = set()
        # What each capacity gauge was last set to: a second's update sets only the series that changed (512 nodes
        # are some 4,000 series, and setting them all stalled the solver's loop ~10 ms every second).
        self._capacity_values: dict[str, dict[tuple[str, ...], int]] = {"node": {}, "leaf": {}, "domain": {}}
        self._capacity_at = 0.0
        # What the gauges were last computed from: the layout, and each node's whole, shared and free GPU masks.
        self._capacity_layout: Layout | None = None
        self._node_masks: list[tuple[int, int, int]] = []  # per node: whole, shared and free GPUs, as last counted
        self._node_counts: list[tuple[int, int, int, int]] = []  # per node: its counts by GPU state
        self._leaf_counts: dict[tuple[str, ...], int] = {}
        self._tightest: dict[tuple[int, int, int], str] = {}
        self._tightest_layout: Layout | None = None

    # -- per cycle -------------------------------------------------------------------------------------------------
    def pending_jobs(self, pending: Iterable[JobRecord], decision: CycleDecision | None) -> None:
        """Set the pending gauge from the jobs still pending after the cycle (those it placed are not)."""
        placed = decision.placements if decision is not None else {}
        reasons = decision.reasons if decision is not None else {}
        counts: dict[tuple[str, str, str], int] = {}
        for rec in pending:
            if rec.job_id in placed:
                continue
            why = reasons.get(rec.job_id)
            key: tuple[str, str, str] = (rec.spec.queue, priority_band(rec.spec.priority), why.code if why else "None")
            counts[key] = counts.get(key, 0) + 1
        for key in self._pending_keys - counts.keys():
            self.pending.remove(*key)
        for key, n in counts.items():
            self.pending.labels(*key).set(n)
        self._pending_keys = set(counts)

    def placed_gang(self, rec: JobRecord, alloc: Allocation, layout: Layout, now: float) -> None:
        if rec.attempt == 0:
            self.wait.labels(rec.spec.queue).observe(max(0.0, now - rec.submitted_ts))
        res = rec.spec.resources
        tightest = self.tightest_level(layout, rec.spec.ranks, max(res.whole_gpus, 1))
        tight = LEVELS.index(alloc.domain) <= LEVELS.index(tightest)
        self.placed.labels(alloc.domain, "true" if tight else "false").inc()

    def tightest_level(self, layout: Layout, ranks: int, gpus_per_rank: int) -> str:
        """The tightest level (node, leaf, spine, cluster) with one domain that could hold the gang when empty."""
        if layout is not self._tightest_layout:
            self._tightest = {}
            self._tightest_layout = layout
        key = (id(layout), ranks, gpus_per_rank)
        got = self._tightest.get(key)
        if got is None:
            got = _tightest_level(layout, ranks, gpus_per_rank)
            self._tightest[key] = got
        return got

    # -- at most once a second -------------------------------------------------------------------------------------
    def capacity(self, state: Holdings, now: float | None = None, *, force: bool = False) -> bool:
        """Bring the per-node, per-leaf and per-NVLink-domain gauges up to date if a second has passed and the holds
        or free GPUs changed since; True if any node changed. Only the nodes whose masks changed are recomputed (a
        walk over every node each second was a sixth of the solver's CPU under load at 4,096 nodes, and idle half of
        it); a new layout, or `force`, recomputes all."""
        now = time.monotonic() if now is None else now
        if not force and now - self._capacity_at < CAPACITY_EVERY_S:
            return False
        self._capacity_at = now
        layout = state.layout
        masks = list(zip(state.whole, state.share_mask, state.free, strict=True))
        if force or layout is not self._capacity_layout:
            nodes: dict[tuple[str, ...], int] = {}
            domains: dict[tuple[str, ...], int] = {}
            self._leaf_counts = {}
            self._node_counts = []
            for i, m in enumerate(masks):
                counts, node_series, domain_series = _node_series(layout, i, *m)
                nodes.update(node_series)
                domains.update(domain_series)
                self._node_counts.append(counts)
                for st, n in zip(GPU_STATES, counts, strict=True):
                    key = (layout.leaf_names[layout.slots[i].leaf], st)
                    self._leaf_counts[key] = self._leaf_counts.get(key, 0) + n
            self._capacity_layout, self._node_masks = layout, masks
            self._publish("node", self.node_gpus, nodes)
            self._publish("leaf", self.leaf_gpus, self._leaf_counts)
            self._publish("domain", self.domain_gpus, domains)
            return True
        changed = [i for i, (a, b) in enumerate(zip(masks, self._node_masks, strict=True)) if a != b]
        if not changed:
            return False
        for i in changed:
            counts, node_series, domain_series = _node_series(layout, i, *masks[i])
            self._set("node", self.node_gpus, node_series)
            self._set("domain", self.domain_gpus, domain_series)
            leaf = layout.leaf_names[layout.slots[i].leaf]
            for st, before, after in zip(GPU_STATES, self._node_counts[i], counts, strict=True):
                self._leaf_counts[(leaf, st)] += after - before
            self._node_counts[i] = counts
        self._node_masks = masks
        self._publish("leaf", self.leaf_gpus, self._leaf_counts)
        return True

    def _set(self, kind: str, gauge: Gauge, series: Mapping[tuple[str, ...], int]) -> None:
        """Set the series of one node that changed (its node or domain gauges)."""
        values = self._capacity_values[kind]
        for key, n in series.items():
            if values.get(key) != n:
                gauge.labels(*key).set(n)
                values[key] = n

    def _publish(self, kind: str, gauge: Gauge, values: Mapping[tuple[str, ...], int]) -> None:
        before = self._capacity_values[kind]
        for key in before.keys() - values.keys():
            gauge.remove(*key)
        for key, n in values.items():
            if before.get(key) != n:
                gauge.labels(*key).set(n)
        self._capacity_values[kind] = dict(values)


def _node_series(
    layout: Layout, i: int, whole: int, share: int, free: int
) -> tuple[tuple[int, int, int, int], dict[tuple[str, ...], int], dict[tuple[str, ...], int]]:
    """Node `i`'s counts by GPU state, and the series of its node gauge and its NVLink domains' gauge."""
    slot = layout.slots[i]
    full = slot.shape.full
    held = (whole | share) & full
    unavailable = full & ~held & ~free
    leaf = layout.leaf_names[slot.leaf]
    counts = _counts(held, free, unavailable)
    node: dict[tuple[str, ...], int] = {(slot.name, leaf, st): n for st, n in zip(GPU_STATES, counts, strict=True)}
    domains: dict[tuple[str, ...], int] = {}
    d = 0
    for mask in slot.shape.domains:
        if popcount(mask) < 2:
            continue  # a GPU without NVLink peers is no domain
        dc = _counts(held & mask, free & mask, unavailable & mask)
        for st, n in zip(GPU_STATES, dc, strict=True):
            domains[(slot.name, f"{slot.name}/nvl{d}", st)] = n
        d += 1
    return counts, node, domains


def _counts(held: int, free: int, unavailable: int) -> tuple[int, int, int, int]:
    """(allocated, free, fragmented, unavailable) of one node or domain, from its GPU masks."""
    f = popcount(free)
    return popcount(held), f, f if held else 0, popcount(unavailable)


def _tightest_level(layout: Layout, ranks: int, gpus_per_rank: int) -> str:
    per_node = [s.shape.n // gpus_per_rank for s in layout.slots]  # ranks each node could take when empty
    if any(n >= ranks for n in per_node):
        return "node"
    leaf = [sum(per_node[i] for i in nodes) for nodes in layout.leaf_nodes]
    if any(n >= ranks for n in leaf):
        return "leaf"
    if any(sum(leaf[x] for x in leaves) >= ranks for leaves in layout.spine_leaves):
        return "spine"
    return "cluster"
