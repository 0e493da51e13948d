"""The four baseline policies of BENCHMARKS.md §1, each as its definition there says.

| name | models |
|---|---|
| fifo-firstfit | strict FIFO, first fit, no topology |
| k8s-default | GPUs are counts, LeastAllocated spread, lowest free GPU indexes, all-or-nothing gang |
| kueue-tas | BestFit over topology levels (leaf, node), BestEffortFIFO queue, lowest GPU indexes |
| slurm-tree | fewest leaves, best-fit nodes, GPUs by NVLink count, EASY backfill on time limits |

None of them preempts.
"""

from __future__ import annotations

import random
from collections.abc import Iterable

from ..comm import Slot
from ..engine import SimContext
from ..state import Placement
from ..trace import SimJob
from .common import (
    FreeView,
    GpuPicker,
    SkipMemo,
    best_effort_schedule,
    lowest_gpus,
    most_linked_gpus,
    nothing_fits,
)


def _priority_key(job: SimJob) -> tuple[float, ...]:
    return (-job.priority, job.order)


class FifoFirstFit:
    """Strict FIFO in submit order; the head waits until it fits and blocks everything behind it."""

    name = "fifo-firstfit"

    def queue_key(self, job: SimJob) -> tuple[float, ...]:
        return (job.order,)

    def place(self, view: FreeView, job: SimJob) -> Placement | None:
        slots = _take_ranks(view, job, range(len(view.cluster.nodes)), job.ranks, lowest_gpus)
        return Placement(tuple(slots), job.gpu_milli) if len(slots) == job.ranks else None

    def schedule(self, ctx: SimContext) -> None:
        while ctx.pending:
            job = ctx.pending[0]
            p = None if nothing_fits(ctx.occ, job) else self.place(FreeView(ctx.occ), job)
            if p is None:
                return
            ctx.start(job, p)


class K8sDefault:
    """kube-scheduler with a gang plugin: priority queue, LeastAllocated node score, random tie-break."""

    name = "k8s-default"

    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(seed)

    def queue_key(self, job: SimJob) -> tuple[float, ...]:
        return _priority_key(job)

    def _score(self, view: FreeView, node: int, job: SimJob) -> float:
        """LeastAllocated: the mean over requested resources of the share left free after this rank."""
        occ = view.occ
        kind = view.cluster.nodes[node].kind
        asked = job.gpu_milli or 1000 * job.gpus_per_rank
        terms = [(sum(view.left(node)) - asked) / (1000 * kind.n_gpus)] if kind.n_gpus and asked else []
        if job.cpus:
            terms.append((occ.cpu_left[node] - job.cpus) / kind.cpus)
        if job.memory_mb:
            terms.append((occ.mem_left[node] - job.memory_mb) / kind.memory_mb)
        return sum(terms) / len(terms) if terms else 0.0

    def place(self, view: FreeView, job: SimJob) -> Placement | None:
        slots: list[tuple[int, tuple[int, ...]]] = []
        n_nodes = len(view.cluster.nodes)
        for _ in range(job.ranks):
            best: list[int] = []
            best_score = -1.0
            for node in range(n_nodes):
                if not view.fits(node, job):
                    continue
                s = self._score(view, node, job)
                if s > best_score + 1e-12:
                    best, best_score = [node], s
                elif abs(s - best_score) <= 1e-12:
                    best.append(node)
            if not best:
                return None
            node = best[self.rng.randrange(len(best))] if len(best) > 1 else best[0]
            gpus = lowest_gpus(view, node, job)
            view.take(node, gpus, job)
            slots.append((node, gpus))
        return Placement(tuple(slots), job.gpu_milli)

    def schedule(self, ctx: SimContext) -> None:
        best_effort_schedule(ctx, self.place)


def _best_fit_groups(cap: dict[int, int], need: int) -> list[int] | None:
    """Kueue's BestFit over one level: largest domains first, the last one the smallest that still fits."""
    if sum(cap.values()) < need:
        return None
    single = [d for d, c in cap.items() if c >= need]
    if single:
        return [min(single, key=lambda d: (cap[d], d))]
    order = sorted(cap, key=lambda d: (-cap[d], d))
    chosen: list[int] = []
    left = need
    for i, d in enumerate(order):
        rest = [e for e in order[i:] if cap[e] >= left]
        if rest:
            chosen.append(min(rest, key=lambda e: (cap[e], e)))
            return chosen
        chosen.append(d)
        left -= cap[d]
    return None


def _take_ranks(view: FreeView, job: SimJob, nodes: Iterable[int], need: int, pick: GpuPicker) -> list[Slot]:
    slots: list[Slot] = []
    for node in nodes:
        while len(slots) < need and view.fits(node, job):
            gpus = pick(view, node, job)
            view.take(node, gpus, job)
            slots.append((node, gpus))
    return slots


class KueueTas:
    """Kueue TAS: BestFit leaf then BestFit nodes; BestEffortFIFO (a head that does not fit is set aside)."""

    name = "kueue-tas"

    def queue_key(self, job: SimJob) -> tuple[float, ...]:
        return _priority_key(job)

    def place(self, view: FreeView, job: SimJob) -> Placement | None:
        c = view.cluster
        node_cap = {n: view.capacity(n, job) for n in range(len(c.nodes))}
        leaf_cap: dict[int, int] = {}
        for n, k in node_cap.items():
            if k:
                leaf_cap[c.nodes[n].leaf] = leaf_cap.get(c.nodes[n].leaf, 0) + k
        leaves = _best_fit_groups(leaf_cap, job.ranks)
        if leaves is None:
            return None
        slots: list[tuple[int, tuple[int, ...]]] = []
        for leaf in leaves:
            need = job.ranks - len(slots)
            caps = {n: node_cap[n] for n in c.leaves[leaf] if node_cap[n]}
            take = min(need, sum(caps.values()))
            nodes = _best_fit_groups(caps, take) or []
            slots += _take_ranks(view, job, nodes, take, lowest_gpus)
        if len(slots) != job.ranks:
            return None
        return Placement(tuple(slots), job.gpu_milli)

    def schedule(self, ctx: SimContext) -> None:
        best_effort_schedule(ctx, self.place)


class SlurmTree:
    """select/cons_tres + topology/tree + EASY backfill (one reservation, for the first job that cannot start)."""

    name = "slurm-tree"
    bf_max_job_test = 500  # Slurm's default SchedulerParameters=bf_max_job_test

    def queue_key(self, job: SimJob) -> tuple[float, ...]:
        return _priority_key(job)

    def place(self, view: FreeView, job: SimJob, exclude: frozenset[int] = frozenset()) -> Placement | None:
        c = view.cluster
        node_cap = {n: view.capacity(n, job) for n in range(len(c.nodes)) if n not in exclude}
        node_cap = {n: k for n, k in node_cap.items() if k}
        leaf_cap: dict[int, int] = {}
        for n, k in node_cap.items():
            leaf_cap[c.nodes[n].leaf] = leaf_cap.get(c.nodes[n].leaf, 0) + k
        if sum(leaf_cap.values()) < job.ranks:
            return None
        fitting = [leaf for leaf, k in leaf_cap.items() if k >= job.ranks]
        if fitting:
            leaves = [min(fitting, key=lambda leaf: (leaf_cap[leaf], leaf))]
        else:  # fewest leaves: the biggest first
            leaves, total = [], 0
            for leaf in sorted(leaf_cap, key=lambda lf: (-leaf_cap[lf], lf)):
                leaves.append(leaf)
                total += leaf_cap[leaf]
                if total >= job.ranks:
                    break
        nodes = sorted(
            (n for n in node_cap if c.nodes[n].leaf in leaves),
            key=lambda n: (leaves.index(c.nodes[n].leaf), view.free_count(n), n),
        )
        slots = _take_ranks(view, job, nodes, job.ranks, most_linked_gpus)
        if len(slots) != job.ranks:
            return None
        return Placement(tuple(slots), job.gpu_milli)

    def _reservation(self, ctx: SimContext, job: SimJob) -> tuple[float, frozenset[int]]:
        """When and where the blocked job will start if running jobs end at their time limits."""
        view = FreeView(ctx.occ)
        ends = sorted(ctx.running.values(), key=lambda r: max(r.limit_end_s(), ctx.now))
        for run in ends:
            for node, gpus in run.placement.slots:
                left = list(view.left(node))
                for g in gpus:
                    left[g] += run.placement.gpu_milli or 1000
                view._left[node] = left
                view._cpu[node] = view._cpu.get(node, ctx.occ.cpu_left[node]) + run.job.cpus
                view._mem[node] = view._mem.get(node, ctx.occ.mem_left[node]) + run.job.memory_mb
            probe = FreeView(ctx.occ)
            probe._left, probe._cpu, probe._mem = dict(view._left), dict(view._cpu), dict(view._mem)
            p = self.place(probe, job)
            if p is not None:
                return max(run.limit_end_s(), ctx.now), frozenset(p.nodes)
        return float("inf"), frozenset()  # never fits: it reserves nothing

    def schedule(self, ctx: SimContext) -> None:
        memo = SkipMemo()
        reservation: tuple[float, frozenset[int]] | None = None
        tested = 0
        for job in list(ctx.pending):
            if reservation is not None:
                tested += 1
                if tested > self.bf_max_job_test:
                    return
            if nothing_fits(ctx.occ, job) or memo.skip(job):
                if reservation is None:
                    reservation = self._reservation(ctx, job)
                continue
            if reservation is None:
                p = self.place(FreeView(ctx.occ), job)
                if p is None:
                    memo.add(job)
                    reservation = self._reservation(ctx, job)
                    continue
            else:
                shadow, reserved = reservation
                p = self.place(FreeView(ctx.occ), job, exclude=reserved)
                if p is None and ctx.now + job.limit_s - job.done_s <= shadow:  # by its limit, not its run time
                    p = self.place(FreeView(ctx.occ), job)
                    if p is None:
                        memo.add(job)
            if p is not None:
                ctx.start(job, p)
