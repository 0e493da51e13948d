"""Slurm --nodelist/--exclude: a job is placed only on the nodes it names and never on those it excludes."""

from __future__ import annotations

import pytest
from oneplus_contracts import JobSpec, NodeRecord
from oneplus_intake.admission import EmptyCluster, Inadmissible, admit
from oneplus_jobformats.sbatch import parse_sbatch
from oneplus_jobformats.summary import dry_run_summary
from oneplus_placement import place_gang
from oneplus_placement.snapshot import ClusterState
from oneplus_queueing.config import default_config
from placement_boards import preset_cluster
from pydantic import ValidationError

H100 = "h100_sxm_8gpu_nvswitch_nv18"


def job(gpus: int = 1, ranks: int = 1, **where: object) -> JobSpec:
    return JobSpec.model_validate({"name": "j", "ranks": ranks, "resources": {"gpus": gpus}, **where})


def state() -> ClusterState:
    return ClusterState.from_cluster(preset_cluster(H100, 4))  # node-00..node-03


def test_nodelist_keeps_the_job_to_the_named_nodes() -> None:
    got = place_gang(state(), job(1, nodelist="node-0[2-3]"))
    assert got.allocation is not None and got.allocation.nodes == ["node-02"]
    gang = place_gang(state(), job(8, ranks=2, nodelist=["node-01", "node-03"]))
    assert gang.allocation is not None and sorted(gang.allocation.nodes) == ["node-01", "node-03"]


def test_exclude_keeps_the_job_off_the_named_nodes() -> None:
    got = place_gang(state(), job(8, ranks=2, exclude_nodes="node-00,node-02"))
    assert got.allocation is not None and sorted(got.allocation.nodes) == ["node-01", "node-03"]


def test_too_few_allowed_nodes_waits_and_says_which_nodes() -> None:
    got = place_gang(state(), job(8, ranks=2, nodelist="node-00"))
    assert got.allocation is None and got.explanation is not None
    assert "on nodes node-00" in got.explanation.message


def test_a_nodelist_of_no_cluster_node_is_explained() -> None:
    got = place_gang(state(), job(1, nodelist="zz1"))
    assert got.allocation is None and got.explanation is not None
    assert got.explanation.constraint == "nodelist" and "zz1" in got.explanation.message


@pytest.mark.parametrize(
    ("where", "says"),
    [
        ({"nodelist": "bad name"}, "'bad name' is not a node name"),
        ({"nodelist": "n[3-1]"}, "bad range '3-1'"),
        ({"exclude_nodes": ["ok", "no/slash"]}, "'no/slash' is not a node name"),
        ({"nodelist": "n1", "exclude_nodes": "n1"}, "node 'n1' is both in nodelist and exclude_nodes"),
    ],
)
def test_bad_host_names_are_refused_by_name(where: dict[str, object], says: str) -> None:
    with pytest.raises(ValidationError, match=says.replace("[", r"\[")):
        job(**where)


def test_the_intake_refuses_a_node_the_cluster_does_not_have() -> None:
    nodes = [NodeRecord(topology=t) for t in preset_cluster(H100, 2).nodes]  # type: ignore[arg-type]
    says = r"--nodelist names node 'gpu9', which this cluster does not have \(it has node-\[00-01\]\)"
    with pytest.raises(Inadmissible, match=says):
        admit(job(nodelist="node-00,gpu9"), default_config(), nodes, EmptyCluster())
    with pytest.raises(Inadmissible, match="--exclude names node 'x'"):
        admit(job(exclude_nodes="x"), default_config(), nodes, EmptyCluster())
    admit(job(nodelist="node-01"), default_config(), nodes, EmptyCluster())
    with pytest.raises(Inadmissible, match="can never run"):
        admit(job(8, ranks=2, nodelist="node-01"), default_config(), nodes, EmptyCluster())


def test_sbatch_w_x_and_the_dry_run_show_them() -> None:
    tr = parse_sbatch("#!/bin/bash\n#SBATCH -w node-[00-01] --exclude=node-03 --gpus=1\necho\n")
    assert tr.spec.nodelist == ["node-00", "node-01"] and tr.spec.exclude_nodes == ["node-03"]
    assert not tr.warnings
    summary = dry_run_summary(tr.spec, tr.warnings)
    assert summary["nodelist"] == ["node-00", "node-01"] and summary["exclude_nodes"] == ["node-03"]
