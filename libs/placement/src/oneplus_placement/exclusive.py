"""An exclusive gang (sbatch --exclusive) holds the whole of each of its nodes, as Slurm allocates it.

sbatch(1): the allocation cannot share nodes with other running jobs, and the job is allocated all CPUs and GRES of
its nodes but only the memory it asked for. Holding them in the allocation itself makes every view that applies
allocations (the live reservation, the simulator, the dashboard) see the node as taken.
"""

from __future__ import annotations

from oneplus_contracts import RankPlacement

from .shape import bits
from .snapshot import Holdings


def hold_whole_nodes(snap: Holdings, ranks: list[RankPlacement]) -> list[RankPlacement]:
    """Each node's free GPUs the ranks did not take, dealt round-robin to its whole-GPU ranks, and all its free CPUs
    split evenly among its ranks; a rank's own GPUs stay first, so its first device is unchanged."""
    by_node: dict[str, list[int]] = {}
    for n, r in enumerate(ranks):
        by_node.setdefault(r.node, []).append(n)
    out = list(ranks)
    layout = snap.layout
    for node, members in by_node.items():
        i = layout.index(node)
        shape = layout.slots[i].shape
        cpus = snap.cpu_free(i) / len(members)
        whole = [n for n in members if not ranks[n].gpu_milli]
        taken = shape.mask_of([g for n in members for g in ranks[n].gpus])
        extra: dict[int, list[int]] = {n: [] for n in whole}
        if whole:
            for k, p in enumerate(bits(snap.free[i] & ~taken)):
                extra[whole[k % len(whole)]].append(shape.indexes[p])
        for n in members:
            r = ranks[n]
            gpus = r.gpus + sorted(extra.get(n, []))
            out[n] = r.model_copy(update={"gpus": gpus, "cpus": max(r.cpus, cpus)})
    return out
