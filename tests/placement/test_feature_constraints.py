"""Slurm's --constraint: the feature-expression parser, node features, and placement only on nodes that qualify."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from oneplus_contracts import JobSpec, RankResources
from oneplus_contracts.features import ConstraintError, model_feature, node_features, parse_constraint
from oneplus_placement import place_gang
from oneplus_placement.snapshot import ClusterState
from oneplus_topology.cluster import load_cluster, synthetic_cluster
from placement_boards import board, cluster_of
from pydantic import ValidationError

A100 = "dgx_a100_8gpu_nv12_12nic"
H100 = "h100_sxm_8gpu_nvswitch_nv18"


def job(gpus: int, ranks: int = 1, constraint: str | None = None) -> JobSpec:
    return JobSpec(name="j", ranks=ranks, resources=RankResources(gpus=gpus), constraint=constraint)


@pytest.mark.parametrize(
    ("text", "terms", "matching"),
    [
        ("h100", [{"h100"}], False),
        ("H100", [{"h100"}], False),
        ("a&b", [{"a", "b"}], False),
        ("a100|h100", [{"a100"}, {"h100"}], False),
        ("ib&(a100|h100)", [{"ib", "a100"}, {"ib", "h100"}], False),
        ("a|b&c", [{"a"}, {"b", "c"}], False),  # & binds tighter than |
        ("[rack1|rack2]", [{"rack1"}, {"rack2"}], True),
        ("a,b", [{"a", "b"}], False),
    ],
)
def test_constraints_parse_into_or_of_ands(text: str, terms: list[set[str]], matching: bool) -> None:
    c = parse_constraint(text)
    assert sorted(map(sorted, c.any_of)) == sorted(map(sorted, terms))
    assert c.matching is matching


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "empty"),
        ("a*2", "node counts"),
        ("!a", "'!'"),
        ("[a|b]&c", "whole expression"),
        ("a&", "ends where a feature"),
        ("(a|b", "missing ')'"),
        ("a||b", "expected a feature"),
        ("a b", "unexpected 'b'"),
    ],
)
def test_unsupported_constraints_are_refused_by_name(text: str, says: str) -> None:
    with pytest.raises(ConstraintError) as err:
        parse_constraint(text)
    assert says in str(err.value)


def test_a_spec_with_an_unreadable_constraint_is_refused() -> None:
    with pytest.raises(ValidationError, match="node counts"):
        job(1, constraint="h100*2")


def test_node_features_include_the_gpu_model() -> None:
    assert model_feature("H100") == "h100"
    assert model_feature("RTX 4090") == "rtx-4090"
    assert model_feature("unknown") is None
    assert node_features("A100", ["IB", "rack1"]) == {"a100", "ib", "rack1"}


def test_synthetic_nodes_carry_their_preset_model_feature() -> None:
    assert synthetic_cluster(1, preset=A100).nodes[0].features == ["a100"]


def test_cluster_yaml_features_per_group_and_node(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(
        textwrap.dedent(
            f"""
            name: c
            node_groups:
              - {{prefix: a, count: 2, topology: {A100}, features: [IB, rack1]}}
              - {{prefix: h, count: 1, topology: {H100}}}
            nodes:
              a-01: {{features: [bigmem]}}
            """
        )
    )
    nodes = {n.node: n.features for n in load_cluster(f).nodes}
    assert nodes == {"a-00": ["ib", "rack1", "a100"], "a-01": ["ib", "rack1", "a100", "bigmem"], "h-00": ["h100"]}


def _mixed() -> ClusterState:
    """n000-n001: A100 nodes; n002-n003: H100 nodes (n003 also has feature `ib`)."""
    boards = [board(A100), board(A100), board(H100), board(H100).model_copy(update={"features": ["ib"]})]
    return ClusterState.from_cluster(cluster_of(boards, nodes_per_leaf=4))


def test_a_constraint_routes_the_job_to_nodes_that_have_the_feature() -> None:
    state = _mixed()
    for c, allowed in [("h100", {"n002", "n003"}), ("a100", {"n000", "n001"}), ("ib", {"n003"}), ("H100&ib", {"n003"})]:
        got = place_gang(state, job(2, constraint=c))
        assert got.allocation is not None
        assert set(got.allocation.nodes) <= allowed, c
    # Unconstrained, the same job takes the first node (an A100).
    free = place_gang(state, job(2))
    assert free.allocation is not None and free.allocation.nodes == ["n000"]


def test_a_gang_spans_only_qualifying_nodes() -> None:
    state = _mixed()
    got = place_gang(state, job(8, ranks=2, constraint="h100"))
    assert got.allocation is not None and sorted(got.allocation.nodes) == ["n002", "n003"]
    assert place_gang(state, job(8, ranks=3, constraint="h100")).allocation is None


def test_a_matching_or_keeps_every_node_on_one_alternative() -> None:
    state = _mixed()
    # 3 nodes of 8 GPUs: a plain OR may mix models, the matching OR cannot (only 2 of each).
    mixed = place_gang(state, job(8, ranks=3, constraint="a100|h100"))
    assert mixed.allocation is not None
    assert place_gang(state, job(8, ranks=3, constraint="[a100|h100]")).allocation is None
    same = place_gang(state, job(8, ranks=2, constraint="[h100|a100]"))
    assert same.allocation is not None
    assert set(same.allocation.nodes) in ({"n000", "n001"}, {"n002", "n003"})


def test_no_node_with_the_features_is_explained_as_a_constraint() -> None:
    got = place_gang(_mixed(), job(1, constraint="v100"))
    assert got.allocation is None and got.explanation is not None
    assert got.explanation.constraint == "constraint"
    assert "'v100'" in got.explanation.message and "a100" in got.explanation.message
