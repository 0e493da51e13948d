"""Slurm parity and resource semantics of sbatch scripts (issue 13, items 3-4)."""

from __future__ import annotations

import pytest
from oneplus_jobformats import JobFormatError, parse_sbatch


def sb(*directives: str, body: str = "srun hostname\n"):  # type: ignore[no-untyped-def]
    return parse_sbatch("#!/bin/bash\n" + "".join(f"#SBATCH {d}\n" for d in directives) + body, filename="job.sh")


def test_cluster_is_clusters_not_ambiguous() -> None:
    tr = sb("--cluster=gpu", "--gpus-per-node=1")
    assert any("--clusters=gpu: not used by OnePlus" in w for w in tr.warnings)


def test_non_ascii_job_name_is_kept_in_a_label() -> None:
    spec = sb("--job-name=entraînement-模型", "--gpus-per-node=1").spec
    assert spec.name == "entrainement"
    assert spec.labels["slurm/job-name"] == "entraînement-模型"
    only_cjk = sb("--job-name=模型", "--gpus-per-node=1").spec
    assert only_cjk.name.startswith("sbatch-") and only_cjk.labels["slurm/job-name"] == "模型"


def test_account_with_at_sign_is_a_team_and_said() -> None:
    tr = sb("--account=six@a100", "--gpus-per-node=1")
    assert tr.spec.team == "six-a100" and tr.spec.labels["slurm/account"] == "six@a100"
    assert any("the team is 'six-a100'" in w for w in tr.warnings)
    assert sb("-A ml", "--gpus-per-node=1").spec.team == "ml"


def test_ntasks_per_gpu_gives_one_rank_per_task_with_its_cpus() -> None:
    spec = sb("--nodes=1", "--gpus-per-node=4", "--ntasks-per-gpu=1", "--cpus-per-task=32").spec
    assert (spec.ranks, spec.resources.gpus, spec.resources.cpus) == (4, 1, 32)
    assert spec.ranks * spec.resources.cpus == 128
    two = sb("--nodes=2", "--gpus-per-node=2", "--ntasks-per-gpu=2", "--cpus-per-task=4").spec
    # 4 tasks per node do not split 2 GPUs: one rank per node runs them all, with all their CPUs.
    assert (two.ranks, two.resources.gpus, two.resources.cpus) == (2, 2, 16)


@pytest.mark.parametrize(
    ("directives", "message"),
    [
        (("--ntasks-per-gpu=1",), "needs GPUs"),
        (("--gpus-per-node=2", "--ntasks-per-gpu=1", "--ntasks-per-node=2"), "mutually exclusive"),
        (("--gpus-per-task=1", "--ntasks-per-gpu=1"), "mutually exclusive"),
        (("--gpus-per-node=2", "--ntasks-per-gpu=1", "--ntasks=3"), "3 tasks, but --ntasks-per-gpu gives 2"),
    ],
)
def test_ntasks_per_gpu_errors(directives: tuple[str, ...], message: str) -> None:
    with pytest.raises(JobFormatError, match=message):
        sb(*directives)


def test_mem_zero_is_the_whole_node_exclusive_and_uncapped() -> None:
    tr = sb("--nodes=2", "--gpus-per-node=8", "--mem=0")
    assert tr.spec.topology.exclusive is True
    assert tr.spec.resources.memory_limit_mb is None
    assert any("all of each node's memory" in w for w in tr.warnings)


def test_asked_for_cpus_and_memory_are_request_and_cap_unset_ones_are_uncapped() -> None:
    r = sb("--gpus-per-node=8", "--cpus-per-task=12", "--mem=64G").spec.resources
    assert (r.cpus, r.cpu_limit, r.memory_mb, r.memory_limit_mb) == (12, 12, 65536, 65536)
    unset = sb("--gpus-per-node=8").spec.resources
    assert (unset.cpu_limit, unset.memory_limit_mb) == (None, None)


def test_dry_run_says_what_is_reserved_and_what_caps() -> None:
    from oneplus_jobformats import dry_run_summary

    tr = sb("--gpus-per-node=8", "--cpus-per-task=12")
    out = dry_run_summary(tr.spec, tr.warnings, kind=tr.kind)
    assert out["cpu_limit_per_rank"] == 12 and out["memory_limit_mb_per_rank"] is None
    assert "memory: no limit; a rank may use its node's free memory" in out["resource_notes"]
    assert "CPU: capped at 12" in out["resource_notes"]
