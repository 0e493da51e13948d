"""MIG instances as placement units: a job asking `resources.mig: <profile>` gets one free instance a rank.

An instance is a unit of its own: a node offers its free instances of the asked profile (held ones are in
`Holdings.mig_held`); a GPU split into instances is never offered whole or as a share (`snapshot._mig_mask`).
Instances have no NVLink between them, so a MIG gang is packed onto as few nodes as its CPUs and memory allow, the
tightest node first (best fit keeps bigger blocks of free instances for bigger gangs), and never forms a TP group.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from oneplus_contracts import Allocation, JobSpec, MigInstance, NodeTopology, RankPlacement
from oneplus_contracts.features import FeatureConstraint, parse_constraint

from .layout import AllocationConflict

if TYPE_CHECKING:
    from .diagnosis import Explanation
    from .snapshot import Holdings


def instances(topo: NodeTopology, profile: str | None = None) -> list[tuple[int, MigInstance]]:
    """(GPU index, instance) of a node's healthy GPUs, of one profile when named, in listing order."""
    return [
        (g.index, m) for g in topo.gpus if g.healthy for m in g.mig_instances if profile is None or m.profile == profile
    ]


def cluster_profiles(topologies: Iterable[NodeTopology]) -> Counter[str]:
    """Instances of each profile across the nodes (free or not): what a submission may ask."""
    return Counter(m.profile for t in topologies for _, m in instances(t))


def free_instances(snap: Holdings, i: int, profile: str) -> list[str]:
    """UUIDs of node i's free instances of `profile` (none when the node is cordoned)."""
    if not snap.schedulable[i]:
        return []
    held = snap.mig_held[i]
    return [m.uuid for _, m in instances(snap.layout.slots[i].topology, profile) if m.uuid not in held]


def _ranks_fitting(snap: Holdings, i: int, spec: JobSpec, free: int) -> int:
    r = spec.resources
    by_cpu = int((snap.cpu_free(i) + 1e-9) // r.cpus)
    by_mem = snap.mem_free(i) // r.memory_mb
    return max(0, min(free, by_cpu, by_mem))


def place_mig(snap: Holdings, spec: JobSpec) -> Allocation | Explanation:
    """One free instance of the asked profile a rank, on as few nodes as possible, or why not."""
    from .diagnosis import Explanation

    profile = spec.resources.mig
    assert profile is not None
    slots = snap.layout.slots
    features = _features(spec)
    eligible = [s.index for s in slots if s.matches_model(spec.resources.gpu_models) and s.matches_features(features)]
    offered = {i: free_instances(snap, i, profile) for i in eligible}
    room = {i: _ranks_fitting(snap, i, spec, len(u)) for i, u in offered.items()}
    one_node = spec.topology.domain == "node" and spec.topology.mode == "required"
    whole = sorted((i for i in room if room[i] >= spec.ranks), key=lambda i: (room[i], slots[i].name))
    picks: list[tuple[int, int]] = []  # (node, ranks there)
    if whole:
        picks = [(whole[0], spec.ranks)]  # the tightest node that holds the gang
    elif not one_node:
        left = spec.ranks
        for i in sorted(room, key=lambda i: (-room[i], slots[i].name)):
            if left == 0 or room[i] == 0:
                break
            take = min(left, room[i])
            picks.append((i, take))
            left -= take
        if left:
            picks = []
    if not picks:
        total = sum(len(u) for u in offered.values())
        best = max(room, key=lambda i: room[i], default=None)
        where = "one node" if one_node else "the cluster"
        return Explanation(
            level="node" if one_node else "cluster",
            constraint="mig",
            needed_gpus=float(spec.ranks),
            message=f"{spec.ranks} ranks need {spec.ranks} free MIG {profile} instances in {where}; "
            f"{total} are free" + (f", at most {room[best]} usable on {slots[best].name}" if best is not None else ""),
            best_candidate=slots[best].name if best is not None else None,
            best_free_gpus=float(room[best]) if best is not None else 0.0,
        )
    ranks: list[RankPlacement] = []
    for i, count in picks:
        for uuid in offered[i][:count]:
            ranks.append(
                RankPlacement(
                    rank=len(ranks),
                    node=slots[i].name,
                    gpus=[],
                    mig=[uuid],
                    cpus=spec.resources.cpus,
                    memory_mb=spec.resources.memory_mb,
                )
            )
    return Allocation(ranks=ranks, domain="node" if len(picks) == 1 else "cluster", solver="mig")


def _features(spec: JobSpec) -> FeatureConstraint | None:
    return parse_constraint(spec.constraint) if spec.constraint else None


def mig_changes(snap: Holdings, alloc: Allocation, sign: int) -> dict[int, frozenset[str]]:
    """Per node, the instances `alloc` takes (sign 1) or gives back (-1); raises `AllocationConflict` and changes
    nothing when one is not an instance of that node, is held already (taking) or is not held (giving back)."""
    out: dict[int, set[str]] = {}
    for r in alloc.ranks:
        if not r.mig:
            continue
        i = snap.layout.index(r.node)
        known = {m.uuid for _, m in instances(snap.layout.slots[i].topology)}
        for uuid in r.mig:
            if uuid not in known:
                raise AllocationConflict(f"rank {r.rank}: {uuid} is not a MIG instance of a healthy GPU of {r.node}")
            mine = out.setdefault(i, set())
            if uuid in mine:
                raise AllocationConflict(f"rank {r.rank}: MIG instance {uuid} on {r.node} is taken twice")
            if sign > 0 and uuid in snap.mig_held[i]:
                raise AllocationConflict(f"MIG instance {uuid} on {r.node} is already held")
            if sign < 0 and uuid not in snap.mig_held[i]:
                raise AllocationConflict(f"MIG instance {uuid} on {r.node} is not held")
            mine.add(uuid)
    return {i: frozenset(u) for i, u in out.items()}


def mig_uuids(ranks: Sequence[RankPlacement]) -> list[str]:
    return [u for r in ranks for u in r.mig]
