"""Turns `oneplus_topology`'s cluster model into the simulator's `SimCluster`."""

from __future__ import annotations

from pathlib import Path

from .cluster import ClusterError, SimCluster


def cluster_from_yaml(path: Path) -> SimCluster:
    try:
        from oneplus_topology.cluster import load_cluster
    except ImportError as e:
        raise ClusterError(f"{path}: reading a cluster YAML needs oneplus_topology.cluster.load_cluster ({e})") from e
    return from_topology(load_cluster(path), source=str(path))


def from_topology(cluster: object, source: str) -> SimCluster:
    raise ClusterError(f"{source}: conversion from oneplus_topology is not available yet")
