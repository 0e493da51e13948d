"""What each rank of a PyTorchJob or TrainJob gets (issue 13, item 2): the training operator's variables, Kubernetes
`command`/`args` as ENTRYPOINT/CMD, and a runtime + TrainJob file as `kubectl apply -f` takes it.

Inputs: `data/manifests/pytorchjob_mnist_nccl.yaml` (kubeflow/training-operator, Apache-2.0, see data/README.md),
`samples/trainjob_multi_node.yaml` and `samples/multi_document/trainjob_with_runtime.yaml` (written for these
tests from Kubeflow Trainer's documented `01-multi-node` TrainJob and its `torch-distributed`
ClusterTrainingRuntime, Apache-2.0).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from oneplus_contracts import LaunchRanks, RankPlacement
from oneplus_jobformats import JobFormatError, load_job_document
from oneplus_node_executor.runtime.environment import rank_environment

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = Path(__file__).resolve().parent / "samples"


def _launch(spec, node_of_rank: list[str], node: str) -> LaunchRanks:  # type: ignore[no-untyped-def]
    nodes = list(dict.fromkeys(node_of_rank))
    ranks = [
        RankPlacement(rank=r, node=n, gpus=[0], cpus=spec.resources.cpus, memory_mb=spec.resources.memory_mb)
        for r, n in enumerate(node_of_rank)
        if n == node
    ]
    return LaunchRanks(
        job_id="job-1",
        node=node,
        token=1,
        spec=spec,
        ranks=ranks,
        world_size=len(node_of_rank),
        master_addr="10.0.0.1",
        master_port=29500,
        nodes=nodes,
        node_rank=nodes.index(node),
    )


def test_pytorchjob_every_replica_gets_the_operator_variables() -> None:
    path = ROOT / "data" / "manifests" / "pytorchjob_mnist_nccl.yaml"
    spec = load_job_document(path.read_text(), filename=str(path)).spec
    assert spec.framework == "pytorchjob"
    env = {}
    for node in ("a", "b"):
        env.update(rank_environment(_launch(spec, ["a", "b"], node), None))
    for rank in (0, 1):
        e = env[rank]
        assert (e["RANK"], e["WORLD_SIZE"], e["MASTER_ADDR"], e["MASTER_PORT"]) == (str(rank), "2", "10.0.0.1", "29500")
        assert (e["PET_NNODES"], e["PET_NODE_RANK"], e["PET_NPROC_PER_NODE"]) == ("2", str(rank), "auto")
        assert (e["PET_MASTER_ADDR"], e["PET_MASTER_PORT"]) == ("10.0.0.1", "29500")


def test_pytorchjob_numeric_nproc_per_node_scales_world_size() -> None:
    text = (
        (SAMPLES / "pytorchjob_kueue.yaml")
        .read_text()
        .replace("spec:\n  runPolicy:", "spec:\n  nprocPerNode: '8'\n  runPolicy:", 1)
    )
    spec = load_job_document(text, filename="j.yaml").spec
    env = rank_environment(_launch(spec, ["a", "a", "b", "b"], "b"), None)
    assert env[3]["PET_NPROC_PER_NODE"] == "8" and env[3]["WORLD_SIZE"] == "32" and env[3]["PET_NODE_RANK"] == "3"


def test_bad_nproc_per_node_is_refused() -> None:
    text = (
        (SAMPLES / "pytorchjob_kueue.yaml")
        .read_text()
        .replace("spec:\n  runPolicy:", "spec:\n  nprocPerNode: lots\n  runPolicy:", 1)
    )
    with pytest.raises(JobFormatError, match=r"spec\.nprocPerNode: must be auto, cpu, gpu or a positive number"):
        load_job_document(text, filename="j.yaml")


def test_trainjob_three_nodes_meet_at_rank_0() -> None:
    spec = load_job_document((SAMPLES / "trainjob_multi_node.yaml").read_text(), filename="t.yaml").spec
    env = rank_environment(_launch(spec, ["a", "b", "c"], "c"), None)[2]
    assert (env["PET_NNODES"], env["PET_NODE_RANK"], env["PET_NPROC_PER_NODE"]) == ("3", "2", "1")
    assert env["PET_MASTER_ADDR"] == env["MASTER_ADDR"] == "10.0.0.1"
    assert spec.entrypoint == ["torchrun", "--no-python", "python3", "-c", "print(1)"] and spec.command == []


def test_a_job_without_framework_gets_no_pet_variables() -> None:
    spec = load_job_document("name: x\nresources: {gpus: 1}\n", filename="x.yaml").spec
    env = rank_environment(_launch(spec, ["a"], "a"), None)[0]
    assert not any(k.startswith("PET_") for k in env)


def test_runtime_plus_trainjob_in_one_file() -> None:
    tr = load_job_document((SAMPLES / "multi_document" / "trainjob_with_runtime.yaml").read_text(), filename="rt.yaml")
    spec = tr.spec
    assert tr.kind == "TrainJob" and spec.framework == "trainjob"
    assert spec.ranks == 2  # the TrainJob's numNodes wins over the runtime's 1
    assert spec.image == "pytorch/pytorch:2.7.1-cuda12.8-cudnn9-runtime"  # from the runtime
    assert spec.env["PET_NPROC_PER_NODE"] == "auto"
    assert spec.resources.gpus == 1
    assert spec.entrypoint == ["torchrun", "/workspace/train.py"]


def test_several_documents_need_exactly_one_job() -> None:
    runtime = (SAMPLES / "multi_document" / "trainjob_with_runtime.yaml").read_text().split("\n---\n")[0]
    with pytest.raises(JobFormatError, match="with 0 jobs"):
        load_job_document(runtime + "\n---\n" + runtime, filename="f.yaml")
    job = (SAMPLES / "pytorchjob_kueue.yaml").read_text()
    with pytest.raises(JobFormatError, match=r"with 2 jobs \(document 1 \(PyTorchJob\), document 2 \(PyTorchJob\)\)"):
        load_job_document(job + "\n---\n" + job, filename="f.yaml")
    with pytest.raises(JobFormatError, match="document 2: expected a mapping"):
        load_job_document(job + "\n---\n- a\n", filename="f.yaml")
    tr = load_job_document(runtime + "\n---\n" + job, filename="f.yaml")
    assert any("only a TrainJob uses a training runtime" in w for w in tr.warnings)


def test_gpus_only_in_requests_are_refused_as_kubernetes_does() -> None:
    text = (
        (SAMPLES / "trainjob_multi_node.yaml")
        .read_text()
        .replace(
            'requests: {cpu: "4", memory: 8Gi}\n      limits: {nvidia.com/gpu: "1"}',
            'requests: {cpu: "4", memory: 8Gi, nvidia.com/gpu: "1"}',
        )
    )
    with pytest.raises(JobFormatError, match="Limit must be set for non overcommitable resources"):
        load_job_document(text, filename="t.yaml")


def test_request_reserves_and_limit_caps() -> None:
    base = (SAMPLES / "trainjob_multi_node.yaml").read_text()
    capped = base.replace('limits: {nvidia.com/gpu: "1"}', 'limits: {nvidia.com/gpu: "1", cpu: "8", memory: 16Gi}')
    r = load_job_document(capped, filename="t.yaml").spec.resources
    assert (r.cpus, r.cpu_limit, r.memory_mb, r.memory_limit_mb) == (4.0, 8.0, 8192, 16384)
    uncapped = load_job_document(base, filename="t.yaml").spec.resources
    assert (uncapped.cpu_limit, uncapped.memory_limit_mb) == (None, None)
    limit_only = base.replace('requests: {cpu: "4", memory: 8Gi}\n      ', "").replace(
        'limits: {nvidia.com/gpu: "1"}', 'limits: {nvidia.com/gpu: "1", cpu: "2"}'
    )
    r = load_job_document(limit_only, filename="t.yaml").spec.resources
    assert (r.cpus, r.cpu_limit) == (2.0, 2.0)  # a limit alone is also the request
    inverted = capped.replace('cpu: "8"', 'cpu: "2"')
    with pytest.raises(JobFormatError, match=r"requests\.cpu: request 4 is more than the limit 2"):
        load_job_document(inverted, filename="t.yaml")
    inverted_mem = capped.replace("memory: 16Gi", "memory: 1Gi")
    with pytest.raises(JobFormatError, match=r"requests\.memory: request 8192 MiB is more than the limit 1024 MiB"):
        load_job_document(inverted_mem, filename="t.yaml")


def _elastic(policy: str) -> str:
    text = (SAMPLES / "pytorchjob_kueue.yaml").read_text()
    return text.replace("spec:\n  runPolicy:", f"spec:\n  elasticPolicy:\n{policy}  runPolicy:", 1)


def test_elastic_policy_gives_the_operators_rendezvous_variables() -> None:
    policy = (
        "    rdzvBackend: c10d\n    minReplicas: 1\n    maxReplicas: 4\n    maxRestarts: 7\n    rdzvId: run-1\n"
        "    rdzvConf:\n    - {key: join_timeout, value: '600'}\n    - {key: last_call_timeout, value: '5'}\n"
    )
    tr = load_job_document(_elastic(policy), filename="j.yaml")
    env = rank_environment(_launch(tr.spec, ["a", "b"], "b"), None)[1]
    assert env["PET_RDZV_BACKEND"] == "c10d" and env["PET_RDZV_ENDPOINT"] == "10.0.0.1:29500"
    assert (env["PET_NNODES"], env["PET_MAX_RESTARTS"], env["PET_RDZV_ID"]) == ("1:4", "7", "run-1")
    assert env["PET_RDZV_CONF"] == "join_timeout=600,last_call_timeout=5"
    assert env["PET_NODE_RANK"] == "1" and env["PET_MASTER_ADDR"] == "10.0.0.1"
    assert any("grows when GPUs free up" in w and "PET_NNODES=1:4" in w for w in tr.warnings)
    # 1 Master beside the 1..4 Workers: an elastic gang of 2..5 ranks that asks its maximum.
    assert tr.spec.elastic is not None and (tr.spec.elastic.min_ranks, tr.spec.elastic.max_ranks, tr.spec.ranks) == (
        2,
        5,
        5,
    )


def test_elastic_policy_bounds_default_as_the_operator_defaults_them() -> None:
    # No bounds: min = max = the Worker replicas (3, beside 1 Master); one bound: the other is the same; the
    # backend defaults to c10d.
    for policy, nnodes in (
        ("    maxRestarts: 3\n", "3:3"),
        ("    maxReplicas: 5\n", "5:5"),
        ("    minReplicas: 2\n", "2:2"),
    ):
        spec = load_job_document(_elastic(policy), filename="j.yaml").spec
        env = rank_environment(_launch(spec, ["a", "b"], "a"), None)[0]
        assert env["PET_NNODES"] == nnodes
        assert env["PET_RDZV_BACKEND"] == "c10d" and env["PET_RDZV_ENDPOINT"] == "10.0.0.1:29500"
        assert ("PET_MAX_RESTARTS" in env) == ("maxRestarts" in policy)


@pytest.mark.parametrize(
    ("policy", "said"),
    [
        ("    rdzvBackend: zookeeper\n", r"rdzvBackend: must be one of c10d, etcd, etcd-v2"),
        ("    minReplicas: 3\n    maxReplicas: 2\n", r"minReplicas: must not be more than maxReplicas"),
        ("    maxRestarts: -1\n", r"maxRestarts: must be >= 0"),
    ],
)
def test_a_bad_elastic_policy_is_refused(policy: str, said: str) -> None:
    with pytest.raises(JobFormatError, match=said):
        load_job_document(_elastic(policy), filename="j.yaml")


def test_elastic_policy_rendezvous_host_and_port_are_named_as_unused() -> None:
    tr = load_job_document(_elastic("    rdzvHost: etcd-svc\n    rdzvPort: 2379\n"), filename="j.yaml")
    assert any(w.startswith("spec.elasticPolicy.rdzvHost: not used") for w in tr.warnings)
    assert any(w.startswith("spec.elasticPolicy.rdzvPort: not used") for w in tr.warnings)


def test_a_pytorchjob_without_elastic_policy_gets_no_rendezvous_variables() -> None:
    spec = load_job_document((SAMPLES / "pytorchjob_kueue.yaml").read_text(), filename="j.yaml").spec
    env = rank_environment(_launch(spec, ["a", "b"], "a"), None)[0]
    assert not any(k.startswith("PET_RDZV") for k in env) and env["PET_NNODES"] == "2"
