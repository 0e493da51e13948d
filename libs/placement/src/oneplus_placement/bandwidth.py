"""The communication model: ring bandwidth of a gang's GPUs, inside a node and across the fabric.

Inside a node a ring is as fast as its weakest GPU-to-GPU hop (the node's bandwidth matrix). Across nodes every GPU
sends through its own NIC rail, so the ring also cannot beat one NIC's rate per GPU (Gb/s / 8 = GB/s), divided by the
fabric's oversubscription once the ring leaves a leaf. Across the trays of one multi-node NVLink domain (a GB200
NVL72 rack) the hop is NVLink through the NVSwitch trays: the board's own NVLink figure per GPU, not the NIC's. The
simulator uses the same function for a job's speed.
"""

from __future__ import annotations

import math

from oneplus_contracts import Allocation

from .layout import ClusterLike, Layout, layout_of_cluster
from .shape import NodeShape
from .snapshot import Holdings


def layout_of(where: Holdings | Layout | ClusterLike) -> Layout:
    if isinstance(where, Layout):
        return where
    if isinstance(where, Holdings):
        return where.layout
    return layout_of_cluster(where)


def distinct_shapes(layout: Layout) -> list[NodeShape]:
    got = layout.cache.get("shapes")
    if not isinstance(got, list):
        got = list({id(s.shape): s.shape for s in layout.slots}.values())
        layout.cache["shapes"] = got
    return got


def fabric_gbps(layout: Layout, crosses_leaf: bool) -> float:
    """GB/s one GPU's ring hop gets over the network."""
    rate = layout.nic_gbps_per_gpu / 8
    return rate / layout.oversubscription if crosses_leaf else rate


def board_nvlink_gbps(shape: NodeShape) -> float:
    """GB/s of the board's fastest NVLink hop: what a GPU of it sends over a multi-node NVLink fabric (NV18 on a GB200
    tray: 900 GB/s); 0 for a board without NVLink."""
    best = 0.0
    for a in range(shape.n):
        for b in range(a + 1, shape.n):
            if shape.tier[a][b] == 0:
                best = max(best, shape.gbps[a][b])
    return best


def nvlink_fabric_gbps(layout: Layout, nodes: list[int]) -> float | None:
    """GB/s per GPU of a ring hop between nodes that share one multi-node NVLink domain, or None when they do not."""
    level = layout.level("nvlink")
    if level is None or not nodes:
        return None
    first = level.of_node[nodes[0]]
    if len(level.members[first]) < 2 or any(level.of_node[i] != first for i in nodes):
        return None
    rate = min(board_nvlink_gbps(layout.slots[i].shape) for i in nodes)
    return rate if rate > 0 else None


def allocation_ring_gbps(where: Holdings | Layout | ClusterLike, alloc: Allocation) -> float:
    """Bottleneck GB/s of one ring through every GPU of `alloc` (0 for a single GPU or GPU share)."""
    layout = layout_of(where)
    masks: dict[int, int] = {}
    for r in alloc.ranks:
        i = layout.index(r.node)
        masks[i] = masks.get(i, 0) | layout.slots[i].shape.mask_of(r.gpus)
    return _ring_of(layout, masks)


def ring_of_masks(layout: Layout, masks: dict[int, int]) -> float:
    return _ring_of(layout, masks)


def _ring_of(layout: Layout, masks: dict[int, int]) -> float:
    if not masks:
        return 0.0
    if len(masks) == 1:
        ((i, mask),) = masks.items()
        return layout.slots[i].shape.ring_gbps(mask)
    intra = math.inf
    for i, mask in masks.items():
        if mask.bit_count() > 1:
            intra = min(intra, layout.slots[i].shape.ring_gbps(mask))
    nvlink = nvlink_fabric_gbps(layout, list(masks))
    if nvlink is not None:
        return min(intra, nvlink)
    leaves = {layout.slots[i].leaf for i in masks}
    return min(intra, fabric_gbps(layout, len(leaves) > 1))


def ideal_ring_gbps(where: Holdings | Layout | ClusterLike, total_gpus: int, gpus_per_rank: int = 1) -> float:
    """The best ring any placement of this gang could get on an empty cluster (the B* of a job)."""
    layout = layout_of(where)
    if total_gpus < 2 or gpus_per_rank < 1:
        return 0.0
    best = 0.0
    biggest_leaf = max(len(nodes) for nodes in layout.leaf_nodes)
    for shape in distinct_shapes(layout):
        if gpus_per_rank > shape.n:
            continue
        if total_gpus <= shape.n:
            top = shape.top(shape.full, total_gpus)
            best = max(best, shape.ring_gbps(top[0]) if top else 0.0)
            continue
        per_node = (shape.n // gpus_per_rank) * gpus_per_rank
        nodes = math.ceil(total_gpus / per_node)
        top = shape.top(shape.full, per_node)
        intra = shape.ring_gbps(top[0]) if top and per_node > 1 else math.inf
        best = max(best, min(intra, fabric_gbps(layout, nodes > biggest_leaf)))
    return max(best, _ideal_in_nvlink_domain(layout, total_gpus, gpus_per_rank))


def _ideal_in_nvlink_domain(layout: Layout, total_gpus: int, gpus_per_rank: int) -> float:
    """The best ring of a gang that fits inside one multi-node NVLink domain (0 when none holds it)."""
    level = layout.level("nvlink")
    if level is None:
        return 0.0
    key = ("ideal_nvlink", total_gpus, gpus_per_rank)
    got = layout.cache.get(key)
    if isinstance(got, float):
        return got
    best = 0.0
    for members in level.members:
        if len(members) < 2:
            continue
        shapes = [layout.slots[i].shape for i in members]
        room = sum((s.n // gpus_per_rank) * gpus_per_rank for s in shapes)
        if room < total_gpus:
            continue
        rate = min(board_nvlink_gbps(s) for s in shapes)
        intra = min((s.ring_gbps(s.full) for s in shapes if s.n > 1), default=rate)
        best = max(best, min(rate, intra))
    layout.cache[key] = best
    return best


# Boards whose best ring for a shape is at least this share of the cluster's best count as equally good: A100 and
# H100 NVSwitch boards (2:3) stay interchangeable for best fit, a several-fold loss (NV3 pairs over SYS) is not.
BOARD_PAR = 0.5


def board_shortfall(layout: Layout, shape: NodeShape, size: int, group: int = 1, cap_gbps: float = math.inf) -> float:
    """How far this board kind's best ring of `size` GPUs falls short of the best any board of the cluster gets.

    0 for a board at par (see BOARD_PAR), else 1 - ring/best in tenths, so boards of similar speed tie and best fit
    decides among them. Compared in GB/s across board kinds, not against an empty board of the same kind.
    `cap_gbps`: what the rest of the ring allows (the network, for a gang that spans nodes), so a board faster than
    the network is worth no more than one as fast as it.
    """
    if size < 2:
        return 0.0
    key = ("board_shortfall", id(shape), size, group, cap_gbps)
    got = layout.cache.get(key)
    if isinstance(got, float):
        return got
    best = 0.0
    own = 0.0
    for s in distinct_shapes(layout):
        if size > s.n:
            continue
        top = s.top(s.full, size, group)
        ring = min(s.ring_gbps(top[0]), cap_gbps) if top else 0.0
        best = max(best, ring)
        if s is shape:
            own = ring
    got = 0.0 if best <= 0 or own >= BOARD_PAR * best else round(1.0 - own / best, 1)
    layout.cache[key] = got
    return got


def slowdown(comm_fraction: float, ideal_gbps: float, gbps: float) -> float:
    """How much longer a job runs on ring bandwidth `gbps` than on the best, `ideal_gbps`: (1 − f) + f·B*/B (never
    below 1), with f the share of a step spent communicating; 1 without communication. The simulator's model
    (BENCHMARKS.md §1) and the live cycle's board choice both use it."""
    if comm_fraction <= 0 or ideal_gbps <= 0:
        return 1.0
    if gbps <= 0:
        raise ValueError("a multi-GPU allocation with zero ring bandwidth cannot run")
    return max(1.0, (1 - comm_fraction) + comm_fraction * ideal_gbps / gbps)
