"""sbatch scripts and options follow Slurm's rules and the documented rank rule."""

from __future__ import annotations

import pytest
from oneplus_jobformats import JobFormatError, parse_sbatch
from oneplus_jobformats.quantities import slurm_time_s
from oneplus_jobformats.sbatch_options import split_command_line

TRAIN = """#!/bin/bash
#SBATCH --job-name=llm-pretrain
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=12
#SBATCH --mem=960G
#SBATCH --time=2-00:00:00
#SBATCH --partition=train
#SBATCH --qos=high
#SBATCH --switches=1@30:00
#SBATCH --signal=B:USR1@120
#SBATCH --requeue
#SBATCH --exclusive
#SBATCH --output=logs/%x-%j.out
#SBATCH --mail-type=END   # a trailing comment
set -e
#SBATCH --nodes=64
srun python train.py
"""


def script(*directives: str, body: str = "srun hostname\n") -> str:
    return "#!/bin/bash\n" + "".join(f"#SBATCH {d}\n" for d in directives) + body


def test_the_full_training_script_becomes_the_expected_gang():
    spec = parse_sbatch(TRAIN, filename="train.sh").spec
    assert spec.name == "llm-pretrain"
    assert (spec.ranks, spec.resources.gpus, spec.total_gpus) == (16, 1.0, 16.0)  # 8 tasks split 8 GPUs per node
    assert spec.resources.cpus == 12.0
    assert spec.resources.memory_mb == 960 * 1024 // 8
    assert spec.time_limit_s == 2 * 86400
    assert (spec.queue, spec.priority, spec.priority_class) == ("train", 10_000, "high")
    assert spec.topology.max_leaves == 1
    assert spec.topology.exclusive is True
    assert (spec.checkpoint.signal, spec.checkpoint.grace_s) == ("SIGUSR1", 120)
    assert spec.preemptible is True
    assert spec.labels["slurm/output"] == "logs/%x-%j.out"
    assert spec.command[:2] == ["/bin/bash", "-c"] and spec.command[2] == TRAIN


def test_directives_stop_at_the_first_command_line():
    spec = parse_sbatch(TRAIN).spec
    assert spec.total_gpus == 16  # the `--nodes=64` after `set -e` is not read


def test_unused_directives_are_named_with_their_line():
    tr = parse_sbatch(TRAIN)
    assert "line 16: --mail-type=END: not used by OnePlus" in tr.warnings
    assert any(w.startswith("line 11: --switches=1@30:00: the wait limit (1800 s)") for w in tr.warnings)


def test_command_line_options_override_directives():
    spec = parse_sbatch(TRAIN, ["-N", "4", "--time=30", "--partition", "debug", "--qos=low"]).spec
    assert spec.ranks == 32
    assert spec.time_limit_s == 1800
    assert (spec.queue, spec.priority) == ("debug", 100)


def test_gres_gpu_with_gpus_per_node_is_an_error_as_in_slurm():
    with pytest.raises(JobFormatError, match="--gres=gpu and --gpus-per-node are mutually exclusive") as info:
        parse_sbatch(script("--gres=gpu:8", "--gpus-per-node=8"), filename="x.sh")
    assert "x.sh: line 3: --gpus-per-node=8" in str(info.value)


def test_gres_on_the_command_line_conflicts_with_gpus_per_node_in_the_script():
    with pytest.raises(JobFormatError, match="mutually exclusive"):
        parse_sbatch(script("--gpus-per-node=8"), ["--gres=gpu:4"])


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 90 * 60),
        ("5:30", 5 * 60 + 30),
        ("1:02:03", 3723),
        ("2-12", 2 * 86400 + 12 * 3600),
        ("1-00:30", 86400 + 1800),
        ("1-01:01:01", 86400 + 3661),
        ("0", None),
        ("UNLIMITED", None),
        ("infinite", None),
    ],
)
def test_time_formats_of_the_man_page(text, seconds):
    assert slurm_time_s(text) == seconds
    assert parse_sbatch(script(f"--time={text}", "--gpus=1")).spec.time_limit_s == seconds


@pytest.mark.parametrize("bad", ["1:2:3:4", "abc", "1-", "-5", "1-2-3", "", "1.5"])
def test_bad_times_are_refused_with_the_formats_listed(bad):
    with pytest.raises(JobFormatError, match="is not a Slurm time"):
        parse_sbatch(script(f"--time={bad}", "--gpus=1"))


def test_gres_forms_and_gpu_types():
    spec = parse_sbatch(script("--gres=gpu:h100:4", "--nodes=3")).spec
    assert (spec.ranks, spec.resources.gpus, spec.resources.gpu_models) == (3, 4.0, ["h100"])
    assert parse_sbatch(script("--gres=gpu")).spec.resources.gpus == 1.0
    tr = parse_sbatch(script("--gres=gpu:2,nic:1"))
    assert tr.spec.resources.gpus == 2.0
    assert any("generic resource 'nic'" in w for w in tr.warnings)


def test_total_gpus_are_spread_over_nodes():
    spec = parse_sbatch(script("--nodes=2", "--gpus=volta:16")).spec
    assert (spec.ranks, spec.resources.gpus, spec.resources.gpu_models) == (2, 8.0, ["volta"])
    with pytest.raises(JobFormatError, match="15 GPUs cannot be spread evenly over 2 nodes"):
        parse_sbatch(script("--nodes=2", "--gpus=15"))


def test_gpus_per_task_makes_one_rank_per_task():
    spec = parse_sbatch(script("--ntasks=16", "--gpus-per-task=1", "--cpus-per-task=4")).spec
    assert (spec.ranks, spec.resources.gpus, spec.resources.cpus) == (16, 1.0, 4.0)


def test_tasks_that_do_not_split_the_gpus_keep_one_rank_per_node():
    tr = parse_sbatch(script("--nodes=2", "--ntasks-per-node=3", "--gpus-per-node=8"))
    assert (tr.spec.ranks, tr.spec.resources.gpus, tr.spec.resources.cpus) == (2, 8.0, 3.0)
    assert any("do not split 8 GPUs per node evenly" in w for w in tr.warnings)


def test_one_node_with_several_ranks_must_stay_on_that_node():
    spec = parse_sbatch(script("--nodes=1", "--ntasks-per-node=4", "--gpus-per-node=4")).spec
    assert spec.ranks == 4
    assert (spec.topology.domain, spec.topology.mode) == ("node", "required")


def test_memory_per_cpu_and_per_gpu():
    assert parse_sbatch(script("--gpus=2", "--cpus-per-task=8", "--mem-per-cpu=4G")).spec.resources.memory_mb == 32768
    assert parse_sbatch(script("--gpus-per-node=4", "--mem-per-gpu=80G")).spec.resources.memory_mb == 4 * 80 * 1024
    with pytest.raises(JobFormatError, match="mutually exclusive"):
        parse_sbatch(script("--gpus=1", "--mem=1G", "--mem-per-cpu=1G"))


def test_signal_forms():
    spec = parse_sbatch(script("--gpus=1", "--signal=USR2")).spec
    assert (spec.checkpoint.signal, spec.checkpoint.grace_s) == ("SIGUSR2", 60)  # sbatch's default sig_time
    spec = parse_sbatch(script("--gpus=1", "--signal=10@300")).spec
    assert (spec.checkpoint.signal, spec.checkpoint.grace_s) == ("SIGUSR1", 300)
    with pytest.raises(JobFormatError, match=r"line 3: --signal=SIGWINCH@10: .*unknown checkpoint signal"):
        parse_sbatch(script("--gpus=1", "--signal=SIGWINCH@10"))
    with pytest.raises(JobFormatError, match="sig_time must be 0-65535"):
        parse_sbatch(script("--gpus=1", "--signal=USR1@99999"))


def test_switches_without_wait_time_and_bad_switches():
    tr = parse_sbatch(script("--gpus=1", "--switches=2"))
    assert tr.spec.topology.max_leaves == 2
    assert not any("switches" in w for w in tr.warnings)
    with pytest.raises(JobFormatError, match="expected count\\[@max-time\\]"):
        parse_sbatch(script("--gpus=1", "--switches=zero"))


def test_no_requeue_makes_the_job_not_preemptible_and_the_last_setting_wins():
    assert parse_sbatch(script("--gpus=1", "--no-requeue")).spec.preemptible is False
    assert parse_sbatch(script("--gpus=1", "--no-requeue"), ["--requeue"]).spec.preemptible is True


def test_short_options_abbreviations_and_account_as_team():
    spec = parse_sbatch(script("-N2", "-J short", "-p gpu", "-t 10", "--gpus-per-n=2", "-A vision")).spec
    assert (spec.name, spec.queue, spec.time_limit_s, spec.ranks, spec.team) == ("short", "gpu", 600, 2, "vision")


def test_container_image_and_wrap():
    spec = parse_sbatch(
        "", ["--wrap=nvidia-smi", "--gpus=1", "--container-image=nvcr.io/nvidia/pytorch:24.05-py3"]
    ).spec
    assert spec.command == ["/bin/sh", "-c", "nvidia-smi"]
    assert spec.image == "nvcr.io/nvidia/pytorch:24.05-py3"


def test_a_cpu_only_script_gets_a_share_per_task_and_a_warning():
    tr = parse_sbatch(script("--ntasks=4", "--cpus-per-task=2"))
    assert (tr.spec.ranks, tr.spec.resources.gpus, tr.spec.resources.cpus) == (4, 0.001, 2.0)
    assert any("asks for no GPU" in w for w in tr.warnings)


@pytest.mark.parametrize(
    ("directives", "message"),
    [
        (["--frobnicate"], "line 2: unrecognized option '--frobnicate'"),
        (["--no"], "line 2: option '--no' is ambiguous"),
        (["-Z"], "invalid option '-Z'"),
        (["--nodes"], "option '--nodes' needs a value"),
        (["--nodes=two"], "expected a node count"),
        (["--gres=gpu:x:y"], "GPU count 'y' is not a whole number"),
        (["--gpus-per-node=a100:2,v100:1"], "several GPU types"),
        (["--array=5-1"], "line 2: --array=5-1: 5-1: the range ends (1) before it starts (5)"),
        (["--array=1-5:0"], "--array=1-5:0: 1-5:0: the step must be 1 or more (got 0)"),
        (["--array=0-1001"], "--array=0-1001: task id 1001 is above the site's max_array_size (1001: ids 0-1000"),
        (["--array=0-9%0"], "--array=0-9%0: %0: at most 0 tasks at once would never run one"),
        (["--array=1-x"], "--array=1-x: '1-x' is not an id"),
        (["--qos=whenever"], "unknown priority class 'whenever'"),
        (["--partition=bad/name", "--gpus=1"], "--partition=bad/name"),
        (["--exclusive", "--oversubscribe"], "--exclusive and --oversubscribe are mutually exclusive"),
        (["--job-name='unclosed"], "line 2: cannot split"),
        (["--gpus=2", "--gpus-per-node=4"], "GPU options disagree on GPUs per node"),
        (["--requeue=yes"], "option '--requeue' takes no value"),
    ],
)
def test_bad_directives_fail_naming_the_line_and_option(directives, message):
    with pytest.raises(JobFormatError) as info:
        parse_sbatch(script(*directives), filename="job.sh")
    assert message in str(info.value)
    assert str(info.value).startswith("job.sh: ")


def test_a_script_without_shebang_is_refused_like_slurm_does():
    with pytest.raises(JobFormatError, match="first line must start with #!"):
        parse_sbatch("#SBATCH --gpus=1\nsrun hostname\n")


def test_split_command_line_separates_options_script_and_its_arguments():
    assert split_command_line(["-N", "2", "--exclusive", "run.sh", "--lr", "3"]) == (
        ["-N", "2", "--exclusive"],
        "run.sh",
        ["--lr", "3"],
    )
    assert split_command_line(["--wrap=hostname"]) == (["--wrap=hostname"], None, [])


def test_script_arguments_reach_the_script():
    spec = parse_sbatch(script("--gpus=1"), filename="run.sh", script_args=["--lr", "3e-4"]).spec
    assert spec.command[-3:] == ["run.sh", "--lr", "3e-4"]


def test_a_site_default_share_fills_the_cpu_and_memory_a_script_leaves_unset(tmp_path, monkeypatch):
    from oneplus_jobformats.site import load_site

    site_file = tmp_path / "site.yaml"
    site_file.write_text("default_share: {cpus_per_gpu: 8, memory_mb_per_gpu: 65536}\n")
    site = load_site(site_file)
    bare = parse_sbatch(script("--nodes=1", "--gpus-per-node=4"), site=site)
    assert bare.spec.resources.cpus == bare.spec.resources.cpu_limit == 32
    assert bare.spec.resources.memory_mb == bare.spec.resources.memory_limit_mb == 4 * 65536
    assert any("default share" in w for w in bare.warnings), bare.warnings
    own = parse_sbatch(script("--nodes=1", "--gpus-per-node=4", "--cpus-per-task=6", "--mem=100G"), site=site)
    assert own.spec.resources.cpus == 6 and own.spec.resources.memory_mb == 100 * 1024, "what the script sets stands"


def test_a_script_that_arrives_over_the_bus_has_no_submit_dir_of_the_intakes(monkeypatch, tmp_path):
    from oneplus_jobformats.cloudevents import decode_submission

    monkeypatch.chdir(tmp_path)
    local = parse_sbatch(script("--nodes=1", "--gpus-per-node=1"))
    assert local.spec.slurm is not None and local.spec.slurm.submit_dir == str(tmp_path), "sbatch's own directory"
    sub = decode_submission({}, script("--nodes=1", "--gpus-per-node=1").encode())
    assert sub.spec.slurm is not None and sub.spec.slurm.submit_dir is None
