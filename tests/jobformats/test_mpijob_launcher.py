"""An MPIJob runs as mpi-operator v2 runs it (issue 13, item 2): the Worker replicas are the ranks, the Launcher runs
beside the first one once every worker runs, with `/etc/mpi/hostfile` listing the workers and their slots, and the job
ends with the launcher. Also: the site's default node share for jobs that set no CPU or memory (item 3).

Inputs: `samples/public/` (kubeflow/mpi-operator examples, unmodified, Apache-2.0; see its README) and
`data/manifests/mpijob_pi.yaml` (the OpenMPI pi example, Apache-2.0, see data/manifests/README.md).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from oneplus_contracts import JobSpec, LaunchRanks, RankPlacement
from oneplus_jobformats import JobFormatError, load_job_document
from oneplus_jobformats.site import SITE_FILE_ENV, SiteMapError, load_site
from oneplus_node_executor.runtime.container_spec import container_body, extra_hosts, launcher_body
from oneplus_node_executor.runtime.environment import (
    MPI_HOSTFILE,
    launcher_environment,
    mpi_hostfile,
    rank_environment,
)

ROOT = Path(__file__).resolve().parents[2]
PUBLIC = Path(__file__).resolve().parent / "samples" / "public"


def load(path: Path):  # type: ignore[no-untyped-def]
    return load_job_document(path.read_text(), filename=str(path))


def launch(spec: JobSpec, node_of_rank: list[str], node: str, hosts: dict[str, str] | None = None) -> LaunchRanks:
    nodes = list(dict.fromkeys(node_of_rank))
    return LaunchRanks(
        job_id="job-1",
        node=node,
        token=1,
        spec=spec,
        ranks=[RankPlacement(rank=r, node=n, gpus=[r]) for r, n in enumerate(node_of_rank) if n == node],
        world_size=len(node_of_rank),
        master_addr=nodes[0],
        master_port=29500,
        nodes=nodes,
        node_rank=nodes.index(node),
        ranks_per_node=[node_of_rank.count(n) for n in nodes],
        hosts=hosts or {},
    )


def test_the_pi_example_keeps_its_launcher_and_its_workers_become_the_ranks() -> None:
    tr = load(ROOT / "data" / "manifests" / "mpijob_pi.yaml")
    spec = tr.spec
    assert (spec.ranks, spec.framework) == (2, "mpijob")
    assert spec.entrypoint == ["/usr/sbin/sshd"] and spec.command[:1] == ["-De"]  # the workers: sshd, as given
    assert spec.launcher is not None
    assert (spec.launcher.entrypoint, spec.launcher.command) == (["mpirun"], ["-n", "2", "/unknown"])
    assert not any("launcher is not a rank" in w for w in tr.warnings)


def test_the_mpich_pi_example_a_null_command_is_unset_and_args_are_the_command() -> None:
    tr = load(PUBLIC / "mpijob_pi_mpich.yaml")
    spec = tr.spec
    assert spec.entrypoint is None  # `command:` with no value: the image's ENTRYPOINT stays, as in Kubernetes
    assert spec.command == ["/usr/sbin/sshd", "-De", "-f", "/home/mpiuser/.sshd_config"]
    assert spec.launcher is not None and spec.launcher.entrypoint is None
    assert spec.launcher.command == ["mpirun", "-n", "2", "/home/mpiuser/pi"]
    assert spec.launcher.image == "mpioperator/mpi-pi:mpich"
    assert not any("mpiImplementation" in w for w in tr.warnings)  # read: the launcher gets HYDRA_HOST_FILE too


def test_the_nccl_tests_example_gives_two_eight_gpu_workers_and_a_launcher_with_eight_slots_each() -> None:
    tr = load(PUBLIC / "mpijob_nccl_tests.yaml")
    spec = tr.spec
    assert (spec.ranks, spec.resources.gpus, spec.time_limit_s) == (2, 8.0, 666)
    assert spec.launcher is not None and spec.launcher.slots_per_worker == 8
    assert spec.launcher.entrypoint == ["/bin/bash", "-c"] and "all_reduce_perf" in spec.launcher.command[0]
    assert spec.launcher.env["OMPI_ALLOW_RUN_AS_ROOT"] == "1"
    assert "OMPI_ALLOW_RUN_AS_ROOT" not in spec.env  # the launcher's env is the launcher's
    joined = "\n".join(tr.warnings)
    assert "spec.mpiReplicaSpecs.Launcher.template.spec.containers[0].securityContext.privileged" in joined
    assert "the launcher's CPU and memory are not reserved" in joined


def test_the_hostfile_lists_each_workers_node_with_its_slots_as_mpi_operator_writes_it() -> None:
    spec = load(PUBLIC / "mpijob_nccl_tests.yaml").spec
    first = launch(spec, ["gpu-a", "gpu-b"], "gpu-a")
    assert mpi_hostfile(first) == "gpu-a slots=8\ngpu-b slots=8\n"
    # Two workers on one node are one line with their slots added (Open MPI reads a host once).
    assert mpi_hostfile(launch(spec, ["gpu-a", "gpu-a", "gpu-b"], "gpu-a")) == "gpu-a slots=16\ngpu-b slots=8\n"


def test_the_launcher_gets_the_operators_mpi_variables_and_the_workers_their_role() -> None:
    spec = load(PUBLIC / "mpijob_nccl_tests.yaml").spec
    cmd = launch(spec, ["gpu-a", "gpu-b"], "gpu-a")
    env = launcher_environment(cmd)
    assert env["OMPI_MCA_orte_default_hostfile"] == MPI_HOSTFILE == "/etc/mpi/hostfile"
    assert env["OMPI_MCA_orte_keep_fqdn_hostnames"] == "true"
    assert env["OMPI_MCA_orte_set_default_slots"] == "8"
    assert env["OMPI_MCA_plm_rsh_args"] == "-o ConnectionAttempts=10"
    assert "HYDRA_HOST_FILE" not in env and "I_MPI_HYDRA_HOST_FILE" not in env  # Open MPI's only
    assert (env["K_MPI_JOB_ROLE"], env["NVIDIA_VISIBLE_DEVICES"]) == ("launcher", "void")
    assert env["OMPI_ALLOW_RUN_AS_ROOT"] == "1"
    workers = rank_environment(cmd, None)
    assert workers[0]["K_MPI_JOB_ROLE"] == "worker" and "OMPI_ALLOW_RUN_AS_ROOT" not in workers[0]


@pytest.mark.parametrize(
    ("implementation", "line", "variables"),
    [
        ("MPICH", "gpu-a:1", {"HYDRA_HOST_FILE": MPI_HOSTFILE, "HYDRA_LAUNCH_EXTRA_ARGS": "-o ConnectionAttempts=10"}),
        (
            "Intel",
            "gpu-a:1",
            {
                "I_MPI_HYDRA_HOST_FILE": MPI_HOSTFILE,
                "I_MPI_HYDRA_BOOTSTRAP_EXEC_EXTRA_ARGS": "-o ConnectionAttempts=10",
                "I_MPI_PERHOST": "1",
            },
        ),
    ],
)
def test_intel_mpi_and_mpich_get_their_hostfile_form_and_variables(
    implementation: str, line: str, variables: dict[str, str]
) -> None:
    text = (PUBLIC / "mpijob_pi_mpich.yaml").read_text().replace("MPICH", implementation)
    spec = load_job_document(text, filename="pi.yaml").spec
    assert spec.launcher is not None and spec.launcher.implementation == implementation
    cmd = launch(spec, ["gpu-a", "gpu-b"], "gpu-a")
    assert mpi_hostfile(cmd) == f"{line}\ngpu-b:1\n"
    env = launcher_environment(cmd)
    assert {k: env[k] for k in variables} == variables
    assert not any(k.startswith("OMPI_MCA_") for k in env)


def test_the_launcher_container_has_no_gpu_and_the_workers_names_resolve() -> None:
    spec = load(PUBLIC / "mpijob_nccl_tests.yaml").spec
    cmd = launch(spec, ["gpu-a", "gpu-b"], "gpu-a", hosts={"gpu-a": "10.0.0.1", "gpu-b": "10.0.0.2"})
    body = launcher_body(cmd, launcher_environment(cmd), network_mode="host")
    assert body["Labels"]["oneplus.role"] == "launcher" and body["Labels"]["oneplus.rank"] == "2"
    assert "DeviceRequests" not in body["HostConfig"]
    assert body["HostConfig"]["ExtraHosts"] == ["gpu-a:10.0.0.1", "gpu-b:10.0.0.2"] == extra_hosts(cmd)
    assert body["Entrypoint"] == ["/bin/bash", "-c"]
    rank = container_body(
        cmd,
        cmd.ranks[0],
        {},
        local_rank=0,
        gpu_node=True,
        network_mode="host",
        cpuset=None,
        nano_cpus=None,
    )
    assert rank["HostConfig"]["ExtraHosts"] == ["gpu-a:10.0.0.1", "gpu-b:10.0.0.2"]
    assert rank["Labels"]["oneplus.launcher_here"] == "true"  # its node's runtime waits for the launcher
    other = launch(spec, ["gpu-a", "gpu-b"], "gpu-b")
    body_b = container_body(
        other, other.ranks[0], {}, local_rank=0, gpu_node=True, network_mode="host", cpuset=None, nano_cpus=None
    )
    assert "oneplus.launcher_here" not in body_b["Labels"] and "ExtraHosts" not in body_b["HostConfig"]


def test_run_launcher_as_worker_makes_the_launcher_pod_a_rank_too() -> None:
    text = (
        (PUBLIC / "mpijob_pi_mpich.yaml")
        .read_text()
        .replace("spec:\n  slotsPerWorker", "spec:\n  runLauncherAsWorker: true\n  slotsPerWorker", 1)
    )
    tr = load_job_document(text, filename="pi.yaml")
    assert tr.spec.ranks == 3 and tr.spec.launcher is not None


def test_a_second_launcher_or_an_unknown_mpi_implementation_is_refused() -> None:
    text = (PUBLIC / "mpijob_pi_mpich.yaml").read_text()
    with pytest.raises(JobFormatError, match="exactly one launcher"):
        load_job_document(text.replace("replicas: 1", "replicas: 2", 1), filename="pi.yaml")
    with pytest.raises(JobFormatError, match="mpiImplementation"):
        load_job_document(text.replace("MPICH", "LAM"), filename="pi.yaml")


def test_an_mpijob_without_launcher_runs_its_workers_and_says_so() -> None:
    text = """
apiVersion: kubeflow.org/v2beta1
kind: MPIJob
metadata: {name: w}
spec:
  mpiReplicaSpecs:
    Worker:
      replicas: 2
      template: {spec: {containers: [{name: w, image: busybox, resources: {limits: {nvidia.com/gpu: 1}}}]}}
"""
    tr = load_job_document(text, filename="w.yaml")
    assert tr.spec.launcher is None and any("no Launcher" in w for w in tr.warnings)


def test_a_launcher_belongs_to_an_mpijob_only() -> None:
    with pytest.raises(ValueError, match="launcher"):
        JobSpec.model_validate({"name": "x", "resources": {"gpus": 1}, "launcher": {}})


# -- the site's default node share (item 3) ------------------------------------------------------------------------


def test_a_site_default_share_gives_jobs_that_set_no_cpu_or_memory_a_per_gpu_share(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site.yaml"
    site.write_text("default_share: {cpus_per_gpu: 12, memory_mb_per_gpu: 120000}\n")
    monkeypatch.setenv(SITE_FILE_ENV, str(site))
    tr = load(PUBLIC / "mpijob_nccl_tests.yaml")  # workers set only GPUs
    r = tr.spec.resources
    assert (r.cpus, r.cpu_limit, r.memory_mb, r.memory_limit_mb) == (96.0, 96.0, 960000, 960000)
    notes = [w for w in tr.warnings if "default share" in w]
    assert len(notes) == 2 and "96 CPU(s)" in notes[0] and "960000 MiB" in notes[1]
    # A job that sets its own keeps them: the pi workers set 1 CPU and 1 GiB limits.
    pi = load(ROOT / "data" / "manifests" / "mpijob_pi.yaml")
    assert (pi.spec.resources.cpus, pi.spec.resources.memory_mb) == (1.0, 1024)
    assert not any("default share" in w for w in pi.warnings)


def test_without_a_site_share_unset_cpu_and_memory_mean_no_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SITE_FILE_ENV, raising=False)
    r = load(PUBLIC / "mpijob_nccl_tests.yaml").spec.resources
    assert (r.cpu_limit, r.memory_limit_mb) == (None, None)


def test_a_site_share_that_is_not_a_number_is_refused_with_the_file_and_the_entry(tmp_path: Path) -> None:
    site = tmp_path / "site.yaml"
    site.write_text("default_share: {cpus_per_gpu: lots}\n")
    with pytest.raises(SiteMapError, match=r"default_share\.cpus_per_gpu"):
        load_site(site)


def test_the_dry_run_says_what_the_site_share_gave(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from oneplus_jobformats.summary import dry_run_summary

    site = tmp_path / "site.yaml"
    site.write_text("default_share: {cpus_per_gpu: 4}\n")
    monkeypatch.setenv(SITE_FILE_ENV, str(site))
    tr = load(PUBLIC / "mpijob_nccl_tests.yaml")
    out = dry_run_summary(tr.spec, tr.warnings, kind=tr.kind)
    assert out["cpus_per_rank"] == 32 and out["cpu_limit_per_rank"] == 32
    assert any("default share" in w for w in out["warnings"])
    assert out["memory_limit_mb_per_rank"] is None  # memory not in the share: still no limit
