"""Levels in the contracts: a job names any level the site has; a node names its levels; GPUs agree on their clique."""

from __future__ import annotations

import pytest
from oneplus_contracts import GpuInfo, JobSpec, NodeTopology
from pydantic import ValidationError


def spec(**topology: object) -> JobSpec:
    return JobSpec.model_validate({"name": "j", "ranks": 4, "resources": {"gpus": 4}, "topology": topology})


def test_a_job_may_name_the_sites_own_levels() -> None:
    assert spec(domain="nvlink", mode="required").topology.domain == "nvlink"
    assert spec(domain="rack").topology.domain == "rack"
    t = spec(group_gpus=16, group_domain="nvlink").topology
    assert (t.group_gpus, t.group_domain) == (16, "nvlink")


@pytest.mark.parametrize(
    ("topology", "message"),
    [
        ({"domain": "Rack 1"}, "should match pattern"),
        ({"group_domain": "nvlink"}, "group_domain='nvlink' needs group_gpus"),
        ({"group_gpus": 16, "group_domain": "cluster"}, "group_domain='cluster' keeps nothing together"),
    ],
)
def test_bad_levels_in_a_job_are_refused_with_one_clear_line(topology: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        spec(**topology)


def gpu(index: int, clique: int) -> GpuInfo:
    return GpuInfo(index=index, cluster_uuid="c0ffee", clique_id=clique)


def test_a_node_whose_gpus_disagree_on_their_clique_is_refused() -> None:
    NodeTopology(node="tray", gpus=[gpu(0, 3), gpu(1, 3)])
    with pytest.raises(ValidationError, match=r"node 'tray': its GPUs disagree on their NVLink clique "):
        NodeTopology(node="tray", gpus=[gpu(0, 3), gpu(1, 3), gpu(2, 4)])


def test_a_nodes_levels_are_named_like_a_jobs() -> None:
    topo = NodeTopology(node="n", gpus=[], levels={"rack": "r1", "zone": "z1"})
    assert list(topo.levels) == ["rack", "zone"]
    with pytest.raises(ValidationError, match="level 'cluster': a level is a lower-case name"):
        NodeTopology(node="n", gpus=[], levels={"cluster": "c"})
    with pytest.raises(ValidationError, match="level 'rack': the node's domain at this level is empty"):
        NodeTopology(node="n", gpus=[], levels={"rack": ""})
