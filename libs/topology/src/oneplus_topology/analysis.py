"""Questions the scheduler asks of one node: NVLink groups and domains, pair and ring bandwidth, best GPU sets.

`node_model(topo)` builds the matrices once per distinct topology (nodes that share a layout share one model) and
memoises ring bandwidth per GPU set, because placement asks these questions thousands of times per cycle.

A GPU with a link down (`nvlinks_active < nvlinks_total`) leaves every NVLink group and domain: one slow hop caps a
whole ring, and on a mesh we cannot tell which peer lost the link. Its pair bandwidth is scaled by the share of links
still up, falling back to PCIe (NODE on the same NUMA node, SYS otherwise) when none is left.
"""

from __future__ import annotations

import functools
import itertools
import weakref
from collections.abc import Collection, Iterable, Sequence
from typing import NamedTuple

from oneplus_contracts import GpuHealth, NodeTopology

from .bandwidth import link_gbps
from .smi import NEAR_TIERS

_CACHE_LIMIT = 4096
# Exact Hamiltonian search up to this many GPUs; larger sets use a greedy ring (a lower bound).
_EXACT_RING_MAX = 16


class GpuSet(NamedTuple):
    gpus: tuple[int, ...]
    ring_gbps: float
    numa_nodes: int
    spread: int  # sum over pairs of the link's distance rank (NVLink 0, PIX 1 ... SYS 5): lower is tighter


_RANK = {"PIX": 1, "PXB": 2, "PHB": 3, "NODE": 4, "SYS": 5}


class NodeModel:
    """Matrices of one node, indexed by position in `topo.gpus`; the public methods take and return GPU indices."""

    def __init__(self, topo: NodeTopology) -> None:
        self.gpu_model = topo.gpu_model
        self.indices: tuple[int, ...] = tuple(g.index for g in topo.gpus)
        self.pos: dict[int, int] = {idx: p for p, idx in enumerate(self.indices)}
        n = len(self.indices)
        self.numa: list[int | None] = [g.numa_node for g in topo.gpus]
        ratio = [g.nvlinks_active / g.nvlinks_total if g.nvlinks_total else 1.0 for g in topo.gpus]
        self.degraded: frozenset[int] = frozenset(g.index for g in topo.gpus if g.nvlinks_active < g.nvlinks_total)
        self.kind: list[list[str]] = [["X"] * n for _ in range(n)]
        self.nvlinks: list[list[int]] = [[0] * n for _ in range(n)]
        self.gbps: list[list[float]] = [[0.0] * n for _ in range(n)]
        given = {(lk.a, lk.b): lk for lk in topo.links}
        for i, j in itertools.combinations(range(n), 2):
            a, b = self.indices[i], self.indices[j]
            link = given.get((a, b)) or given.get((b, a))
            # A pair the report left out is taken at the slowest tier rather than refused.
            kind, links, gbps = (
                (link.kind, link.nvlinks, link.gbps) if link else ("SYS", 0, link_gbps("SYS", topo.gpu_model))
            )
            if links and min(ratio[i], ratio[j]) < 1.0:
                kind, links, gbps = self._degraded_link(i, j, links, gbps, min(ratio[i], ratio[j]))
            self.kind[i][j] = self.kind[j][i] = kind
            self.nvlinks[i][j] = self.nvlinks[j][i] = links
            self.gbps[i][j] = self.gbps[j][i] = gbps
        self.rank: list[list[int]] = [
            [0 if links else _RANK.get(k, 5) for k, links in zip(kr, nr, strict=True)]
            for kr, nr in zip(self.kind, self.nvlinks, strict=True)
        ]
        self.nv_adj: list[int] = [0] * n
        for i, j in itertools.combinations(range(n), 2):
            healthy_links = self.indices[i] not in self.degraded and self.indices[j] not in self.degraded
            if self.nvlinks[i][j] and healthy_links:
                self.nv_adj[i] |= 1 << j
                self.nv_adj[j] |= 1 << i
        self.groups: list[list[int]] = self._cliques()
        self.domains: list[list[int]] = self._components()
        self._ring: dict[frozenset[int], float] = {}
        self._best: dict[tuple[int, frozenset[int]], list[GpuSet]] = {}

    def _degraded_link(self, i: int, j: int, links: int, gbps: float, share: float) -> tuple[str, int, float]:
        left = int(links * share)
        if left:
            return f"NV{left}", left, gbps * left / links
        same_numa = self.numa[i] is not None and self.numa[i] == self.numa[j]
        kind = "NODE" if same_numa else "SYS"
        return kind, 0, link_gbps(kind, self.gpu_model)

    def _to_indices(self, masks: Iterable[int]) -> list[list[int]]:
        return sorted(sorted(self.indices[p] for p in range(len(self.indices)) if m >> p & 1) for m in masks)

    def _cliques(self) -> list[list[int]]:
        found: list[int] = []

        def expand(r: int, p: int, x: int) -> None:
            if not p and not x:
                if r & (r - 1):  # two or more GPUs
                    found.append(r)
                return
            pivot_src = p | x
            pivot = (pivot_src & -pivot_src).bit_length() - 1
            cand = p & ~self.nv_adj[pivot]
            while cand:
                v = (cand & -cand).bit_length() - 1
                cand &= cand - 1
                expand(r | 1 << v, p & self.nv_adj[v], x & self.nv_adj[v])
                p &= ~(1 << v)
                x |= 1 << v

        expand(0, (1 << len(self.indices)) - 1, 0)
        return self._to_indices(found)

    def _components(self) -> list[list[int]]:
        seen = 0
        comps: list[int] = []
        for start in range(len(self.indices)):
            if seen >> start & 1 or not self.nv_adj[start]:
                continue
            comp, frontier = 1 << start, 1 << start
            while frontier:
                v = (frontier & -frontier).bit_length() - 1
                frontier &= frontier - 1
                new = self.nv_adj[v] & ~comp
                comp |= new
                frontier |= new
            seen |= comp
            comps.append(comp)
        return self._to_indices(comps)

    def positions(self, gpus: Iterable[int]) -> list[int]:
        out = []
        for g in gpus:
            if g not in self.pos:
                raise ValueError(f"GPU {g} is not on this node (GPUs {list(self.indices)})")
            out.append(self.pos[g])
        if len(set(out)) != len(out):
            raise ValueError(f"GPU set {list(gpus)} names a GPU twice")
        return out

    def pair_gbps(self, a: int, b: int) -> float:
        i, j = self.positions((a, b))
        return self.gbps[i][j]

    def ring_gbps(self, gpus: Iterable[int]) -> float:
        """Slowest hop of the best ring over `gpus` (GB/s); 0.0 for fewer than two GPUs (no hop)."""
        chosen = tuple(gpus)
        key = frozenset(chosen)
        hit = self._ring.get(key)
        if hit is None or len(key) != len(chosen):
            hit = self._ring[key] = self._best_ring(self.positions(chosen))
        return hit

    def _best_ring(self, members: list[int]) -> float:
        k = len(members)
        if k < 2:
            return 0.0
        g = self.gbps
        if k == 2:
            return g[members[0]][members[1]]
        values = sorted({g[a][b] for a, b in itertools.combinations(members, 2)}, reverse=True)
        for t in values:
            adj = [sum(1 << y for y, b in enumerate(members) if y != x and g[a][b] >= t) for x, a in enumerate(members)]
            if _has_hamiltonian_cycle(adj):
                return t
        return values[-1]

    def best_gpu_sets(self, k: int, free: Collection[int] | None = None, limit: int = 8) -> list[GpuSet]:
        """The `limit` best sets of `k` GPUs among `free`: fastest ring first, then fewest NUMA nodes, then the
        tightest PCIe/NVLink distances, then GPU index."""
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        pool = frozenset(self.indices if free is None else free)
        self.positions(pool)
        key = (k, pool)
        if key not in self._best:
            sets = [self._gpu_set(combo) for combo in itertools.combinations(sorted(pool), k)]
            sets.sort(key=lambda s: (-s.ring_gbps, s.numa_nodes, s.spread, s.gpus))
            self._best[key] = sets
        return self._best[key][:limit]

    def _gpu_set(self, combo: tuple[int, ...]) -> GpuSet:
        ps = [self.pos[g] for g in combo]
        spread = sum(self.rank[a][b] for a, b in itertools.combinations(ps, 2))
        return GpuSet(combo, self.ring_gbps(combo), len({self.numa[p] for p in ps}), spread)


def _has_hamiltonian_cycle(adj: list[int]) -> bool:
    k = len(adj)
    if all(m.bit_count() >= (k + 1) // 2 for m in adj):  # Dirac: degree >= k/2 guarantees a cycle
        return True
    if any(not m for m in adj) or any(m.bit_count() < 2 for m in adj):
        return False
    if k > _EXACT_RING_MAX:
        return _greedy_cycle(adj)
    full = (1 << k) - 1
    reach = [0] * (1 << k)
    reach[1] = 1
    for mask in range(1, full + 1, 2):
        ends = reach[mask]
        while ends:
            v = (ends & -ends).bit_length() - 1
            ends &= ends - 1
            nxt = adj[v] & ~mask
            while nxt:
                w = nxt & -nxt
                nxt &= nxt - 1
                reach[mask | w] |= w
    return bool(reach[full] & adj[0])


def _greedy_cycle(adj: list[int]) -> bool:
    # Beyond exact search: a path that always moves to the unvisited GPU with the fewest onward options.
    k = len(adj)
    for start in range(k):
        path, mask, v = 1, 1 << start, start
        while path < k:
            nxt = adj[v] & ~mask
            if not nxt:
                break
            options = [(bin(adj[w] & ~mask).count("1"), w) for w in range(k) if nxt >> w & 1]
            v = min(options)[1]
            mask |= 1 << v
            path += 1
        if path == k and adj[v] >> start & 1:
            return True
    return False


_models: dict[tuple[object, ...], NodeModel] = {}
# Fast path for the same object asked again: id -> (weak ref, NVLinks up per GPU, model).
_by_identity: dict[int, tuple[weakref.ref[NodeTopology], tuple[int, ...], NodeModel]] = {}


def _fingerprint(topo: NodeTopology) -> tuple[object, ...]:
    return (
        topo.gpu_model,
        tuple((g.index, g.numa_node, g.nvlinks_active, g.nvlinks_total) for g in topo.gpus),
        tuple((lk.a, lk.b, lk.kind, lk.gbps) for lk in topo.links),
    )


def _forget(key: int, ref: weakref.ref[NodeTopology]) -> None:
    entry = _by_identity.get(key)
    if entry is not None and entry[0] is ref:
        del _by_identity[key]


def node_model(topo: NodeTopology) -> NodeModel:
    """The (shared, memoised) `NodeModel` of a topology; nodes with the same layout and link state share one.

    Topologies are treated as immutable: change one through copies (`degrade`, `apply_health`). A GPU's
    `nvlinks_active` changed in place is still noticed; links changed in place are not.
    """
    key = id(topo)
    links_up = tuple(g.nvlinks_active for g in topo.gpus)
    hit = _by_identity.get(key)
    if hit is not None and hit[0]() is topo and hit[1] == links_up:
        return hit[2]
    content = _fingerprint(topo)
    model = _models.get(content)
    if model is None:
        if len(_models) >= _CACHE_LIMIT:
            _models.pop(next(iter(_models)))
        model = _models[content] = NodeModel(topo)
    ref = weakref.ref(topo, functools.partial(_forget, key))
    _by_identity[key] = (ref, links_up, model)
    return model


def nvlink_groups(topo: NodeTopology) -> list[list[int]]:
    """Maximal sets of two or more GPUs joined pairwise by NVLink (a DGX-1 gives its two quads and four pairs)."""
    return [list(g) for g in node_model(topo).groups]


def nvlink_domains(topo: NodeTopology) -> list[list[int]]:
    """Connected components (two or more GPUs) of the NVLink graph."""
    return [list(d) for d in node_model(topo).domains]


def pair_gbps(topo: NodeTopology) -> list[list[float]]:
    """GB/s between every two GPUs, by position in `topo.gpus`; the diagonal is 0."""
    return [list(row) for row in node_model(topo).gbps]


def ring_gbps(topo: NodeTopology, gpus: Sequence[int]) -> float:
    """The slowest hop of the best ring over `gpus` (GB/s), memoised per topology and GPU set."""
    return node_model(topo).ring_gbps(gpus)


def best_gpu_sets(topo: NodeTopology, k: int, free: Collection[int] | None = None, limit: int = 8) -> list[GpuSet]:
    return node_model(topo).best_gpu_sets(k, free, limit)


def pcie_switch_groups(topo: NodeTopology) -> list[list[int]]:
    """GPUs grouped by the PCIe switch above them (GPUs at PIX/PXB from each other or from one NIC)."""
    groups: dict[str, list[int]] = {}
    for g in topo.gpus:
        if g.pcie_switch is not None:
            groups.setdefault(g.pcie_switch, []).append(g.index)
    return sorted(sorted(v) for v in groups.values())


def numa_groups(topo: NodeTopology) -> dict[int, list[int]]:
    """GPUs per NUMA node; GPUs whose NUMA node is unknown are left out."""
    out: dict[int, list[int]] = {}
    for g in topo.gpus:
        if g.numa_node is not None:
            out.setdefault(g.numa_node, []).append(g.index)
    return dict(sorted(out.items()))


def rails(topo: NodeTopology) -> dict[int, list[str]]:
    """The NICs at PIX/PXB distance of each GPU (its rail); an empty list when none is that close."""
    out: dict[int, list[str]] = {g.index: [] for g in topo.gpus}
    for nic in topo.nics:
        for g, tier in nic.gpu_tiers.items():
            if tier in NEAR_TIERS and g in out:
                out[g].append(nic.name)
    return out


def degrade(topo: NodeTopology, gpu_index: int, active_links: int) -> NodeTopology:
    """A copy of `topo` where one GPU has only `active_links` NVLinks up."""
    gpu = next((g for g in topo.gpus if g.index == gpu_index), None)
    if gpu is None:
        raise ValueError(f"GPU {gpu_index} is not on node {topo.node}")
    if not 0 <= active_links <= gpu.nvlinks_total:
        raise ValueError(f"GPU {gpu_index} has {gpu.nvlinks_total} NVLinks; active_links={active_links} is outside 0..")
    new = gpu.model_copy(update={"nvlinks_active": active_links})
    return topo.model_copy(update={"gpus": [new if g.index == gpu_index else g for g in topo.gpus]})


def apply_health(topo: NodeTopology, health: Iterable[GpuHealth]) -> NodeTopology:
    """A copy of `topo` with the health (and NVLinks up) a heartbeat reports per GPU."""
    by_index = {h.index: h for h in health}
    unknown = sorted(set(by_index) - {g.index for g in topo.gpus})
    if unknown:
        raise ValueError(f"heartbeat names GPUs {unknown} that node {topo.node} does not have")
    gpus = []
    for g in topo.gpus:
        h = by_index.get(g.index)
        if h is None:
            gpus.append(g)
            continue
        update: dict[str, object] = {"healthy": h.healthy, "health_reason": h.reason}
        if h.nvlinks_active is not None:
            update["nvlinks_active"] = min(h.nvlinks_active, g.nvlinks_total)
        gpus.append(g.model_copy(update=update))
    return topo.model_copy(update={"gpus": gpus})
