"""Kubeflow elastic ranges (PyTorchJob elasticPolicy, TrainJob's runtime torch.elasticPolicy) become elastic gangs."""

from __future__ import annotations

from pathlib import Path

import pytest
from oneplus_contracts import ElasticRange, JobSpec, LaunchRanks, RankPlacement, RankResources
from oneplus_jobformats import JobFormatError, dry_run_summary, load_job_document
from oneplus_node_executor.runtime.environment import rank_environment
from pydantic import ValidationError

SAMPLES = Path(__file__).resolve().parent / "samples"

RUNTIME = """apiVersion: trainer.kubeflow.org/v1alpha1
kind: TrainingRuntime
metadata: {name: torch-elastic}
spec:
  mlPolicy:
    numNodes: 2
    torch:
      numProcPerNode: "8"
      elasticPolicy: {POLICY}
  template:
    spec:
      replicatedJobs:
        - name: node
          template:
            spec:
              template:
                spec:
                  containers:
                    - name: node
                      image: pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime
                      resources: {limits: {nvidia.com/gpu: 8}}
---
apiVersion: trainer.kubeflow.org/v1alpha1
kind: TrainJob
metadata: {name: elastic-train}
spec:
  runtimeRef: {name: torch-elastic}
"""


def _launch(spec: JobSpec, nodes: list[str]) -> LaunchRanks:
    """The launch on the first node of a gang placed with one rank on each of `nodes`."""
    first = RankPlacement(rank=0, node=nodes[0], gpus=[0], cpus=spec.resources.cpus, memory_mb=spec.resources.memory_mb)
    return LaunchRanks(
        job_id="job-1", node=nodes[0], token=1, spec=spec, ranks=[first], world_size=len(nodes),
        master_addr="10.0.0.1", master_port=29500, nodes=nodes, node_rank=0,
    )  # fmt: skip


def test_a_pytorchjob_elastic_policy_is_an_elastic_gang_asking_its_maximum() -> None:
    tr = load_job_document((SAMPLES / "public" / "pytorchjob_elastic_imagenet.yaml").read_text(), filename="j.yaml")
    assert tr.spec.elastic == ElasticRange(min_ranks=1, max_ranks=3)
    assert tr.spec.ranks == 3 and tr.spec.env["PET_NNODES"] == "1:3"
    assert any(
        w.startswith("spec.elasticPolicy: elastic: OnePlus starts the most Worker replicas from 1 to 3")
        for w in tr.warnings
    )
    shown = dry_run_summary(tr.spec, tr.warnings, kind=tr.kind)
    assert shown["elastic"] == {"min_ranks": 1, "max_ranks": 3}
    assert any(n.startswith("elastic gang: starts with the most ranks from 1 to 3") for n in shown["resource_notes"])


def test_a_master_replica_stays_beside_the_elastic_workers() -> None:
    text = (SAMPLES / "pytorchjob_kueue.yaml").read_text()  # 1 Master, 3 Workers
    text = text.replace(
        "spec:\n  runPolicy:", "spec:\n  elasticPolicy:\n    minReplicas: 2\n    maxReplicas: 6\n  runPolicy:", 1
    )
    spec = load_job_document(text, filename="j.yaml").spec
    assert (spec.elastic, spec.ranks) == (ElasticRange(min_ranks=3, max_ranks=7), 7)


def test_equal_bounds_are_a_fixed_gang() -> None:
    tr = load_job_document((SAMPLES / "public" / "pytorchjob_elastic_echo.yaml").read_text(), filename="j.yaml")
    assert tr.spec.elastic == ElasticRange(min_ranks=1, max_ranks=2)
    fixed = (
        (SAMPLES / "public" / "pytorchjob_elastic_echo.yaml").read_text().replace("minReplicas: 1", "minReplicas: 2")
    )
    spec = load_job_document(fixed, filename="j.yaml").spec
    assert spec.elastic is None and spec.ranks == 2
    assert dry_run_summary(spec, [])["elastic"] is None


def test_min_replicas_above_max_replicas_is_refused_naming_both() -> None:
    text = (SAMPLES / "public" / "pytorchjob_elastic_echo.yaml").read_text().replace("minReplicas: 1", "minReplicas: 5")
    with pytest.raises(JobFormatError) as err:
        load_job_document(text, filename="j.yaml")
    line = str(err.value)
    assert "\n" not in line.strip()
    assert "spec.elasticPolicy.minReplicas: must not be more than maxReplicas (minReplicas=5 > maxReplicas=2)" in line


def test_a_trainjob_runtime_elastic_policy_is_an_elastic_gang_that_meets_by_rendezvous() -> None:
    tr = load_job_document(RUNTIME.replace("{POLICY}", "{minNodes: 2, maxNodes: 4, maxRestarts: 3}"), filename="t.yaml")
    spec = tr.spec
    assert spec.elastic == ElasticRange(min_ranks=2, max_ranks=4) and spec.ranks == 4
    env = rank_environment(_launch(spec, ["a", "b", "c"]), None)[0]
    # Placed with 3 of 4: torchrun gets the range, the endpoint at rank 0, and a world of 3 nodes.
    assert (env["PET_NNODES"], env["PET_RDZV_BACKEND"], env["PET_MAX_RESTARTS"]) == ("2:4", "c10d", "3")
    assert env["PET_RDZV_ENDPOINT"] == "10.0.0.1:29500" and env["WORLD_SIZE"] == "3"


def test_a_trainjob_min_nodes_above_max_nodes_is_refused() -> None:
    with pytest.raises(JobFormatError, match=r"minNodes: must not be more than maxNodes \(minNodes=5 > maxNodes=4\)"):
        load_job_document(RUNTIME.replace("{POLICY}", "{minNodes: 5, maxNodes: 4}"), filename="t.yaml")


def test_a_native_spec_with_min_above_max_is_refused_in_one_line() -> None:
    with pytest.raises(ValidationError, match=r"elastic.min_ranks=4 is more than max_ranks=2"):
        JobSpec(name="x", resources=RankResources(gpus=1), ranks=2, elastic={"min_ranks": 4, "max_ranks": 2})
    with pytest.raises(ValidationError, match=r"ranks=5 is outside elastic 1..4"):
        JobSpec(name="x", resources=RankResources(gpus=1), ranks=5, elastic={"min_ranks": 1, "max_ranks": 4})
    plain = JobSpec(name="x", resources=RankResources(gpus=1))
    assert "elastic" not in plain.model_dump(mode="json")  # unset: left out of every stored record


def test_a_heterogeneous_job_that_is_also_elastic_is_refused_in_one_line() -> None:
    one = {"ranks": 1, "resources": {"gpus": 1}}
    two = {"ranks": 2, "resources": {"gpus": 4}}
    with pytest.raises(ValidationError) as err:
        JobSpec.model_validate(
            {
                "name": "het-elastic",
                "ranks": 3,
                "resources": one["resources"],
                "components": [one, two],
                "elastic": {"min_ranks": 2, "max_ranks": 3},
            }
        )
    assert "a heterogeneous job cannot be elastic" in str(err.value)
