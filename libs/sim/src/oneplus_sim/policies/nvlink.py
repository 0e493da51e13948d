"""Baselines extended for multi-node NVLink domains (GB200 NVL72 racks) the way each system does it.

- `slurm-block`: select/cons_tres + topology/block. BlockSizes = the rack (one NVLink domain) and its power-of-two
  aggregates of consecutive racks; a job goes to the lowest block level with room, the block with the least room that
  fits (best fit); `--segment` = the TP group in ranks, each segment inside one base block; EASY backfill as
  slurm-tree.
- `kueue-tas-slices`: Kueue multi-layer TAS. `podset-preferred-topology: rack` (rack = NVLink domain) and
  `podset-slice-required-topology: rack` with `podset-slice-size` = the TP group in pods; BestFit at each level from
  the preferred one down, up to one leaf and then the cluster when no rack holds the job; BestEffortFIFO.

kube default is `k8s-default` (baselines.py): it sees GPUs as counts, so it spreads ranks over racks. None preempts.
"""

from __future__ import annotations

from ..cluster import SimCluster
from ..comm import Slot
from ..engine import SimContext
from ..state import Placement
from ..trace import SimJob
from .baselines import SlurmTree, _best_fit_groups, _priority_key, _take_ranks
from .common import FreeView, best_effort_schedule, lowest_gpus, most_linked_gpus


class Racks:
    """Each node's rack (its multi-node NVLink domain; a node outside any is a rack of its own) and leaf."""

    def __init__(self, cluster: SimCluster) -> None:
        level = cluster.layout.level("nvlink")
        n = len(cluster.nodes)
        keys: list[tuple[str, int]] = []
        for i in range(n):
            d = level.of_node[i] if level is not None else -1
            multi = level is not None and len(level.members[d]) > 1
            keys.append(("nvl", d) if multi else ("node", i))
        index: dict[tuple[str, int], int] = {}
        self.of_node: list[int] = [index.setdefault(k, len(index)) for k in keys]
        self.members: list[list[int]] = [[] for _ in index]
        for i, r in enumerate(self.of_node):
            self.members[r].append(i)
        self.leaf_of: list[int] = [cluster.nodes[m[0]].leaf for m in self.members]


def segment_ranks(job: SimJob) -> int:
    """Ranks per TP group when a group spans ranks (Slurm's --segment, Kueue's podset-slice-size), else 1."""
    per = max(job.gpus_per_rank, 1)
    if job.tp_group > per and job.tp_group % per == 0 and job.ranks % (job.tp_group // per) == 0:
        return job.tp_group // per
    return 1


class SlurmBlock(SlurmTree):
    """topology/block with BlockSizes = rack, 2 racks, 4 racks, ... (consecutive base blocks); EASY backfill."""

    name = "slurm-block"

    def __init__(self) -> None:
        self._racks: Racks | None = None

    def _blocks(self, cluster: SimCluster) -> Racks:
        if self._racks is None:
            self._racks = Racks(cluster)
        return self._racks

    def place(self, view: FreeView, job: SimJob, exclude: frozenset[int] = frozenset()) -> Placement | None:
        c = view.cluster
        racks = self._blocks(c)
        seg = segment_ranks(job)
        need = job.ranks // seg
        node_cap = {n: view.capacity(n, job) for n in range(len(c.nodes)) if n not in exclude}
        node_cap = {n: k for n, k in node_cap.items() if k}
        # Segments each base block can hold whole: a segment never straddles two base blocks.
        base = [sum(node_cap.get(n, 0) for n in m) // seg for m in racks.members]
        if sum(base) < need:
            return None
        n_base = len(base)
        chosen: list[int] | None = None
        size = 1
        while chosen is None and size <= max(n_base, 1):
            # The blocks of this level: aligned runs of `size` base blocks; best fit among those with room.
            fitting = [(sum(base[b : b + size]), b) for b in range(0, n_base, size) if sum(base[b : b + size]) >= need]
            if fitting:
                _, start = min(fitting)
                chosen = list(range(start, min(start + size, n_base)))
            size *= 2
        if chosen is None:  # only the whole cluster holds it
            chosen = list(range(n_base))
        # Inside the block: one base block if one holds the job (the tightest), else the fullest first.
        one = [b for b in chosen if base[b] >= need]
        order = [min(one, key=lambda b: (base[b], b))] if one else sorted(chosen, key=lambda b: (-base[b], b))
        slots: list[Slot] = []
        for b in order:
            take = min(need - len(slots) // seg, base[b]) * seg
            if take <= 0:
                break
            nodes = sorted(
                (n for n in racks.members[b] if n in node_cap), key=lambda n: (view.free_count(n), n)
            )  # best fit: the fullest nodes first
            got = _take_ranks(view, job, nodes, take, most_linked_gpus)
            if len(got) != take:
                return None
            slots += got
        if len(slots) != job.ranks:
            return None
        return Placement(tuple(slots), job.gpu_milli)


class KueueTasSlices:
    """Kueue TAS, multi-layer: preferred rack, TP slices required inside a rack, BestFit per level; BestEffortFIFO."""

    name = "kueue-tas-slices"

    def __init__(self) -> None:
        self._racks: Racks | None = None

    def queue_key(self, job: SimJob) -> tuple[float, ...]:
        return _priority_key(job)

    def place(self, view: FreeView, job: SimJob) -> Placement | None:
        c = view.cluster
        if self._racks is None:
            self._racks = Racks(c)
        racks = self._racks
        s = segment_ranks(job)
        need = job.ranks // s
        node_cap = {n: view.capacity(n, job) for n in range(len(c.nodes))}
        rack_slices = {r: sum(node_cap[n] for n in m) // s for r, m in enumerate(racks.members)}
        rack_slices = {r: k for r, k in rack_slices.items() if k}
        if sum(rack_slices.values()) < need:
            return None
        # The preferred level first (rack); then one leaf; then the whole cluster, leaves by BestFit.
        one_rack = _best_fit_groups(rack_slices, need)
        if one_rack is not None and len(one_rack) == 1:
            plan: list[list[int]] = [one_rack]
        else:
            leaf_slices: dict[int, int] = {}
            for r, k in rack_slices.items():
                leaf_slices[racks.leaf_of[r]] = leaf_slices.get(racks.leaf_of[r], 0) + k
            leaves = _best_fit_groups(leaf_slices, need) or []
            plan = []
            left = need
            for leaf in leaves:
                caps = {r: k for r, k in rack_slices.items() if racks.leaf_of[r] == leaf}
                take = min(left, sum(caps.values()))
                plan.append(_best_fit_groups(caps, take) or [])
                left -= take
        slots: list[Slot] = []
        left = need
        for rack_list in plan:
            for r in rack_list:
                take = min(left, rack_slices[r]) * s
                if take <= 0:
                    break
                caps = {n: node_cap[n] for n in racks.members[r] if node_cap[n]}
                nodes = _best_fit_groups(caps, take) or []
                got = _take_ranks(view, job, nodes, take, lowest_gpus)
                if len(got) != take:
                    return None
                slots += got
                left -= take // s
        if len(slots) != job.ranks:
            return None
        return Placement(tuple(slots), job.gpu_milli)

    def schedule(self, ctx: SimContext) -> None:
        best_effort_schedule(ctx, self.place)
