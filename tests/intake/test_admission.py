"""A job that could never run, even on the idle cluster, is refused at submission with `jobs explain`'s reason."""

from __future__ import annotations

import pytest
from oneplus_contracts import JobSpec, NodeRecord
from oneplus_intake.admission import ClusterFacts, EmptyCluster, Inadmissible, admission_key, admit
from oneplus_queueing.config import default_config
from oneplus_topology.presets import load_preset


def node(name: str, leaf: str, preset: str = "h100_sxm_8gpu_nvswitch_nv18", **kw: object) -> NodeRecord:
    topo = load_preset(preset, name).model_copy(update={"leaf": leaf, "spine": "s0"})
    return NodeRecord(topology=topo, **kw)  # type: ignore[arg-type]


# Two leaves of two 8-GPU nodes: 16 GPUs under each leaf.
NODES = [node("a0", "l0"), node("a1", "l0"), node("b0", "l1"), node("b1", "l1")]


def spec(**kw: object) -> JobSpec:
    return JobSpec.model_validate({"name": "t", **kw})


def test_four_whole_node_ranks_required_under_one_leaf_of_sixteen_gpus_are_refused_with_the_reason() -> None:
    big = spec(ranks=4, resources={"gpus": 8}, topology={"domain": "leaf", "mode": "required"})
    with pytest.raises(Inadmissible, match="can never run on this cluster") as exc:
        admit(big, default_config(), NODES, EmptyCluster())
    assert "leaf" in str(exc.value)
    # The same gang fits when it may span leaves, and a two-rank one fits under one leaf.
    admit(spec(ranks=4, resources={"gpus": 8}), default_config(), NODES, EmptyCluster())
    admit(
        spec(ranks=2, resources={"gpus": 8}, topology={"domain": "leaf", "mode": "required"}),
        default_config(),
        NODES,
        EmptyCluster(),
    )


def test_a_busy_or_unhealthy_cluster_does_not_make_a_job_inadmissible() -> None:
    """Only what can never change is judged: cordons, drains and unhealthy GPUs pass; so does a full cluster."""
    sick = [node("a0", "l0", unhealthy_gpus=[0, 1, 2]), node("a1", "l0", cordoned=True), *NODES[2:]]
    admit(
        spec(ranks=2, resources={"gpus": 8}, topology={"domain": "leaf", "mode": "required"}),
        default_config(),
        sick,
        EmptyCluster(),
    )


def test_a_constraint_no_node_has_is_refused() -> None:
    with pytest.raises(Inadmissible, match="can never run"):
        admit(spec(resources={"gpus": 1}, constraint="v100"), default_config(), NODES, EmptyCluster())
    admit(spec(resources={"gpus": 1}, constraint="h100"), default_config(), NODES, EmptyCluster())


def test_verdicts_are_kept_per_shape_and_forgotten_when_the_nodes_change() -> None:
    empty = EmptyCluster()
    big = spec(ranks=3, resources={"gpus": 8}, topology={"domain": "leaf", "mode": "required"})
    assert empty.never_fits(big, NODES) is not None
    assert len(empty._verdicts) == 1
    assert empty.never_fits(big, NODES) is not None and len(empty._verdicts) == 1
    wider = [*NODES, node("a2", "l0")]  # a third node under leaf l0: now it fits
    assert empty.never_fits(big, wider) is None


def test_a_heartbeat_leaves_the_admission_facts_as_they_are_and_a_lost_node_changes_them() -> None:
    before = node("a0", "l0")
    beat = before.model_copy(update={"last_heartbeat": 1234.5, "unhealthy_gpus": [3], "cordoned": True})
    lost = before.model_copy(update={"status": "lost"})
    assert admission_key(beat) == admission_key(before)
    assert admission_key(lost) != admission_key(before)
    facts = ClusterFacts.of([lost, *NODES[1:]])
    assert facts.total == 24 and facts.largest == 8 and len(facts.live) == 3


def test_admitting_on_precomputed_facts_decides_as_on_the_nodes() -> None:
    facts = ClusterFacts.of(NODES)
    big = spec(ranks=4, resources={"gpus": 8}, topology={"domain": "leaf", "mode": "required"})
    for nodes in (NODES, facts):
        with pytest.raises(Inadmissible, match="can never run on this cluster"):
            admit(big, default_config(), nodes, EmptyCluster())
        with pytest.raises(Inadmissible, match="larger than the cluster"):
            admit(spec(ranks=5, resources={"gpus": 8}), default_config(), nodes, EmptyCluster())
        with pytest.raises(Inadmissible, match="no node has a GPU model matching"):
            admit(spec(resources={"gpus": 1, "gpu_models": ["MI300X"]}), default_config(), nodes, EmptyCluster())
        admit(spec(ranks=2, resources={"gpus": 8}), default_config(), nodes, EmptyCluster())


def test_a_level_the_cluster_lacks_is_refused_at_submission_with_the_levels_it_has() -> None:
    with pytest.raises(
        Inadmissible,
        match=r"topology\.domain 'rack' is not a level of this cluster; its levels are node, leaf, spine, cluster",
    ):
        admit(
            spec(ranks=2, resources={"gpus": 8}, topology={"domain": "rack"}), default_config(), NODES, EmptyCluster()
        )


def test_a_tp_group_larger_than_every_nvlink_domain_is_refused_at_submission() -> None:
    """Four GB200 trays in one multi-node NVLink domain (16 GPUs): a TP-32 group can never fit, a TP-16 one can."""
    tray = load_preset("gb200_nvl72_compute_tray_4gpu")
    trays = [
        NodeRecord(
            topology=tray.model_copy(update={"node": f"t{i}", "leaf": "l9", "spine": "s0", "nvlink_domain": "rack0"})
        )
        for i in range(4)
    ]
    tp32 = spec(ranks=8, resources={"gpus": 4}, topology={"group_gpus": 32})
    with pytest.raises(Inadmissible, match="must sit inside one nvlink domain; the largest nvlink domain here"):
        admit(tp32, default_config(), [*NODES, *trays], EmptyCluster())
    admit(
        spec(ranks=4, resources={"gpus": 4}, topology={"group_gpus": 16}),
        default_config(),
        [*NODES, *trays],
        EmptyCluster(),
    )
