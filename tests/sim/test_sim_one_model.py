"""The simulator replays gangs as the live cycle places them: of one GPU model each (issue 44)."""

from __future__ import annotations

from pathlib import Path

from oneplus_sim.cluster import load_cluster
from oneplus_sim.replay import _can_ever_fit
from sim_helpers import job

MIXED = Path(__file__).parents[2] / "bench" / "clusters" / "mixed_256.yaml"  # 8 nodes of each of 4 models


def test_a_gang_larger_than_every_models_nodes_is_rejected_up_front() -> None:
    cluster = load_cluster(MIXED)
    assert _can_ever_fit(cluster, job("fits", 0.0, 64, 10.0)), "8 nodes x 8 GPUs: one model holds it"
    # 16 nodes of 8: the cluster has 32 such nodes, but no model has more than 8; it would wait for ever.
    assert not _can_ever_fit(cluster, job("big", 0.0, 128, 10.0))


def test_a_gang_that_lists_several_models_may_count_them_together() -> None:
    cluster = load_cluster(MIXED)
    big = job("big", 0.0, 128, 10.0)
    models = sorted({n.kind.gpu_model for n in cluster.nodes})
    big.gpu_models = tuple(models[:2])
    assert _can_ever_fit(cluster, big)
