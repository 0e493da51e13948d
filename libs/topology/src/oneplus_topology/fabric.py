"""Where a node sits above itself: leaf switch, spine (pod/block) and multi-node NVLink domain.

Three sources, each optional: node labels (Kubernetes, Kueue topology levels, NVIDIA GPU feature discovery), LLDP
neighbour data (`lldpctl -f json`), and the GPU fabric info NVML reports (cluster UUID and clique id of an NVL72).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from oneplus_contracts import NodeTopology

HOSTNAME_LABEL = "kubernetes.io/hostname"
# First match wins. Leaf: the switch (or rack) a node's NICs plug into.
LEAF_LABELS: tuple[str, ...] = (
    "topology.oneplus.dev/leaf",
    "network.topology.nvidia.com/leaf",
    "cloud.provider.com/topology-rack",
    "cloud.google.com/gce-topology-subblock",
    "topology.k8s.aws/network-node-layer-3",
)
# Spine: the block/pod of leaves that share spine switches. A zone is the coarsest fallback.
SPINE_LABELS: tuple[str, ...] = (
    "topology.oneplus.dev/spine",
    "network.topology.nvidia.com/spine",
    "cloud.provider.com/topology-block",
    "cloud.google.com/gce-topology-block",
    "topology.k8s.aws/network-node-layer-2",
    "topology.kubernetes.io/zone",
)
# Multi-node NVLink domain (GB200 NVL72 rack): GPU feature discovery writes `<cluster uuid>.<clique id>`.
NVLINK_DOMAIN_LABELS: tuple[str, ...] = (
    "topology.oneplus.dev/nvlink-domain",
    "nvidia.com/gpu.clique",
    "network.topology.nvidia.com/accelerator",
)


@dataclass(frozen=True)
class FabricPlace:
    leaf: str | None = None
    spine: str | None = None
    nvlink_domain: str | None = None


def _first(labels: Mapping[str, str], keys: Sequence[str]) -> str | None:
    return next((labels[k] for k in keys if labels.get(k)), None)


def place_from_labels(labels: Mapping[str, str], levels: Sequence[str] | None = None) -> FabricPlace:
    """Leaf, spine and NVLink domain named by a node's labels.

    `levels` are Kueue Topology levels, top to bottom (e.g. block, rack, hostname): the hostname level is dropped,
    the lowest remaining level names the leaf and the one above it the spine. Without `levels`, the well-known keys
    in `LEAF_LABELS` / `SPINE_LABELS` are tried in order. A leaf is qualified by its spine (`b1/r1`) because rack
    names repeat across blocks.
    """
    if levels is not None:
        fabric_levels = [k for k in levels if k != HOSTNAME_LABEL]
        leaf = labels.get(fabric_levels[-1]) if fabric_levels else None
        spine = labels.get(fabric_levels[-2]) if len(fabric_levels) > 1 else None
    else:
        leaf, spine = _first(labels, LEAF_LABELS), _first(labels, SPINE_LABELS)
    if leaf and spine:
        leaf = f"{spine}/{leaf}"
    return FabricPlace(leaf=leaf or None, spine=spine or None, nvlink_domain=_first(labels, NVLINK_DOMAIN_LABELS))


def _iter_interfaces(lldp: Any) -> Iterator[tuple[str, Mapping[str, Any]]]:
    # `lldpctl -f json` gives {"interface": {name: {...}}} for one port and a list of such maps for several;
    # `-f json0` gives lists of {"name": ..., ...} everywhere.
    if isinstance(lldp, list):
        for item in lldp:
            yield from _iter_interfaces(item)
        return
    if not isinstance(lldp, Mapping):
        return
    if "name" in lldp and "chassis" in lldp:
        yield str(_value(lldp["name"])), lldp
        return
    for name, body in lldp.items():
        if isinstance(body, Mapping) and "chassis" in body:
            yield str(name), body
        elif isinstance(body, list):
            yield from _iter_interfaces(body)


def _value(v: Any) -> Any:
    while isinstance(v, list) and v:
        v = v[0]
    return v.get("value", v) if isinstance(v, Mapping) else v


def _chassis_name(chassis: Any) -> str | None:
    chassis = chassis[0] if isinstance(chassis, list) and chassis else chassis
    if not isinstance(chassis, Mapping):
        return None
    if "name" in chassis:
        return str(_value(chassis["name"]))
    named = [k for k, v in chassis.items() if isinstance(v, Mapping) and k not in ("id", "descr", "mgmt-ip")]
    if named:
        return str(named[0])
    return str(_value(chassis["id"])) if "id" in chassis else None


def leaf_from_lldp(data: Mapping[str, Any] | str, interfaces: Sequence[str] | None = None) -> str | None:
    """The leaf switch LLDP neighbours name, or None when no neighbour is seen.

    `data` is `lldpctl -f json` (or json0) output, as text or parsed; `interfaces` keeps only those ports (e.g. the
    compute NICs). Several distinct neighbours (a rail-optimised node cabled to one leaf per rail) give their names
    joined by `+`, so nodes cabled to the same leaves share one leaf id.
    """
    if isinstance(data, str):
        try:
            data = json.loads(data)
        except json.JSONDecodeError as e:
            raise ValueError(f"LLDP data is not JSON: {e}") from e
    if not isinstance(data, Mapping) or "lldp" not in data:
        raise ValueError("LLDP data must be `lldpctl -f json` output: an object with an 'lldp' key")
    root = data["lldp"]
    root = root[0] if isinstance(root, list) and root else root
    ports = root.get("interface", []) if isinstance(root, Mapping) else []
    names = {
        name
        for port, body in _iter_interfaces(ports)
        if interfaces is None or port in interfaces
        for name in [_chassis_name(body.get("chassis"))]
        if name
    }
    return "+".join(sorted(names)) or None


def nvlink_domain_of(topo: NodeTopology) -> str | None:
    """The multi-node NVLink domain the GPUs report (`<cluster uuid>.<clique id>`, the form of the
    `nvidia.com/gpu.clique` label), when they all agree on one."""
    ids = {(g.cluster_uuid, g.clique_id) for g in topo.gpus}
    if len(ids) != 1:
        return None
    uuid, clique = ids.pop()
    if uuid is None or clique is None:
        return None
    return f"{uuid}.{clique}"
