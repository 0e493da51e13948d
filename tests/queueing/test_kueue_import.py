"""Kueue's ClusterQueue / LocalQueue / ResourceFlavor / Cohort / WorkloadPriorityClass as OnePlus queues: quotas,
borrowing limits, flavors as GPU models, LocalQueues as the leaves Kueue jobs name; bad input one line per problem."""

from __future__ import annotations

from pathlib import Path

import pytest
from oneplus_contracts import JobSpec
from oneplus_queueing import QueueConfigError, load_queue_config
from oneplus_queueing.kueue import model_of
from oneplus_queueing.queuefile import dump_queue_config, load_queue_file

SAMPLES = Path(__file__).parent / "samples"


def load(name: str):  # type: ignore[no-untyped-def]
    path = SAMPLES / name
    return load_queue_file(path.read_text(), filename=name)


def job(queue: str, **resources: object) -> JobSpec:
    return JobSpec.model_validate({"name": "j", "queue": queue, "resources": {"gpus": 1, **resources}})


def test_kueues_first_sample_gives_user_queue_under_its_cluster_queue() -> None:
    q = load("kueue_single_clusterqueue.yaml")
    assert q.kind == "kueue"
    cfg = q.config
    assert cfg.path("user-queue") == ("cluster-queue", "user-queue")
    assert cfg.is_leaf("user-queue") and not cfg.is_leaf("cluster-queue")
    cq = cfg.queue("cluster-queue")
    assert (cq.guarantee_gpus, cq.borrow_limit_gpus) == (16, 0)  # no cohort: Kueue cannot borrow
    cfg.validate_job(job("user-queue"))  # a Kueue job's queue-name label finds its queue
    cfg.validate_job(job("default"))  # and jobs naming no queue still have theirs
    assert "spec.namespaceSelector: not used by OnePlus" in "\n".join(q.notes)
    assert any("quotas of cpu, memory: not used by OnePlus" in n for n in q.notes)
    assert all(n.startswith("kueue_single_clusterqueue.yaml: document ") for n in q.notes)
    assert load_queue_config(q.yaml_text) == cfg  # what is stored reads back the same


def test_cohorts_borrowing_limits_strategies_weights_flavors_and_priority_classes() -> None:
    cfg = load("kueue_cohort_flavors.yaml").config
    research, a, b = cfg.queue("research"), cfg.queue("team-a"), cfg.queue("team-b")
    assert research.parent is None and a.parent == b.parent == "research"
    assert research.guarantee_gpus == 4 + 8 + 8  # its own quota and its members'
    assert (a.guarantee_gpus, a.borrow_limit_gpus, a.weight, a.queueing) == (8, 4, 2, "strict-fifo")
    assert (b.guarantee_gpus, b.borrow_limit_gpus) == (8, None)  # in a cohort with no borrowingLimit: no limit
    assert cfg.queue("a-queue").queueing == "strict-fifo"
    assert cfg.queue_models("a-queue") == ["H100"] and cfg.queue_models("b-queue") == ["A100"]
    assert cfg.queue_models("default") is None
    assert cfg.priority_classes["high"].value == 1000
    # A job naming no model gets its queue's flavor; one naming another model is refused, naming both.
    assert cfg.with_queue_models(job("b-queue")).resources.gpu_models == ["A100"]
    assert cfg.with_queue_models(job("b-queue", gpu_models=["A100-SXM4-80GB"])).resources.gpu_models == [
        "A100-SXM4-80GB"
    ]
    with pytest.raises(QueueConfigError, match=r"queue 'a-queue' runs on GPU models \['H100'\]; the job asks for"):
        cfg.with_queue_models(job("a-queue", gpu_models=["L40S"]))
    assert cfg.with_queue_models(job("default")).resources.gpu_models is None


def test_flavor_models_from_node_labels_or_names() -> None:
    assert model_of("x", {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}) == "H100"
    assert model_of("x", {"cloud.google.com/gke-accelerator": "nvidia-l40s"}) == "L40S"
    assert model_of("a100-80g", {}) == "A100"
    assert model_of("default-flavor", {"topology": "rack-1"}) is None


def test_a_cluster_queue_without_a_gpu_quota_does_not_limit_gpus() -> None:
    text = (SAMPLES / "kueue_single_clusterqueue.yaml").read_text().replace(', "nvidia.com/gpu"', "")
    text = text.replace('      - name: "nvidia.com/gpu"\n        nominalQuota: 16\n', "")
    q = load_queue_file(text, filename="q.yaml")
    assert q.config.queue("cluster-queue").borrow_limit_gpus is None
    assert any("covers no GPU resource" in n for n in q.notes)


BAD = [
    ("queues: [{name: a\n", "q.yaml: not valid YAML: line 2, column 1: "),
    (
        "apiVersion: kueue.x-k8s.io/v1beta1\nkind: ClusterQueue\nmetadata: {name: cq}\nspec: {cohrt: x}\n",
        "q.yaml: document 1 (ClusterQueue cq): spec.cohrt: unknown field (a ClusterQueue's spec has",
    ),
    (
        "apiVersion: kueue.x-k8s.io/v1beta1\nkind: LocalQueue\nmetadata: {name: lq}\nspec: {clusterQueue: nope}\n",
        "q.yaml: document 1 (LocalQueue lq): spec.clusterQueue: 'nope' is not a ClusterQueue of this file "
        "(it has none)",
    ),
    (
        "apiVersion: kueue.x-k8s.io/v1beta1\nkind: Workload\nmetadata: {name: w}\n",
        "q.yaml: document 1 (Workload w): kind 'Workload': not one OnePlus imports",
    ),
    (
        "apiVersion: kueue.x-k8s.io/v1beta1\nkind: ResourceFlavor\nmetadata: {name: f}\n---\n"
        "apiVersion: kueue.x-k8s.io/v1beta1\nkind: ClusterQueue\nmetadata: {name: cq}\nspec:\n  resourceGroups:\n"
        "  - coveredResources: [nvidia.com/gpu]\n    flavors: [{name: f, resources: [{name: nvidia.com/gpu, "
        "nominalQuota: lots}]}]\n",
        "q.yaml: document 2 (ClusterQueue cq): spec.resourceGroups[0].flavors[0].resources[0].nominalQuota: 'lots' is "
        "not a number of GPUs",
    ),
    ("queues: [{name: a, guarantee: 3}]\n", "q.yaml: invalid queue config: queues.0.guarantee: Extra inputs"),
    ("apiVersion: v1\nkind: ConfigMap\n", "q.yaml: apiVersion 'v1' is not Kueue's"),
    ("", "q.yaml: empty"),
]


@pytest.mark.parametrize(("text", "start"), BAD)
def test_bad_files_are_one_line_per_problem_naming_the_file_and_field(text: str, start: str) -> None:
    with pytest.raises(QueueConfigError) as exc:
        load_queue_file(text, filename="q.yaml")
    message = str(exc.value)
    assert message.startswith(start), message
    assert "\n" not in message


def test_every_problem_of_a_file_is_its_own_line() -> None:
    text = (
        "apiVersion: kueue.x-k8s.io/v1beta1\nkind: ClusterQueue\nmetadata: {name: cq, colour: red}\n"
        "spec: {cohrt: x, queueingStrategy: Random}\nextra: 1\n"
    )
    with pytest.raises(QueueConfigError) as exc:
        load_queue_file(text, filename="q.yaml")
    lines = str(exc.value).splitlines()
    assert len(lines) == 4, lines
    assert all(line.startswith("q.yaml: document 1 (ClusterQueue cq): ") for line in lines)
    joined = "\n".join(lines)
    for what in ("extra: unknown field", "metadata.colour: unknown field", "spec.cohrt: unknown field", "'Random'"):
        assert what in joined


def test_a_oneplus_config_reads_as_itself_and_dumps_back() -> None:
    text = "queues:\n  - {name: research, guarantee_gpus: 8}\n  - {name: nlp, parent: research, gpu_models: [H100]}\n"
    q = load_queue_file(text, filename="q.yaml")
    assert q.kind == "oneplus" and q.yaml_text == text and q.notes == []
    assert load_queue_config(dump_queue_config(q.config)) == q.config


def test_the_same_local_queue_name_in_two_namespaces_is_refused_naming_it() -> None:
    text = (SAMPLES / "kueue_single_clusterqueue.yaml").read_text()
    text += (
        "---\napiVersion: kueue.x-k8s.io/v1beta1\nkind: LocalQueue\nmetadata: {namespace: other, name: user-queue}\n"
    )
    text += "spec: {clusterQueue: cluster-queue}\n"
    with pytest.raises(QueueConfigError) as exc:
        load_queue_file(text, filename="q.yaml")
    assert str(exc.value) == (
        "q.yaml: document 4 (LocalQueue user-queue): metadata.name: 'user-queue' is already a queue of this file "
        "(names are one namespace here)"
    )
