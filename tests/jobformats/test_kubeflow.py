"""Kubeflow manifests (the real examples in data/manifests and the documented forms) become the right gang."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from oneplus_jobformats import JobFormatError, load_job_document

MANIFESTS = Path(__file__).resolve().parents[2] / "data" / "manifests"
SAMPLES = Path(__file__).resolve().parent / "samples"  # written for these tests from the documented forms


def load(name: str):
    path = MANIFESTS / name
    return load_job_document(path.read_text(), filename=str(path))


def from_yaml(text: str):
    return load_job_document(text, filename="job.yaml")


def test_pytorchjob_mnist_nccl_has_two_one_gpu_ranks_from_master_and_worker():
    tr = load("pytorchjob_mnist_nccl.yaml")
    assert tr.kind == "PyTorchJob"
    assert tr.spec.name == "pytorch-dist-mnist-nccl"
    assert (tr.spec.ranks, tr.spec.resources.gpus, tr.spec.total_gpus) == (2, 1.0, 2.0)
    assert tr.spec.command == ["--backend", "nccl"]
    assert tr.spec.image == "gcr.io/<your_project>/pytorch_dist_mnist:latest"
    assert tr.spec.restart_policy == "OnFailure"
    assert (tr.spec.queue, tr.spec.priority) == ("default", 0)


def test_pytorchjob_mnist_nccl_names_the_istio_annotations_it_ignores():
    tr = load("pytorchjob_mnist_nccl.yaml")
    for role in ("Master", "Worker"):
        path = f'spec.pytorchReplicaSpecs.{role}.template.metadata.annotations["sidecar.istio.io/inject"]'
        assert any(w.startswith(path) for w in tr.warnings), tr.warnings


def test_pytorchjob_simple_without_gpus_is_accepted_with_a_share_and_a_warning():
    tr = load("pytorchjob_simple.yaml")
    assert tr.spec.ranks == 2
    assert tr.spec.resources.gpus == pytest.approx(0.001)
    assert tr.spec.team == "kubeflow"  # the namespace is the team
    assert tr.spec.pull_policy == "Always"
    # Kubernetes `command` replaces the image's ENTRYPOINT; there are no `args`, so no CMD either.
    assert tr.spec.entrypoint == ["python3", "/opt/mnist/src/mnist.py", "--epochs=1"]
    assert tr.spec.command == []
    assert tr.spec.framework == "pytorchjob"
    assert any("asks for no GPU" in w for w in tr.warnings)


def test_mpijob_pi_counts_workers_not_the_launcher_and_reports_unused_fields():
    tr = load("mpijob_pi.yaml")
    assert tr.kind == "MPIJob"
    assert tr.spec.ranks == 2
    assert tr.spec.resources.cpus == 1.0
    assert tr.spec.resources.memory_mb == 1024
    assert tr.spec.labels["training.kubeflow.org/retry-count-limit"] == "3"
    joined = "\n".join(tr.warnings)
    for field in (
        "spec.mpiReplicaSpecs.Launcher",
        "spec.runPolicy.cleanPodPolicy",
        "spec.runPolicy.ttlSecondsAfterFinished",
        "spec.runPolicy.backoffLimit",
        "spec.sshAuthMountPath",
        "spec.mpiReplicaSpecs.Worker.template.spec.containers[0].securityContext.runAsUser",
    ):
        assert field in joined, field
    # mpi-operator v2: the launcher runs mpirun once the workers are up, with slotsPerWorker in its hostfile.
    launcher = tr.spec.launcher
    assert launcher is not None
    assert (launcher.image, launcher.entrypoint, launcher.command) == (
        "mpioperator/mpi-pi:openmpi",
        ["mpirun"],
        ["-n", "2", "/unknown"],
    )
    assert launcher.slots_per_worker == 1
    assert "the launcher's CPU and memory are not reserved" in joined


NCCL_TESTS = (SAMPLES / "mpijob_nccl_tests.yaml").read_text()


def test_mpijob_nccl_tests_gives_two_eight_gpu_ranks_and_the_deadline():
    tr = from_yaml(NCCL_TESTS)
    assert (tr.spec.ranks, tr.spec.resources.gpus, tr.spec.total_gpus) == (2, 8.0, 16.0)
    assert tr.spec.time_limit_s == 666
    assert not any("slotsPerWorker" in w for w in tr.warnings)  # 8 slots = 8 GPUs per worker: consistent


def test_mpijob_slots_per_worker_are_the_hostfile_slots_whatever_the_gpus():
    tr = from_yaml(NCCL_TESTS.replace("slotsPerWorker: 8", "slotsPerWorker: 4"))
    assert tr.spec.launcher is not None and tr.spec.launcher.slots_per_worker == 4
    assert not any(w.startswith("spec.slotsPerWorker") for w in tr.warnings)  # as mpi-operator: slots are the user's


def test_mpijob_v1_training_operator_form_uses_main_container():
    text = """
apiVersion: kubeflow.org/v1
kind: MPIJob
metadata: {name: mpi-v1}
spec:
  slotsPerWorker: 4
  cleanPodPolicy: Running
  mainContainer: trainer
  mpiReplicaSpecs:
    Worker:
      replicas: 3
      template:
        spec:
          containers:
          - {name: sidecar, image: busybox}
          - name: trainer
            image: horovod:latest
            resources: {limits: {nvidia.com/gpu: 4, cpu: "16", memory: 64Gi}}
"""
    tr = from_yaml(text)
    assert (tr.spec.ranks, tr.spec.resources.gpus) == (3, 4.0)
    assert tr.spec.resources.cpus == 16.0
    assert tr.spec.resources.memory_mb == 64 * 1024
    assert tr.spec.image == "horovod:latest"
    joined = "\n".join(tr.warnings)
    assert "spec.mpiReplicaSpecs.Worker.template.spec.containers[0].name" in joined  # the sidecar is named
    assert "spec.cleanPodPolicy" in joined


KUEUE_PYTORCHJOB = (SAMPLES / "pytorchjob_kueue.yaml").read_text()


def test_kueue_labels_set_queue_and_priority_and_win_over_scheduling_policy():
    tr = from_yaml(KUEUE_PYTORCHJOB)
    spec = tr.spec
    assert (spec.queue, spec.priority, spec.priority_class) == ("user-queue", 10_000, "high")
    assert (spec.ranks, spec.resources.gpus, spec.total_gpus) == (4, 8.0, 32.0)
    assert spec.team == "team-nlp"
    assert spec.resources.gpu_models == ["NVIDIA H100 80GB HBM3"]
    assert (spec.topology.domain, spec.topology.mode) == ("leaf", "required")
    assert spec.env == {"EPOCHS": "3"}
    joined = "\n".join(tr.warnings)
    assert "spec.runPolicy.schedulingPolicy.queue: differs from the Kueue label" in joined
    assert "spec.runPolicy.schedulingPolicy.priorityClass: differs" in joined
    assert "spec.runPolicy.suspend" in joined
    assert "env[1].valueFrom" in joined
    assert "resources.requests.ephemeral-storage: not used" in joined


def test_scheduling_policy_queue_and_priority_class_are_used_without_kueue_labels():
    text = KUEUE_PYTORCHJOB.replace("    kueue.x-k8s.io/queue-name: user-queue\n", "").replace(
        "    kueue.x-k8s.io/priority-class: high\n", ""
    )
    spec = from_yaml(text).spec
    assert (spec.queue, spec.priority, spec.priority_class) == ("other-queue", 100, "low")


def test_min_available_below_ranks_is_a_warning_and_above_ranks_an_error():
    tr = from_yaml(KUEUE_PYTORCHJOB.replace("minAvailable: 4", "minAvailable: 2"))
    assert any("minAvailable=2 is not used" in w for w in tr.warnings)
    with pytest.raises(JobFormatError, match=r"schedulingPolicy\.minAvailable: 9 is more than the job's 4 ranks"):
        from_yaml(KUEUE_PYTORCHJOB.replace("minAvailable: 4", "minAvailable: 9"))


def test_replica_types_with_different_gpus_give_every_rank_the_largest_and_say_so():
    text = KUEUE_PYTORCHJOB.replace("limits: {nvidia.com/gpu: 8, cpu", "limits: {nvidia.com/gpu: 4, cpu")
    tr = from_yaml(text)
    assert tr.spec.resources.gpus == 8.0
    assert any("replica types ask for different resources" in w for w in tr.warnings)


TRAINJOB = (SAMPLES / "trainjob_multi_node.yaml").read_text()


def test_trainjob_from_the_interfaces_example_has_three_one_gpu_nodes():
    tr = from_yaml(TRAINJOB)
    spec = tr.spec
    assert tr.kind == "TrainJob"
    assert (spec.ranks, spec.resources.gpus, spec.resources.cpus, spec.resources.memory_mb) == (3, 1.0, 4.0, 8192)
    assert spec.queue == "user-queue"
    assert spec.entrypoint is not None and spec.entrypoint[0] == "torchrun"
    assert spec.framework == "trainjob"
    assert spec.env["PET_NPROC_PER_NODE"] == "1"
    assert spec.labels["trainer.kubeflow.org/runtime"] == "torch-distributed"
    assert any("no image" in w for w in tr.warnings)


def test_trainjob_without_num_nodes_runs_one_node_and_warns():
    tr = from_yaml(TRAINJOB.replace("    numNodes: 3\n", ""))
    assert tr.spec.ranks == 1
    assert any("numNodes is not set" in w for w in tr.warnings)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (("replicas: 3", "replicas: -1"), r"spec\.pytorchReplicaSpecs\.Worker\.replicas: must be >= 0"),
        (("replicas: 3", "replicas: many"), r"spec\.pytorchReplicaSpecs\.Worker\.replicas: must be a whole number"),
        (
            ("limits: {nvidia.com/gpu: 8, cpu", "limits: {nvidia.com/gpu: 0.5, cpu"),
            r'Worker\.template\.spec\.containers\[0\]\.resources\.limits\["nvidia\.com/gpu"\]: .*whole number',
        ),
        (("memory: 200Gi}}", "memory: lots}}"), r"limits\.memory: .*not a Kubernetes quantity"),
        (("Worker:", "Chief:"), r"spec\.pytorchReplicaSpecs\.Chief: unknown replica type"),
        (("priority-class: high", "priority-class: whenever"), r'priority-class"\]: unknown priority class'),
        (("name: llama-ft", "name: _bad name"), r"metadata\.name: .*must be 1-128 letters"),
    ],
)
def test_bad_manifests_name_the_field_and_the_problem(edit, message):
    with pytest.raises(JobFormatError, match=message) as info:
        from_yaml(KUEUE_PYTORCHJOB.replace(*edit))
    assert str(info.value).startswith("job.yaml: ")


def test_gpu_request_that_differs_from_the_limit_is_an_error():
    text = KUEUE_PYTORCHJOB.replace("limits: {nvidia.com/gpu: 8}\n", "limits: {nvidia.com/gpu: 4}\n")
    with pytest.raises(JobFormatError, match="differs from limit 4"):
        from_yaml(text)


def test_unknown_kind_lists_what_is_supported():
    with pytest.raises(JobFormatError, match=r"unsupported manifest kind 'TFJob'.*PyTorchJob \(kubeflow.org/v1\)"):
        from_yaml("apiVersion: kubeflow.org/v1\nkind: TFJob\nmetadata: {name: x}\nspec: {}\n")


def test_every_field_of_a_manifest_is_either_used_or_named():
    """Adding any unknown field anywhere in a manifest makes a warning that names exactly that field."""
    doc = yaml.safe_load(NCCL_TESTS)
    doc["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["tolerations"] = [{"key": "gpu"}]
    doc["spec"]["runPolicy"]["schedulingPolicy"] = {"scheduleTimeoutSeconds": 30}
    doc["metadata"]["annotations"] = {"team": "x"}
    tr = load_job_document(yaml.safe_dump(doc), filename="x.yaml")
    joined = "\n".join(tr.warnings)
    assert "spec.mpiReplicaSpecs.Worker.template.spec.tolerations: not used" in joined
    assert "spec.runPolicy.schedulingPolicy.scheduleTimeoutSeconds: not used" in joined
    assert "metadata.annotations.team: not used" in joined
