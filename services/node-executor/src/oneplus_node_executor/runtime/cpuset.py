"""CPU lists as Linux prints them ('0-47,96-143') and the cpuset a rank gets: the CPUs near its GPUs."""

from __future__ import annotations

from collections.abc import Iterable

from oneplus_contracts import NodeTopology


def parse_cpu_list(text: str) -> frozenset[int]:
    """'0-3,8,10-11' → {0,1,2,3,8,10,11}; a malformed list is an error naming the bad part."""
    cpus: set[int] = set()
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"bad CPU list {text!r}: {part!r} is not N or N-M")
        start, end = int(lo), int(hi) if sep else int(lo)
        if end < start:
            raise ValueError(f"bad CPU list {text!r}: range {part!r} runs backwards")
        cpus.update(range(start, end + 1))
    return frozenset(cpus)


def format_cpu_list(cpus: Iterable[int]) -> str:
    """{0,1,2,3,8} → '0-3,8' (the form the cpuset cgroup and the Docker API take)."""
    ordered = sorted(set(cpus))
    runs: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        runs.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(runs)


def gpu_affinity(topo: NodeTopology, gpus: Iterable[int]) -> frozenset[int]:
    """The union of the CPUs local to the given GPUs (their NUMA nodes); empty when the topology does not say."""
    by_index = {g.index: g for g in topo.gpus}
    cpus: set[int] = set()
    for index in gpus:
        info = by_index.get(index)
        if info is None:
            raise ValueError(f"GPU {index} is not on node {topo.node} (it has {sorted(by_index)})")
        if info.cpu_affinity:
            cpus |= parse_cpu_list(info.cpu_affinity)
    return frozenset(cpus)


def numa_cpuset(topo: NodeTopology | None, gpus: Iterable[int], host_cpus: Iterable[int] | None) -> str | None:
    """The cpuset for a rank: its GPUs' NUMA-local CPUs that exist on this host; None when nothing is known or left.

    Clamping matters because a topology report may describe a bigger machine than the one the engine runs on
    (tests, a partitioned host); an empty or out-of-range cpuset would make the engine refuse the container.
    """
    if topo is None:
        return None
    wanted = gpu_affinity(topo, gpus)
    if host_cpus is not None:
        wanted = wanted & frozenset(host_cpus)
    return format_cpu_list(wanted) if wanted else None
