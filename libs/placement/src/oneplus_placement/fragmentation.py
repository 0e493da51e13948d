"""How broken up the free GPUs are, per tier: the largest gang each tier can still take, and what is stranded."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .snapshot import Holdings

_MIN_RANK_CPUS = 1.0
_MIN_RANK_MEMORY_MB = 1024


@dataclass(frozen=True)
class TierFragmentation:
    """`largest_gang_gpus`: whole GPUs free in the best domain of the tier (usable ones: CPU and memory left);
    `whole_nodes_free`: the most idle nodes any one domain of the tier has."""

    tier: str
    largest_gang_gpus: int
    best_domain: str | None
    whole_nodes_free: int


@dataclass(frozen=True)
class FragmentationReport:
    free_gpus: int
    usable_gpus: int
    stranded_gpus: int
    frag_pct: float
    gang_gpus: int
    tiers: dict[str, TierFragmentation]

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def fragmentation(snapshot: Holdings, gang_gpus: int = 8) -> FragmentationReport:
    """Per tier (node, leaf, spine, cluster): the largest gang that still fits and the idle nodes left.

    `stranded_gpus` are free GPUs on nodes whose CPU or memory is used up (no rank can start there);
    `frag_pct` is the share of free GPUs a gang of `gang_gpus` GPUs (one rank per node) could not use: those on
    nodes with fewer than min(gang_gpus, node size) GPUs free.
    """
    if gang_gpus < 1:
        raise ValueError(f"gang_gpus must be at least 1, got {gang_gpus}")
    layout = snapshot.layout
    fc = snapshot.free_count
    stranded = 0
    unusable = 0
    per_node = [0] * len(fc)
    idle = [False] * len(fc)
    for slot in layout.slots:
        i = slot.index
        f = fc[i]
        if not f:
            continue
        if snapshot.cpu_free(i) < _MIN_RANK_CPUS or snapshot.mem_free(i) < _MIN_RANK_MEMORY_MB:
            stranded += f
            continue
        per_node[i] = f
        idle[i] = snapshot.idle(i)
        if f < min(gang_gpus, slot.shape.n):
            unusable += f
    free = sum(fc)
    tiers: dict[str, TierFragmentation] = {}
    best_node = max(range(len(fc)), key=lambda i: (per_node[i], -i))
    tiers["node"] = TierFragmentation(
        "node", per_node[best_node], layout.slots[best_node].name if per_node[best_node] else None, int(any(idle))
    )
    leaf_sum = [sum(per_node[i] for i in nodes) for nodes in layout.leaf_nodes]
    leaf_idle = [sum(idle[i] for i in nodes) for nodes in layout.leaf_nodes]
    best_leaf = max(range(len(leaf_sum)), key=lambda g: (leaf_sum[g], -g))
    tiers["leaf"] = TierFragmentation(
        "leaf", leaf_sum[best_leaf], layout.leaf_names[best_leaf], max(leaf_idle, default=0)
    )
    spine_sum = [sum(leaf_sum[x] for x in leaves) for leaves in layout.spine_leaves]
    spine_idle = [sum(leaf_idle[x] for x in leaves) for leaves in layout.spine_leaves]
    best_spine = max(range(len(spine_sum)), key=lambda g: (spine_sum[g], -g))
    tiers["spine"] = TierFragmentation(
        "spine", spine_sum[best_spine], layout.spine_names[best_spine], max(spine_idle, default=0)
    )
    tiers["cluster"] = TierFragmentation("cluster", sum(per_node), layout.name, sum(idle))
    usable = free - stranded
    return FragmentationReport(
        free_gpus=free,
        usable_gpus=usable,
        stranded_gpus=stranded,
        frag_pct=round(100.0 * (unusable + stranded) / free, 2) if free else 0.0,
        gang_gpus=gang_gpus,
        tiers=tiers,
    )
