"""Public job inputs, unmodified, as a new user would submit them (issue 13, item 6).

Each file of `samples/public/` (sources, commits and licences in its README) and of `data/manifests/` is loaded
exactly as `oneplus submit -f FILE` / `oneplus sbatch FILE` load it (`load_job_document`) and compared with a golden
JSON in `samples/public/expected/<file>.json`: the normalised JobSpec, the translation's warnings, and what each
rank would start with on a plausible allocation (the platform's and the framework's variables only: MASTER_*,
WORLD_SIZE, RANK, PET_*, SLURM_*, OMPI_*, ...), plus, for a batch script, the tasks of a plain `srun CMD` step, and
for an MPIJob, the launcher's hostfile and variables.

ONEPLUS_REGEN_GOLDEN=1 rewrites the goldens (then read the diff: a golden states what the framework does, it is not
whatever OnePlus happens to print). A sample whose output is known to differ from what Slurm / torchrun /
mpi-operator would do is an `xfail(strict=True)` naming the gap (XFAIL below), never a blessed golden.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from oneplus_contracts import JobSpec, LaunchRanks, RankPlacement
from oneplus_contracts.array_facts import task_specs
from oneplus_jobformats import JobFormatError, load_job_document
from oneplus_jobformats.sbatch import parse_sbatch
from oneplus_jobformats.site import SITE_FILE_ENV, SiteMap
from oneplus_node_executor.runtime.environment import launcher_environment, mpi_hostfile, rank_environment
from oneplus_node_executor.runtime.slurm import (
    SHIM_DIR,
    SPOOL_ENV,
    SrunError,
    is_batch_rank,
    parse_srun,
    plan_step,
    task_environment,
)
from oneplus_node_executor.runtime.slurm_het import het_groups

ROOT = Path(__file__).resolve().parents[2]
PUBLIC = Path(__file__).resolve().parent / "samples" / "public"
EXPECTED = PUBLIC / "expected"
DATA = ROOT / "data" / "manifests"
REGEN = os.environ.get("ONEPLUS_REGEN_GOLDEN") == "1"
SUBMIT_DIR = "/home/user/job"  # SLURM_SUBMIT_DIR: where `oneplus sbatch` ran
GPUS_PER_NODE = 8

SAMPLES = sorted(p for p in PUBLIC.iterdir() if p.is_file() and p.suffix != ".md") + sorted(DATA.glob("*.yaml"))

# Refused, rightly: OnePlus does not run these kinds, and says so (the message is the test).
REFUSED: dict[str, str] = {
    "kueue_sample_job.yaml": r"unsupported manifest kind 'Job' apiVersion 'batch/v1'; OnePlus reads PyTorchJob",
    "kueue_sample_tfjob.yaml": r"unsupported manifest kind 'TFJob' apiVersion 'kubeflow.org/v1'",
    "kueue_sample_jaxjob.yaml": r"unsupported manifest kind 'JAXJob' apiVersion 'kubeflow.org/v1'",
    # Jean Zay's QOS names mean nothing without the site's map (Slurm itself refuses a QOS it does not know);
    # the message says how to map them, and SITE_MAPPED below loads the script with that map.
    "bigscience_tr11_176b_ml.slurm": r"line 6: --qos=qos_gpu-gc: unknown priority class 'qos_gpu-gc'.*SITE_FILE",
    "bigscience_tr11_setup_test_n2.slurm": r"--qos=qos_gpu-gc: unknown priority class 'qos_gpu-gc'.*ONEPLUS_SITE_FILE",
}

# Loaded again with the site's map, as `oneplus sbatch --site FILE` does.
SITE_MAPPED: dict[str, SiteMap] = {
    name: SiteMap(qos={"qos_gpu-gc": "high"}, accounts={"six@a100": "bigscience"}, partitions={"gpu_p5": "default"})
    for name in ("bigscience_tr11_176b_ml.slurm", "bigscience_tr11_setup_test_n2.slurm")
}

# Goldens whose content is not what the framework would do: the gap, named. Strict: fixing it fails the xfail, and
# the golden is then regenerated and read again.
XFAIL: dict[str, str] = {}

# The variables a rank gets from the platform and its framework (not the job's own, not the volatile ones).
_KEEP = re.compile(
    r"^(MASTER_ADDR|MASTER_PORT|WORLD_SIZE|RANK|LOCAL_RANK|LOCAL_WORLD_SIZE|NODE_RANK|NNODES|CUDA_VISIBLE_DEVICES|"
    r"NVIDIA_VISIBLE_DEVICES|PYTHONUNBUFFERED|ONEPLUS_GPU_MILLI|ONEPLUS_CHECKPOINT_SIGNAL|PET_\w+|SLURM_\w+|"
    r"SLURMD_\w+|OMPI_\w+|K_MPI_\w+|I_MPI_\w+|HYDRA_\w+)$"
)
_VOLATILE = {"SLURM_JOB_ID", "SLURM_JOBID"}


def _env(env: dict[str, str]) -> dict[str, str]:
    return {k: env[k] for k in sorted(env) if _KEEP.match(k) and k not in _VOLATILE}


def _short(value: Any, text: str) -> Any:
    """The JobSpec as JSON, with the sample's own text (a batch script as its command) named, not repeated."""
    if isinstance(value, dict):
        return {k: _short(v, text) for k, v in value.items()}
    if isinstance(value, list):
        return [_short(v, text) for v in value]
    if isinstance(value, str) and len(value) > 400:
        if value == text:
            return f"<the sample's text, {len(value)} characters>"
        return value[:300] + f"... <{len(value)} characters>"
    return value


def load(path: Path, site: SiteMap | None = None):  # type: ignore[no-untyped-def]
    text = path.read_text()
    if site is not None:
        return parse_sbatch(text, filename=path.name, site=site, submit_dir=SUBMIT_DIR)
    return load_job_document(text, filename=path.name, submit_dir=SUBMIT_DIR)


def layout(spec: JobSpec) -> list[int]:
    """Ranks per node of a plausible allocation: a batch job's tasks per node as it asks; a Kubernetes job's pods
    one per node (each replica is one torchrun node / MPI worker whatever machine it lands on)."""
    if spec.components is not None:  # a heterogeneous job: each component on nodes of its own, in order
        return [count for part in spec.component_specs() for count in layout(part)]
    per_node = spec.slurm.ntasks_per_node if spec.slurm is not None else 1
    full, rest = divmod(spec.ranks, per_node)
    return [per_node] * full + ([rest] if rest else [])


def launches(spec: JobSpec) -> list[LaunchRanks]:
    counts = layout(spec)
    nodes = [f"node-{i}" for i in range(len(counts))]
    node_of_rank = [n for n, c in zip(nodes, counts, strict=True) for _ in range(c)]
    out = []
    for index, node in enumerate(nodes):
        first = node_of_rank.index(node)
        width = spec.rank_resources(first).whole_gpus  # a heterogeneous job's node holds one component's ranks
        ranks = [
            RankPlacement(
                rank=r,
                node=node,
                gpus=list(range((r - first) * width, (r - first + 1) * width)) if width else [0],
                gpu_milli=spec.rank_resources(r).gpu_milli,
            )
            for r in range(first, first + counts[index])
        ]
        out.append(
            LaunchRanks(
                job_id="job-1",
                node=node,
                token=1,
                spec=spec,
                ranks=ranks,
                world_size=spec.ranks,
                master_addr=nodes[0],
                master_port=29500,
                nodes=nodes,
                node_rank=index,
                ranks_per_node=counts,
            )
        )
    return out


def observed(path: Path, site: SiteMap | None = None) -> dict[str, Any]:
    tr = load(path, site)
    spec = tr.spec
    text = path.read_text()
    array: dict[str, Any] | None = None
    if spec.array is not None:  # a job array: the ranks shown are its second task's (a job of its own)
        task_spec = task_specs("job-1", spec)[min(1, spec.array.tasks - 1)][1]
        assert task_spec.array_task is not None
        shown = task_spec.array_task.task_id
        array = {"tasks": spec.array.tasks, "max_running": spec.array.max_running, "shown": shown}
        spec = task_spec
    cmds = launches(spec)
    counts = layout(spec)
    # Ranks shown: the first node's first two, the second node's first, the last one.
    shown = sorted({0, min(1, counts[0] - 1), counts[0] if len(counts) > 1 else 0, spec.ranks - 1})
    ranks: dict[str, Any] = {}
    for cmd in cmds:
        envs = rank_environment(cmd, None, in_container=True)
        for p in cmd.ranks:
            if p.rank in shown:
                entry: dict[str, Any] = {"node": p.node, "gpus": p.gpus}
                if spec.framework == "sbatch":
                    entry["runs"] = "the batch script" if is_batch_rank(p) else "holds the allocation for srun"
                entry["env"] = _env(envs[p.rank])
                ranks[str(p.rank)] = entry
    out: dict[str, Any] = {
        "kind": tr.kind,
        "job": _short(tr.spec.model_dump(mode="json"), text),
        "warnings": tr.warnings,
        "allocation": {"nodes": len(counts), "ranks_per_node": sorted(set(counts), reverse=True)},
        "ranks": ranks,
    }
    if array is not None:
        out["array"] = array
    if spec.slurm is not None:
        nodes = het_groups(cmds[0])[0].nodes  # a plain srun runs on component 0 (all nodes for a job of one)
        tasks = plan_step(parse_srun(["CMD"]), nodes, spec.slurm.ntasks_per_node, spec.slurm.ntasks)
        picked = [t for t in tasks if t.procid in {0, 1, tasks[-1].procid}]
        out["srun_step"] = {
            "tasks": len(tasks),
            "nodes": len({t.node for t in tasks}),
            "shown": {
                str(t.procid): {"node": t.node, "env": _env(task_environment("job-1", 0, tasks, t))} for t in picked
            },
        }
    if spec.launcher is not None:
        first = cmds[0]
        hostfile = mpi_hostfile(first).splitlines()
        out["launcher"] = {
            "hostfile": hostfile if len(hostfile) <= 4 else [*hostfile[:2], "...", hostfile[-1]],
            "env": _env(launcher_environment(first)),
        }
    return out


def _golden_name(path: Path, site: SiteMap | None) -> str:
    return path.name + (".site" if site is not None else "") + ".json"


CASES = [pytest.param(p, None, id=p.name) for p in SAMPLES if p.name not in REFUSED] + [
    pytest.param(PUBLIC / name, site, id=f"{name}+site") for name, site in SITE_MAPPED.items()
]


def _marked(cases: list[Any]) -> list[Any]:
    out = []
    for case in cases:
        reason = XFAIL.get(case.id)
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        out.append(pytest.param(*case.values, id=case.id, marks=marks))
    return out


@pytest.fixture(autouse=True)
def _no_site_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SITE_FILE_ENV, raising=False)


@pytest.mark.parametrize(("path", "site"), _marked(CASES))
def test_a_public_sample_becomes_the_job_its_framework_means(path: Path, site: SiteMap | None) -> None:
    got = json.loads(json.dumps(observed(path, site)))
    golden = EXPECTED / _golden_name(path, site)
    if REGEN and path.name not in XFAIL:  # an xfail's golden says what the framework does: edited by hand
        EXPECTED.mkdir(exist_ok=True)
        golden.write_text(json.dumps(got, indent=1, ensure_ascii=False) + "\n")
    assert golden.exists(), f"no golden for {path.name}: run with ONEPLUS_REGEN_GOLDEN=1 and read it"
    assert got == json.loads(golden.read_text())


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_sample_of_a_kind_oneplus_does_not_run_is_refused_with_a_clear_message(name: str) -> None:
    with pytest.raises(JobFormatError, match=REFUSED[name]):
        load(PUBLIC / name)


def test_every_sample_is_listed_with_its_source_and_licence_and_has_a_golden_or_a_refusal() -> None:
    readme = (PUBLIC / "README.md").read_text()
    for path in SAMPLES:
        if path.parent == PUBLIC:
            row = next((line for line in readme.splitlines() if f"`{path.name}`" in line), None)
            assert row is not None, f"{path.name} is not in samples/public/README.md"
            assert re.search(r"@[0-9a-f]{8}", row) and re.search(r"Apache-2\.0|MIT|BSD|CC-BY", row), row
        assert path.name in REFUSED or (EXPECTED / _golden_name(path, None)).exists(), path.name
    goldens = {p.name for p in EXPECTED.glob("*.json")}
    wanted = {_golden_name(p, None) for p in SAMPLES if p.name not in REFUSED}
    wanted |= {_golden_name(PUBLIC / n, s) for n, s in SITE_MAPPED.items()}
    assert goldens == wanted, "goldens without a sample (or samples without one)"


# The `srun` lines of the batch scripts, as the shell hands them to srun on the allocation above (nodes node-0...,
# SLURM_JOB_ID job-1; the task's command shortened to CMD), and the tasks Slurm starts for each: (node, tasks there).
_WAIT = ["--wait=60", "--kill-on-bad-exit=1"]
SCRIPT_STEPS: dict[str, list[tuple[list[str], list[tuple[str, int]]]]] = {
    "bigscience_tr11_176b_ml.slurm": [
        ([*_WAIT, "--jobid", "job-1", "bash", "-c", "CMD"], [(f"node-{i}", 1) for i in range(24)])
    ],
    "bigscience_tr11_setup_test_n2.slurm": [
        (["--jobid", "job-1", "bash", "-c", "CMD"], [("node-0", 1), ("node-1", 1)])
    ],
    "bigscience_tr1_13b_round1.slurm": [
        (["--jobid", "job-1", "bash", "-c", "CMD"], [(f"node-{i}", 1) for i in range(128)])
    ],
    "mle_accelerate_launcher.slurm": [
        ([*_WAIT, "--jobid", "job-1", "bash", "-c", "CMD"], [("node-0", 1), ("node-1", 1)])
    ],
    "mle_example.slurm": [([*_WAIT, "--jobid", "job-1", "bash", "-c", "CMD"], [("node-0", 1), ("node-1", 1)])],
    "mle_lightning_launcher.slurm": [
        ([*_WAIT, "--jobid", "job-1", "bash", "-c", "CMD"], [("node-0", 8), ("node-1", 8)])
    ],
    "mle_srun_launcher.slurm": [([*_WAIT, "--jobid", "job-1", "bash", "-c", "CMD"], [("node-0", 8), ("node-1", 8)])],
    "mle_torchrun_launcher.slurm": [
        ([*_WAIT, "--jobid", "job-1", "bash", "-c", "CMD"], [("node-0", 1), ("node-1", 1)])
    ],
    "openr1_generate.slurm": [
        (["--nodes=1", "--ntasks=1", "-w", "node-0", "hostname", "--ip-address"], [("node-0", 1)]),
        (["--nodes=1", "--ntasks=1", "-w", "node-1", "ray", "start"], [("node-1", 1)]),
    ],
    "openr1_serve_r1.slurm": [
        (["--nodes=1", "--ntasks=1", "-w", "node-0", "hostname", "--ip-address"], [("node-0", 1)]),
        (["--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "bash", "-c", "CMD"], [("node-0", 1), ("node-1", 1)]),
    ],
    "openr1_train.slurm": [
        ([*_WAIT, "--nodes=1", "--ntasks=1", "--nodelist=node-0", "bash", "-c", "CMD"], [("node-0", 1)]),
    ],
    "csc_run_accelerate_gpu8.sh": [
        (["singularity_wrapper", "exec", "bash", "-c", "CMD"], [("node-0", 1), ("node-1", 1)])
    ],
    "csc_run_ddp_gpu4.sh": [
        (["torchrun", "--standalone", "--nnodes=1", "--nproc_per_node=4", "mnist_ddp.py"], [("node-0", 1)])
    ],
    "csc_run_ddp_gpu8.sh": [(["torchrun", "--nnodes=2", "mnist_ddp.py"], [("node-0", 1), ("node-1", 1)])],
    "csc_run_deepspeed_gpu8.sh": [(["python3", "mnist_deepspeed.py"], [("node-0", 4), ("node-1", 4)])],
    "csc_run_lightning_gpu8.sh": [(["python3", "mnist_lightning_ddp.py"], [("node-0", 4), ("node-1", 4)])],
    "olmo_c4_small_on_lumi.sh": [
        (
            ["--cpus-per-task=6", "--distribution=block:block", "--kill-on-bad-exit", "CMD"],
            [(f"node-{i}", 8) for i in range(32)],
        )
    ],
    "olmo_mitchish65.sh": [
        (
            ["--cpus-per-task=6", "--distribution=block:block", "--kill-on-bad-exit", "CMD"],
            [(f"node-{i}", 8) for i in range(128)],
        )
    ],
    "lcls2_submit_slac_hetjob.sh": [
        (["-n", "1", "--het-group=0", "--exclusive", "bash", "-c", "CMD"], [("node-0", 1)]),
        (["-n", "1", "--het-group=1", "--exclusive", "bash", "-c", "CMD"], [("node-1", 1)]),
    ],
}
# srun options Slurm itself refuses without the plugin (pyxis): OnePlus's refusal is right.
SCRIPT_STEPS_REFUSED: dict[str, tuple[list[str], str]] = {
    "mle_all_reduce_bench_pyxis.sbatch": (
        ["--container-image=nvcr.io#nvidia/pytorch:25.08-py3", "--container-mounts=/home/user/job:/workspace", "CMD"],
        r"unrecognized option '--container-image=",
    ),
}
STEP_XFAIL: dict[str, str] = {}


def _steps() -> list[Any]:
    out = []
    for name, steps in SCRIPT_STEPS.items():
        for i, (argv, want) in enumerate(steps):
            case = f"{name}[{i}]"
            reason = STEP_XFAIL.get(case)
            marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
            out.append(pytest.param(name, argv, want, id=case, marks=marks))
    return out


def _plan(name: str, argv: list[str]) -> list[tuple[str, int]]:
    spec = load(PUBLIC / name, SITE_MAPPED.get(name)).spec
    assert spec.slurm is not None
    opts = parse_srun(argv, components=len(spec.components or [spec]))
    groups = het_groups(launches(spec)[0])  # the job's nodes as one group, or its heterogeneous components
    tasks = [t for n in opts.het_group or (0,) for t in plan_step(opts, groups[n].nodes, groups[n].ntasks_per_node,
                                                                     groups[n].ntasks)]  # fmt: skip
    return [(n, sum(1 for t in tasks if t.node == n)) for n in dict.fromkeys(t.node for t in tasks)]


@pytest.mark.parametrize(("name", "argv", "want"), _steps())
def test_the_scripts_own_srun_steps_start_the_tasks_slurm_starts(
    name: str, argv: list[str], want: list[tuple[str, int]]
) -> None:
    assert _plan(name, argv) == want


@pytest.mark.parametrize("name", sorted(SCRIPT_STEPS_REFUSED))
def test_an_srun_option_of_a_plugin_the_site_lacks_is_refused(name: str) -> None:
    argv, message = SCRIPT_STEPS_REFUSED[name]
    with pytest.raises(SrunError, match=message):
        _plan(name, argv)


def test_srun_hands_the_batch_shells_exported_variables_to_its_tasks(tmp_path: Path) -> None:
    shim = SHIM_DIR / "srun"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), SPOOL_ENV: str(tmp_path), "MASTER_PORT": "6000"}
    env["WORLD_SIZE"] = "16"
    proc = subprocess.Popen(["/bin/sh", str(shim), "bash", "-c", "CMD"], env=env, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 10
        while not list(tmp_path.glob("*.req")) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert list(tmp_path.glob("*.req")), "the shim wrote no request"
        request = "\n".join(p.read_text() for p in tmp_path.iterdir() if p.is_file())
    finally:
        proc.kill()
        proc.wait()
    assert "MASTER_PORT=6000" in request and "WORLD_SIZE=16" in request
