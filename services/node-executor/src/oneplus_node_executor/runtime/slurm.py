"""Slurm batch semantics on the container runtime: the batch script runs once, `srun` starts step tasks.

A job of framework "sbatch" has one container per rank, as every job. The container of rank 0 (on the first node of
the allocation) runs the batch script with the Slurm batch environment; every other container holds its share of the
allocation (GPUs, CPUs, memory) running `holder_command()`, a shell that waits to be released.

`srun` in the batch script is a POSIX sh shim (slurm_bin/srun), bind-mounted read-only into every container of the
job and first on PATH. It writes its arguments into a spool directory the executor mounted into the batch container
(no network is needed: CPU-only containers have none) and prints the step's output as it comes. `StepServer`, run by
the executor of the batch node, serves each request as its own task, so steps run side by side (`srun ... &`): it
parses the options (`parse_srun`), lays the tasks out over the job's nodes (`plan_step`), gives the step its share of
the allocation (slurm_shares.py: whole nodes, or one slot per task with --exact, nothing with --overlap; a step that
does not fit waits), gives each task its environment (`task_environment`) and has each node run its tasks inside the
job's containers there (slurm_tasks.py, the engine's exec API): its own node directly, the others through a
`StepTransport` (the executors' NATS request subjects, `subjects.slurm_step`). The worst task's exit status is srun's.

When the batch container ends, the steps still running are ended (SIGTERM, SIGKILL after `STEP_KILL_WAIT_S`) and the
holders are released (`release_holders`, `subjects.slurm_release` for the other nodes): they exit 0, so the job's
outcome is the batch script's. Each step's end is kept (`NodeTasks.ends`) and named in the batch node's end reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import re
import shutil
import signal as _signal
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeGuard

from oneplus_contracts import JobSpec, LaunchRanks, RankPlacement, subjects
from oneplus_contracts.slurm import expand_hostlist
from pydantic import BaseModel, ConfigDict

from .slurm_het import HetGroup, HetGroupError, check_het_groups, het_environment, het_groups, parse_het_group
from .slurm_shares import GpuAsk, GpuAskError, Shares, StepClaim, check_gpus
from .slurm_tasks import (
    NodeStep,
    NodeTasks,
    StepEnd,
    StepOp,
    StepPoll,
    StepProgress,
    StepSignal,
    TaskResult,
    TaskRun,
    parse_op,
    serve_op,
)

if TYPE_CHECKING:
    from .docker import DockerRuntime

log = logging.getLogger("oneplus.executor.slurm")

FRAMEWORK = "sbatch"
SHIM_DIR = Path(__file__).resolve().parent / "slurm_bin"
CONTAINER_BIN = "/opt/oneplus-slurm/bin"
CONTAINER_SPOOL = "/run/oneplus-slurm"
SPOOL_ENV = "ONEPLUS_SLURM_SPOOL"
# Where the executor keeps each batch job's spool directory on the host (the engine bind-mounts it from there).
SPOOL_ROOT_ENV = "ONEPLUS_SLURM_SPOOL_ROOT"
DEFAULT_SPOOL_ROOT = "/tmp/oneplus-slurm"
# The image's PATH is not known to the executor; the usual one, after the shim's directory.
PATH = f"{CONTAINER_BIN}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
POLL_S = 0.1
QUIET_POLL_S = 1.0  # how often a running step's nodes are asked for output once it has printed nothing for a while
BATCH_CHECK_EVERY = 10  # polls of the spool per look at the batch container (an engine call)
MAX_ARG_BYTES = 1 << 20
SRUN_USAGE_EXIT = 1  # srun's status when it refuses its options (as Slurm's srun: 1)


class SrunError(ValueError):
    """srun refused the step (bad option, more tasks than the allocation); the message is srun's stderr."""


def is_batch_job(spec: JobSpec) -> bool:
    return spec.framework == FRAMEWORK


def is_batch_rank(placement: RankPlacement) -> bool:
    """Rank 0 runs the batch script; it is on the first node of the allocation."""
    return placement.rank == 0


def spool_root(node: str | None = None) -> Path:
    """Where this node's executor keeps its batch jobs' spools: a folder per node (several may share a host)."""
    root = Path(os.environ.get(SPOOL_ROOT_ENV) or DEFAULT_SPOOL_ROOT)
    return root / node if node else root


def spool_dir(root: Path, job_id: str, token: int) -> Path:
    return root / f"{job_id}-t{token}"


def prepare_spool(root: Path, job_id: str, token: int) -> Path:
    """The batch container's spool directory (srun's requests), made before the container is created."""
    path = spool_dir(root, job_id, token)
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o1777)  # the job's user in the container may not be root
    return path


def _launch_file(root: Path, job_id: str, token: int) -> Path:
    """The batch node's launch, kept beside (not in: the job writes there) the spool for a restarted executor."""
    return root / f"{job_id}-t{token}.launch.json"


def remove_spools(root: Path, job_id: str, token: int | None = None) -> None:
    """The spool directories of the job's attempts (of one token, or all), with what is left in them."""
    if not root.is_dir():
        return
    for path in root.glob(f"{job_id}-t*"):
        rest = path.name[len(job_id) + 2 :].removesuffix(".launch.json")
        if not rest.isdigit() or (token is not None and int(rest) != token):
            continue
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                path.unlink()


# -- the allocation's environment ----------------------------------------------------------------------------------


def tasks_per_node(spec: JobSpec) -> int:
    return spec.slurm.ntasks_per_node if spec.slurm is not None else 1


def allocation_environment(cmd: LaunchRanks, placement: RankPlacement) -> dict[str, str]:
    """The Slurm variables of the job's containers on this node; the batch rank's also name it task 0 of node 0."""
    spec = cmd.spec
    slurm = spec.slurm
    nodes = cmd.nodes or [cmd.node]
    ntasks = slurm.ntasks if slurm is not None else cmd.world_size
    per_node = tasks_per_node(spec)
    gpus_here = sum(len(p.gpus) for p in cmd.ranks if p.node == cmd.node)
    env = {
        "SLURM_JOB_ID": cmd.job_id,
        "SLURM_JOBID": cmd.job_id,
        "SLURM_JOB_NAME": slurm.job_name if slurm is not None else spec.name,
        "SLURM_JOB_NODELIST": ",".join(nodes),
        "SLURM_NODELIST": ",".join(nodes),
        "SLURM_JOB_NUM_NODES": str(len(nodes)),
        "SLURM_NNODES": str(len(nodes)),
        "SLURM_NTASKS": str(ntasks),
        "SLURM_NPROCS": str(ntasks),
        "SLURM_NTASKS_PER_NODE": str(per_node),
        "SLURM_TASKS_PER_NODE": tasks_per_node_text([per_node] * len(nodes)),
        "SLURM_NODEID": str(cmd.node_rank),
        "SLURMD_NODENAME": cmd.node,
        "SLURM_JOB_PARTITION": (slurm.partition if slurm is not None and slurm.partition else spec.queue),
        "SLURM_JOB_ACCOUNT": (slurm.account if slurm is not None and slurm.account else spec.team),
        "SLURM_JOB_USER": spec.user,
        "SLURM_CLUSTER_NAME": "oneplus",
        "PATH": PATH,
        SPOOL_ENV: CONTAINER_SPOOL,
    }
    whole_gpus = spec.resources.whole_gpus
    cpus_per_task = slurm.cpus_per_task if slurm is not None else None
    if spec.components is not None:
        # A heterogeneous job: the plain variables are the container's own component's (the batch script's is
        # component 0, as in Slurm), and every component's have the _HET_GROUP_<n> names.
        groups = het_groups(cmd)
        own = groups[spec.component_of(placement.rank)]
        whole_gpus, cpus_per_task = own.resources.whole_gpus, own.cpus_per_task
        node_ids = {n: i for i, n in enumerate(own.nodes)}
        env.update(
            {
                "SLURM_JOB_NODELIST": ",".join(own.nodes),
                "SLURM_NODELIST": ",".join(own.nodes),
                "SLURM_JOB_NUM_NODES": str(len(own.nodes)),
                "SLURM_NNODES": str(len(own.nodes)),
                "SLURM_NTASKS": str(own.ntasks),
                "SLURM_NPROCS": str(own.ntasks),
                "SLURM_NTASKS_PER_NODE": str(own.ntasks_per_node),
                "SLURM_TASKS_PER_NODE": tasks_per_node_text([own.ntasks_per_node] * len(own.nodes)),
                "SLURM_NODEID": str(node_ids.get(cmd.node, 0)),
            }
        )
        env.update(het_environment(cmd.job_id, groups, tasks_per_node_text))
    if whole_gpus and gpus_here:  # a job without GPUs (its 0.001 share) has none, as in Slurm
        env["SLURM_GPUS_ON_NODE"] = str(gpus_here)
    if cpus_per_task:
        env["SLURM_CPUS_PER_TASK"] = str(cpus_per_task)
    if slurm is not None and slurm.submit_dir:
        env["SLURM_SUBMIT_DIR"] = slurm.submit_dir
    if is_batch_rank(placement):
        env.update({"SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_TASK_PID": "1"})
    return env


# Holds the allocation until released: SIGTERM (the release, a cancel) ends it with 0; the checkpoint and other
# signals are for the batch shell and are ignored here.
HOLDER_SCRIPT = "trap 'exit 0' TERM INT; trap '' USR1 USR2 HUP QUIT; while :; do sleep 1; done"


def holder_command() -> list[str]:
    return ["/bin/sh", "-c", HOLDER_SCRIPT]


def adjust_body(body: dict[str, Any], cmd: LaunchRanks, placement: RankPlacement, spool: Path | None) -> None:
    """The create body of a batch job's container: the shim mounted, the spool on the batch rank, holders hold."""
    host = body.setdefault("HostConfig", {})
    binds = list(host.get("Binds") or [])
    binds.append(f"{SHIM_DIR}:{CONTAINER_BIN}:ro")
    if is_batch_rank(placement):
        if spool is not None:
            binds.append(f"{spool}:{CONTAINER_SPOOL}:rw")
    elif cmd.spec.simulate is None:
        body["Entrypoint"] = [""]
        body["Cmd"] = holder_command()
    host["Binds"] = binds


# -- srun's options ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SrunOptions:
    ntasks: int | None
    nodes: int | None
    ntasks_per_node: int | None
    label: bool
    argv: list[str]
    nodelist: tuple[str, ...] | None = None  # -w/--nodelist, expanded
    jobid: str | None = None  # --jobid, checked against the job when known
    export_all: bool = True  # --export: ALL (the default) passes the batch shell's exported variables
    export_names: tuple[str, ...] = ()  # --export=NAME,...: those only
    export_set: tuple[tuple[str, str], ...] = ()  # --export=...,NAME=value
    exact: bool = False  # --exact: only the slots its tasks need (without: whole nodes)
    overlap: bool = False  # --overlap: shares the slots of running steps, holds none
    gpus: GpuAsk = field(default_factory=GpuAsk)  # -G/--gpus, --gpus-per-task, --gpus-per-node, --gres=gpu:N
    cpus_per_task: int | None = None  # -c: what an --exact task holds of its slot's CPUs (1 when not given)
    het_group: tuple[int, ...] | None = None  # --het-group: the components the step runs on (None: component 0)


_VALUED = {"-n": "ntasks", "--ntasks": "ntasks", "-N": "nodes", "--nodes": "nodes"}
_VALUED.update({"--ntasks-per-node": "ntasks-per-node", "-c": "cpus-per-task", "--cpus-per-task": "cpus-per-task"})
# Options taking a value that OnePlus reads itself (beside the counts above).
_READ_VALUED = {"-w", "--nodelist", "--jobid", "-m", "--distribution", "--export", "-W", "--wait"}
# Accepted and without effect here (the step runs in the job's containers as they are).
_IGNORED_VALUED = {"-J", "--job-name", "--mpi", "--cpu-bind"}
_IGNORED_FLAGS = {"-u", "--unbuffered", "-K", "--kill-on-bad-exit"}
_GPU_VALUED = {"-G": "total", "--gpus": "total", "--gpus-per-task": "per_task", "--gpus-per-node": "per_node"}
_GPU_VALUED["--gres"] = "gres"
# Short options whose value may be glued on (-n4, -wnode1).
_SHORT_VALUED = ("-n", "-N", "-J", "-c", "-w", "-m", "-W", "-G")
_EXPORT_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _count(name: str, text: str) -> int:
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise SrunError(f"srun: error: --{name}={text!r}: expected a whole number of at least 1")
    return int(text)


def _nodelist(text: str) -> tuple[str, ...]:
    if "/" in text:
        raise SrunError(f"srun: error: --nodelist={text!r}: a file of node names is not supported by OnePlus; "
                        "give the names (node-a,node-b or node-[1-2])")  # fmt: skip
    try:
        names = expand_hostlist(text)
    except ValueError as e:
        raise SrunError(f"srun: error: --nodelist={text!r}: {e}") from None
    if not names:
        raise SrunError("srun: error: --nodelist names no node")
    return tuple(dict.fromkeys(names))


def _distribution(text: str) -> None:
    """Slurm's -m/--distribution: node level[:socket level[:core level]][,Pack|NoPack]. The node level decides which
    node each task runs on; OnePlus lays tasks out in blocks, so only block (or *, its default) is honoured. The
    levels below place tasks on sockets and cores inside a node, which the job's containers do not split."""
    node_level = text.split(",")[0].split(":")[0]
    if node_level in ("block", "*", ""):
        return
    if node_level in ("cyclic", "arbitrary", "plane") or node_level.startswith("plane="):
        raise SrunError(f"srun: error: --distribution={text}: OnePlus distributes a step's tasks over nodes in "
                        f"blocks only ({node_level} is not supported; use block, the default)")  # fmt: skip
    raise SrunError(f"srun: error: --distribution={text}: invalid distribution {node_level!r}")


def _gpu_count(name: str, text: str) -> int:
    """--gpus=[type:]N (and its per-task/per-node forms): the number, at least 0."""
    count = text.rsplit(":", 1)[-1]
    if not (count.isascii() and count.isdigit()):
        raise SrunError(f"srun: error: {name}={text!r}: expected [type:]number of GPUs")
    return int(count)


def _gres_gpus(text: str) -> int | None:
    """--gres=gpu[:type][:N][,...] or none: the GPUs per node it asks for (None: no GPUs asked)."""
    if text.strip().lower() == "none":
        return None
    found: int | None = None
    for item in text.split(","):
        parts = item.split(":")
        if parts[0] != "gpu":
            raise SrunError(f"srun: error: --gres={text}: {parts[0]!r}: OnePlus's srun knows gpu and none only")
        if len(parts) == 1 or (len(parts) == 2 and not parts[1].isdigit()):
            found = 1
        elif parts[-1].isascii() and parts[-1].isdigit():
            found = int(parts[-1])
        else:
            raise SrunError(f"srun: error: --gres={text}: expected gpu[:type][:count]")
    return found


def _export(text: str) -> tuple[bool, tuple[str, ...], tuple[tuple[str, str], ...]]:
    """--export: ALL (the default), NONE/NIL, or NAME and NAME=value items, ALL among them to keep the rest."""
    every = False
    names: list[str] = []
    sets: list[tuple[str, str]] = []
    for item in text.split(","):
        name, eq, value = item.partition("=")
        if not eq and name in ("ALL", ""):
            every = True
        elif not eq and name in ("NONE", "NIL"):
            continue
        elif _EXPORT_NAME.fullmatch(name):
            if eq:
                sets.append((name, value))
            else:
                names.append(name)
        else:
            raise SrunError(f"srun: error: --export={text}: {item!r} is not ALL, NONE, NAME or NAME=value")
    return every, tuple(names), tuple(sets)


def parse_srun(args: Sequence[str], job_id: str | None = None, components: int = 1) -> SrunOptions:
    """srun's command line: the options OnePlus honours (-n, -N, --ntasks-per-node, -w, -l, --export, ...), then
    the task's command. `job_id`, when given, is the job's: --jobid naming another job is refused. `components`: the
    job's heterogeneous components (--het-group names some of them; refused for a job of one)."""
    het_group: tuple[int, ...] | None = None
    counts: dict[str, int] = {}
    label = False
    nodelist: tuple[str, ...] | None = None
    jobid: str | None = None
    export: tuple[bool, tuple[str, ...], tuple[tuple[str, str], ...]] = (True, (), ())
    flags: set[str] = set()
    gpus: dict[str, Any] = {}
    gpu_options: list[str] = []
    i = 0
    args = list(args)
    while i < len(args):
        arg = args[i]
        if arg == "--":
            i += 1
            break
        if not arg.startswith("-") or arg == "-":
            break
        name, eq, value = arg.partition("=")
        short_value = None
        if not eq and len(arg) > 2 and arg[1] != "-" and arg[:2] in _SHORT_VALUED:
            name, short_value = arg[:2], arg[2:]  # -n4
        if name in ("-l", "--label"):
            if eq:
                raise SrunError(f"srun: error: {name} takes no value")
            label = True
        elif name == "--het-group":
            if components < 2:
                job = f"job {job_id}" if job_id else "this batch job"
                raise SrunError(f"srun: error: {arg}: {job} is not a heterogeneous job (it has one component); run "
                                "the step without --het-group")  # fmt: skip
            if not eq:
                i += 1
                if i >= len(args):
                    raise SrunError(f"srun: error: {name} needs a value")
                value = args[i]
            try:
                het_group = parse_het_group(f"--het-group={value}", value)
                check_het_groups(f"--het-group={value}", het_group, job_id, components)
            except HetGroupError as e:
                raise SrunError(str(e)) from None
        elif name in ("--exact", "--overlap", "--exclusive"):
            if eq:
                raise SrunError(f"srun: error: {name} takes no value")
            # srun(1): for a step, --exclusive implies --exact (Slurm 20.11 on): the step holds only what it asks.
            flags.add("--exact" if name == "--exclusive" else name)
        elif name in _VALUED or name in _IGNORED_VALUED or name in _READ_VALUED or name in _GPU_VALUED:
            if eq:
                given = value
            elif short_value is not None:
                given = short_value
            else:
                i += 1
                if i >= len(args):
                    raise SrunError(f"srun: error: {name} needs a value")
                given = args[i]
            if name in _VALUED:
                counts[_VALUED[name]] = _count(_VALUED[name], given)
            elif name in _GPU_VALUED:
                key = _GPU_VALUED[name]
                gpus[key] = _gres_gpus(given) if key == "gres" else _gpu_count(name, given)
                gpu_options.append(f"{name}={given}")
            elif name in ("-w", "--nodelist"):
                nodelist = _nodelist(given)
            elif name == "--jobid":
                if job_id is not None and given != job_id:
                    raise SrunError(f"srun: error: --jobid={given}: this batch script's job is {job_id}; a step "
                                    "runs only on its own job's allocation in OnePlus")  # fmt: skip
                jobid = given
            elif name in ("-m", "--distribution"):
                _distribution(given)
            elif name == "--export":
                export = _export(given)
            elif name in ("-W", "--wait") and not (given.isascii() and given.isdigit()):
                raise SrunError(f"srun: error: {name}={given!r}: expected a number of seconds")
        elif name in _IGNORED_FLAGS:
            pass
        else:
            raise SrunError(f"srun: error: unrecognized option {arg!r} (OnePlus's srun takes -n, -N, "
                            "--ntasks-per-node, -w, -l, --export, --gpus, --exact and --overlap; see "
                            "docs/submitting.md)")  # fmt: skip
        i += 1
    argv = args[i:]
    if not argv:
        raise SrunError("srun: error: no command to run")
    if components > 1 and ":" in argv:
        # srun(1): ':' separates the components of a heterogeneous step; OnePlus runs one component per srun.
        raise SrunError("srun: error: ':' starts another component of a heterogeneous step (srun A : B), which "
                        "OnePlus does not run; start one srun per component (srun --het-group=N CMD &)")  # fmt: skip
    return SrunOptions(
        counts.get("ntasks"),
        counts.get("nodes"),
        counts.get("ntasks-per-node"),
        label,
        argv,
        nodelist=nodelist,
        jobid=jobid,
        export_all=export[0],
        export_names=export[1],
        export_set=export[2],
        exact="--exact" in flags,
        overlap="--overlap" in flags,
        gpus=GpuAsk(**gpus, option=" ".join(gpu_options)),
        cpus_per_task=counts.get("cpus-per-task"),
        het_group=het_group,
    )


# -- the step's layout ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepTask:
    procid: int
    node: str
    nodeid: int  # the node's index in the step's nodes (SLURM_NODEID)
    localid: int


def _step_nodes(opts: SrunOptions, nodes: Sequence[str]) -> tuple[list[str], int | None]:
    """The nodes a step may use, in the allocation's order, and how many it must use (None: up to the layout).
    -w/--nodelist: the named nodes all, and with -N past their number, the allocation's next ones (as Slurm)."""
    if opts.nodelist is None:
        return list(nodes), opts.nodes
    outside = [n for n in opts.nodelist if n not in nodes]
    if outside:
        raise SrunError(f"srun: error: --nodelist names {', '.join(outside)}, not in the job's allocation "
                        f"({', '.join(nodes)})")  # fmt: skip
    named = [n for n in nodes if n in opts.nodelist]
    if opts.nodes is not None and opts.nodes < len(named):
        raise SrunError(f"srun: error: --nodelist names {len(named)} nodes, more than -N/--nodes={opts.nodes}")
    if opts.nodes is None or opts.nodes == len(named):
        return named, len(named)
    extra = [n for n in nodes if n not in opts.nodelist][: opts.nodes - len(named)]
    chosen = set(named) | set(extra)
    return [n for n in nodes if n in chosen], opts.nodes


def plan_step(opts: SrunOptions, nodes: Sequence[str], capacity_per_node: int, job_ntasks: int) -> list[StepTask]:
    """The step's tasks, block-distributed: consecutive ranks fill the first nodes; refused past the allocation.
    SLURM_NODEID is the node's index in the step (0 on the step's first node)."""
    if not nodes:
        raise SrunError("srun: error: the job has no nodes")
    if opts.nodes is not None and opts.nodes > len(nodes):
        raise SrunError(f"srun: error: {opts.nodes} nodes asked for, the job's allocation has {len(nodes)}")
    nodes, n_nodes = _step_nodes(opts, nodes)
    if opts.ntasks_per_node is not None:
        if opts.ntasks_per_node > capacity_per_node:
            raise SrunError(
                f"srun: error: --ntasks-per-node={opts.ntasks_per_node} is more than the allocation's "
                f"{capacity_per_node} task(s) per node"
            )
        n_nodes = n_nodes or len(nodes)
        ntasks = opts.ntasks or n_nodes * opts.ntasks_per_node
    elif opts.ntasks is not None:
        ntasks = opts.ntasks
        n_nodes = n_nodes or min(len(nodes), ntasks)
    elif opts.nodes is None and opts.nodelist is None:
        n_nodes = len(nodes)
        ntasks = job_ntasks
    else:
        n_nodes = n_nodes or len(nodes)
        ntasks = n_nodes * capacity_per_node
    if ntasks < n_nodes:
        raise SrunError(f"srun: error: {ntasks} task(s) cannot run on {n_nodes} nodes (at least one per node)")
    per_node = [ntasks // n_nodes + (1 if i < ntasks % n_nodes else 0) for i in range(n_nodes)]
    if opts.ntasks_per_node is not None and max(per_node) > opts.ntasks_per_node:
        raise SrunError(f"srun: error: {ntasks} tasks do not fit {n_nodes} node(s) x {opts.ntasks_per_node} per node")
    if max(per_node) > capacity_per_node:
        raise SrunError(
            f"srun: error: {ntasks} tasks are more than the allocation: {n_nodes} node(s) x {capacity_per_node} "
            "task(s) per node"
        )
    tasks: list[StepTask] = []
    for nodeid, count in enumerate(per_node):
        for localid in range(count):
            tasks.append(StepTask(len(tasks), nodes[nodeid], nodeid, localid))
    return tasks


def tasks_per_node_text(counts: Sequence[int]) -> str:
    """Slurm's form of tasks per node: runs of equal counts as `N(xM)`, e.g. `8(x2),4`."""
    parts: list[str] = []
    i = 0
    while i < len(counts):
        j = i
        while j + 1 < len(counts) and counts[j + 1] == counts[i]:
            j += 1
        parts.append(f"{counts[i]}(x{j - i + 1})" if j > i else str(counts[i]))
        i = j + 1
    return ",".join(parts)


def task_environment(job_id: str, step_id: int, tasks: Sequence[StepTask], task: StepTask) -> dict[str, str]:
    """What srun gives one task, over its container's environment (the allocation's variables)."""
    step_nodes = list(dict.fromkeys(t.node for t in tasks))
    counts = [sum(1 for t in tasks if t.node == n) for n in step_nodes]
    on_node = counts[step_nodes.index(task.node)]
    return {
        "SLURM_JOB_ID": job_id,
        "SLURM_STEP_ID": str(step_id),
        "SLURM_STEPID": str(step_id),
        "SLURM_PROCID": str(task.procid),
        "SLURM_LOCALID": str(task.localid),
        "SLURM_NODEID": str(task.nodeid),
        "SLURMD_NODENAME": task.node,
        "SLURM_NTASKS": str(len(tasks)),
        "SLURM_NPROCS": str(len(tasks)),
        "SLURM_STEP_NUM_TASKS": str(len(tasks)),
        "SLURM_STEP_NUM_NODES": str(len(step_nodes)),
        "SLURM_NNODES": str(len(step_nodes)),
        "SLURM_STEP_NODELIST": ",".join(step_nodes),
        "SLURM_STEP_TASKS_PER_NODE": tasks_per_node_text(counts),
        "SLURM_TASKS_PER_NODE": tasks_per_node_text(counts),
        "SLURM_LOCAL_NODE_TASKS": str(on_node),
    }


# -- what travels between the executors ----------------------------------------------------------------------------


class Release(BaseModel):
    """The batch script ended: release the job's holders on the node (the body of `subjects.slurm_release`)."""

    model_config = ConfigDict(extra="forbid")
    job_id: str


# A node's share of a step, on that node (the batch node's own, directly; another's, over NATS): start it, ask for
# its output and end, signal it.
StepTransport = Callable[[str, StepOp], Awaitable[StepProgress]]
ReleaseTransport = Callable[[str, Release], Awaitable[None]]


async def release_holders(runtime: DockerRuntime, job_id: str) -> int:
    """SIGTERM the job's holders on this node (they exit 0); the batch container is left alone. How many."""
    released = 0
    try:
        containers = await runtime._current(job_id)
    except LookupError:
        return 0
    for c in containers:
        if c.identity.rank == 0 or c.state != "running":
            continue
        async with runtime._engine("releasing a holder"):
            with contextlib.suppress(Exception):
                await runtime._client().containers.container(c.id).kill(signal="SIGTERM")
                released += 1
    return released


# -- the batch node's step server ----------------------------------------------------------------------------------


def _read(path: Path) -> str:
    """A spool file the job wrote; never through a link (it could name a file of the host)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        data = f.read(MAX_ARG_BYTES + 1)
    if len(data) > MAX_ARG_BYTES:
        raise ValueError(f"{path.name} is over {MAX_ARG_BYTES} bytes")
    return data.decode("utf-8", "surrogateescape")


def _write(path: Path, text: str) -> None:
    """A new file, renamed over whatever the job may have put there (a rename replaces a link, not its target)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8", errors="surrogateescape") as f:
        f.write(text)
    os.replace(tmp, path)


_UNKNOWN = "\0"  # a value no variable has
# The batch shell's variables that are its own process's, never a task's.
_SHELL_OWN = frozenset({"HOSTNAME", "PWD", "OLDPWD", "SHLVL", "_", "PPID", "PS1", "PS2", "PS4", "IFS", "OPTIND"})
# The step's own (srun sets them per task; the shell's values are the batch step's).
_STEP_OWN_PREFIXES = ("SLURM_STEP", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURMD_NODENAME")
STEP_KILL_WAIT_S = 10.0  # the script ended: SIGTERM → SIGKILL for its steps still running (Slurm's KillWait)
BUSY = "srun: Job step creation temporarily disabled, retrying (Requested nodes are busy)\n"


class SpoolAnswer:
    """What srun prints, as it comes: numbered chunk files `<id>.o<n>` / `<id>.e<n>` (the shim prints each in
    turn and says in `<id>.read` how far it got; those are removed), then `<id>.rc`, last."""

    def __init__(self, spool: Path, rid: str) -> None:
        self.spool = spool
        self.rid = rid
        self.count = {"o": 0, "e": 0}
        self.removed = {"o": 0, "e": 0}

    def out(self, text: str) -> None:
        self._chunk("o", text)

    def err(self, text: str) -> None:
        self._chunk("e", text)

    def _chunk(self, kind: str, text: str) -> None:
        if not text:
            return
        try:
            _write(self.spool / f"{self.rid}.{kind}{self.count[kind]}", text)
            self.count[kind] += 1
        except OSError as e:
            log.warning("answering srun request %s failed: %s", self.rid, e)
        self._collect_read()

    def _collect_read(self) -> None:
        """Remove the chunks the shim says it has printed."""
        try:
            seen = _read(self.spool / f"{self.rid}.read").split()
            upto = {"o": int(seen[0]), "e": int(seen[1])}
        except (OSError, ValueError, IndexError):
            return
        for kind in ("o", "e"):
            while self.removed[kind] < min(upto[kind], self.count[kind]):
                with contextlib.suppress(OSError):
                    os.unlink(self.spool / f"{self.rid}.{kind}{self.removed[kind]}")
                self.removed[kind] += 1

    def finish(self, code: int) -> None:
        for left in (f"{self.rid}.req", f"{self.rid}.taken"):
            with contextlib.suppress(OSError):
                os.unlink(self.spool / left)
        try:
            _write(self.spool / f"{self.rid}.rc", f"{code}\n")  # last: the shim waits for this file
        except OSError as e:
            log.warning("answering srun request %s failed: %s", self.rid, e)


class _Labeller:
    """-l/--label: each whole line of a task's output prefixed `<procid>: ` (a partial line waits for its end)."""

    def __init__(self, label: bool) -> None:
        self.label = label
        self.partial: dict[tuple[int, str], str] = {}

    def feed(self, procid: int, stream: str, text: str) -> str:
        if not self.label:
            return text
        text = self.partial.pop((procid, stream), "") + text
        lines = text.splitlines(keepends=True)
        if lines and not lines[-1].endswith(("\n", "\r")):
            self.partial[(procid, stream)] = lines.pop()
        return "".join(f"{procid}: {line}" for line in lines)

    def flush(self, stream: str) -> str:
        rest = sorted((p, t) for (p, s), t in self.partial.items() if s == stream)
        for p, _ in rest:
            self.partial.pop((p, stream), None)
        return "".join(f"{p}: {t}\n" for p, t in rest)


def task_failure(node: str, procid: int, code: int) -> str:
    """srun's line for a task that did not exit 0 (as Slurm's srun writes it)."""
    if code > 128:
        try:
            name = _signal.Signals(code - 128).name
        except ValueError:
            name = f"signal {code - 128}"
        return f"srun: error: {node}: task {procid}: {_SIGNAL_WORDS.get(name, f'Killed by {name}')}\n"
    return f"srun: error: {node}: task {procid}: Exited with exit code {code}\n"


_SIGNAL_WORDS = {"SIGTERM": "Terminated", "SIGKILL": "Killed", "SIGINT": "Interrupt", "SIGSEGV": "Segmentation fault"}


@dataclass
class _Running:
    """A step the server runs: its nodes (to signal them) and whether the script's end stopped it."""

    step_id: int
    nodes: list[str]
    ended_by_script_end: bool = False


class StepServer:
    """Serves the srun requests of one batch job on its batch node, until its batch container ends.

    Each request runs as its own task: steps run side by side, each in its share of the allocation (`Shares`); one
    that does not fit waits for the running ones to release theirs."""

    def __init__(
        self,
        runtime: DockerRuntime,
        cmd: LaunchRanks,
        spool: Path,
        transport: StepTransport,
        release: ReleaseTransport,
    ) -> None:
        self.runtime = runtime
        self.cmd = cmd
        self.spool = spool
        self.transport = transport
        self.release = release
        self.next_step = 0
        self._start_env: dict[str, str] | None = None
        self.nodes = list(cmd.nodes or [cmd.node])
        spec = cmd.spec
        # Each heterogeneous component (the whole job when it has one) is an allocation of its own to steps.
        if spec.components is not None:
            self.groups = [_GroupSlots.of(g) for g in het_groups(cmd)]
        else:
            ntasks = spec.slurm.ntasks if spec.slurm is not None else cmd.world_size
            # The solver may pack a CPU-only job on fewer nodes than --nodes asked for: their tasks still fit.
            capacity = max(tasks_per_node(spec), -(-ntasks // len(self.nodes)))
            shares = Shares({n: capacity for n in self.nodes}, cpus_per_slot=max(1, math.ceil(spec.resources.cpus)))
            self.groups = [_GroupSlots(self.nodes, ntasks, capacity, shares, spec.resources.whole_gpus)]
        self.changed = asyncio.Condition()
        self.requests: dict[str, asyncio.Task[None]] = {}  # request id → its step, while it runs
        self.running: dict[int, _Running] = {}  # step id → the step, while its tasks run
        tasks = getattr(runtime, "slurm_tasks", None)
        self.records: NodeTasks | None = tasks if isinstance(tasks, NodeTasks) else None
        self._signalling: set[asyncio.Task[int]] = set()

    # The allocation of the batch script's component (the whole job when it has one): what a plain srun uses.
    @property
    def job_ntasks(self) -> int:
        return self.groups[0].ntasks

    @property
    def capacity(self) -> int:
        return self.groups[0].capacity

    @property
    def shares(self) -> Shares:
        return self.groups[0].shares

    @property
    def gpus_per_slot(self) -> int:
        return self.groups[0].gpus_per_slot

    @gpus_per_slot.setter
    def gpus_per_slot(self, value: int) -> None:
        self.groups[0].gpus_per_slot = value

    async def run(self) -> None:
        """Serve requests until the batch container has ended, end the steps still running, then release the holders
        (every node's).

        Cancelled (the executor stops), it releases nothing: the batch script may still run, and a restarted executor
        serves it again (`resume_step_server`)."""
        if self.records is not None:
            self.records.served.setdefault(self.cmd.job_id, asyncio.Event())
        try:
            while True:
                try:
                    await self._serve_until_the_batch_ends()
                    break
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("serving the srun requests of %s failed; serving them again", self.cmd.job_id)
                    await asyncio.sleep(1.0)
            try:
                await self.end_running_steps()
            except Exception:
                log.exception("%s: ending the steps still running failed", self.cmd.job_id)
            self._collect_acks()  # the last requests' answers, read once the script had ended
            await self._release_all()
        except asyncio.CancelledError:
            for task in self.requests.values():
                task.cancel()
            raise
        finally:
            if self.records is not None:
                self.records.served[self.cmd.job_id].set()

    async def _serve_until_the_batch_ends(self) -> None:
        self._answer_interrupted()
        polls = 0
        while polls % BATCH_CHECK_EVERY or await self._batch_running():
            polls += 1
            for req in sorted(self.spool.glob("*.req")):
                self._serve(req)
            self._collect_acks()
            await asyncio.sleep(POLL_S)

    async def _batch_running(self) -> bool:
        try:
            found = await self.runtime._current(self.cmd.job_id)
        except LookupError:
            return False
        return any(c.identity.rank == 0 and c.state in ("running", "created", "configured") for c in found)

    async def end_running_steps(self, kill_wait_s: float = STEP_KILL_WAIT_S) -> None:
        """The batch script ended: its steps still running end with it (as Slurm ends a job's steps with the job):
        SIGTERM to their tasks, SIGKILL after `kill_wait_s`."""
        requests = list(self.requests.values())
        if not requests:
            return
        for running in self.running.values():
            running.ended_by_script_end = True
        log.info("%s: the batch script ended with %d step(s) running: ending them", self.cmd.job_id, len(self.running))
        await self.signal_steps("SIGTERM")
        _, pending = await asyncio.wait(requests, timeout=kill_wait_s)
        if pending:
            await self.signal_steps("SIGKILL")
            _, pending = await asyncio.wait(pending, timeout=5.0)
        for task in pending:
            task.cancel()

    async def signal_steps(self, sig: str, step_id: int | None = None) -> int:
        """Signal the tasks of the running steps (of one, or all) on every node they run on."""
        targets = [r for r in self.running.values() if step_id is None or r.step_id == step_id]
        ops = [
            (node, StepSignal(job_id=self.cmd.job_id, step_id=r.step_id, signal=sig))
            for r in targets
            for node in r.nodes
        ]
        answers = await asyncio.gather(*(self._on(node, op) for node, op in ops))
        return sum(a.signalled for a in answers)

    async def _release_all(self) -> None:
        with contextlib.suppress(Exception):
            await release_holders(self.runtime, self.cmd.job_id)
        for node in self.nodes:
            if node == self.cmd.node:
                continue
            try:
                await self.release(node, Release(job_id=self.cmd.job_id))
            except Exception as e:
                log.warning("releasing the holders of %s on %s failed: %s", self.cmd.job_id, node, e)

    def _collect_acks(self) -> None:
        for ack in self.spool.glob("*.ack"):
            rid = ack.name[: -len(".ack")]
            if rid in self.requests:
                continue
            for f in self.spool.glob(f"{rid}.*"):
                with contextlib.suppress(OSError):
                    f.unlink()

    def _serve(self, req: Path) -> asyncio.Task[None] | None:
        """Take a request the shim has finished writing and run it beside the others; its task (None: not yet)."""
        rid = req.name[: -len(".req")]
        if rid in self.requests:
            return None
        try:
            lines = _read(req).splitlines()
        except OSError:
            return None
        if len(lines) < 2 or lines[-1] != "end":
            return None  # still being written
        answer = SpoolAnswer(self.spool, rid)
        try:
            argc = int(lines[0])
            args = [_read(self.spool / f"{rid}.arg{i}") for i in range(argc)]
            cwd = _read(self.spool / f"{rid}.cwd").strip() or None
            exported = self._exported(rid)
        except (OSError, ValueError) as e:
            answer.err(f"srun: error: the request could not be read: {e}\n")
            answer.finish(SRUN_USAGE_EXIT)
            return None
        # Taken before it runs: an executor restarted meanwhile answers it as interrupted, never runs it twice.
        with contextlib.suppress(OSError):
            os.replace(req, self.spool / f"{rid}.taken")

        async def serve() -> None:
            try:
                code = await self.step(args, cwd, exported, answer)
            except Exception as e:
                log.exception("%s: srun request %s failed", self.cmd.job_id, rid)
                answer.err(f"srun: error: {e}\n")
                code = 1
            answer.finish(code)

        task = asyncio.create_task(serve(), name=f"srun-request:{self.cmd.job_id}:{rid}")
        self.requests[rid] = task
        task.add_done_callback(lambda _t: self.requests.pop(rid, None))
        return task

    def _answer_interrupted(self) -> None:
        """Steps a previous executor took and did not answer: their srun fails (its tasks may have run)."""
        for taken in self.spool.glob("*.taken"):
            rid = taken.name[: -len(".taken")]
            if not (self.spool / f"{rid}.rc").exists():
                answer = SpoolAnswer(self.spool, rid)
                answer.err("srun: error: the node's executor restarted while this step ran; its outcome is unknown\n")
                answer.finish(1)

    def _exported(self, rid: str) -> dict[str, str] | None:
        """The environment srun ran with (`<id>.env`, NUL-separated NAME=value as /proc/self/environ has it); None
        from a shim that sent none."""
        try:
            text = _read(self.spool / f"{rid}.env")
        except FileNotFoundError:
            return None
        out: dict[str, str] = {}
        for item in text.split("\0"):
            name, eq, value = item.partition("=")
            if eq and name and "\n" not in name:
                out[name] = value
        return out

    def _batch_start_environment(self) -> dict[str, str]:
        """What the batch container started with (as the executor gave it): unchanged, such a variable is the
        container's own, and every task's container has its own value of it."""
        if self._start_env is None:
            from .environment import PLATFORM_KEYS, rank_environment

            topo = getattr(self.runtime, "topology", None)
            try:
                envs = rank_environment(self.cmd, topo, in_container=getattr(self.runtime, "gpu_node", True))
                batch = next(envs[p.rank] for p in self.cmd.ranks if is_batch_rank(p))
            except (ValueError, StopIteration) as e:
                # Not known: the platform's and the allocation's variables are then never passed.
                log.warning("%s: the batch container's environment is not known (%s)", self.cmd.job_id, e)
                batch = {k: _UNKNOWN for k in PLATFORM_KEYS}
                allocation = allocation_environment(self.cmd, RankPlacement(rank=0, node="-", gpus=[]))
                batch.update({k: _UNKNOWN for k in allocation})
            self._start_env = batch
        return self._start_env

    def passed_environment(self, opts: SrunOptions, exported: dict[str, str] | None) -> dict[str, str]:
        """The batch shell's variables a step's tasks get (Slurm's --export): all of them by default, the named ones
        with --export=NAME,..., none with NONE; NAME=value items set. Left out: what the shell did not change from
        the batch container's start (each task's container has its own value: RANK, CUDA_VISIBLE_DEVICES,
        SLURMD_NODENAME, ...) and the shell's own per-process ones."""
        exported = exported or {}
        start = self._batch_start_environment()
        names = exported if opts.export_all else opts.export_names
        picked = {k: exported[k] for k in names if k in exported}
        out = {
            k: v
            for k, v in picked.items()
            if k not in _SHELL_OWN and start.get(k) not in (v, _UNKNOWN) and not k.startswith(_STEP_OWN_PREFIXES)
        }
        out.update(dict(opts.export_set))
        return out

    # -- one step ----------------------------------------------------------------------------------------------

    def _layout(self, opts: SrunOptions, group: int = 0) -> list[StepTask]:
        """The step's tasks where it starts soonest: as asked, or (with neither -w nor every node) on the nodes free
        now first, so that `srun -N1 a &` then `srun -N1 b` run side by side on two nodes. On the nodes of one
        heterogeneous component (`group`; the whole job when it has one)."""
        g = self.groups[group]
        tasks = plan_step(opts, g.nodes, g.capacity, g.ntasks)
        if opts.cpus_per_task is not None and opts.cpus_per_task > g.shares.cpus_per_slot:
            raise SrunError(f"srun: error: --cpus-per-task={opts.cpus_per_task}: more CPUs per task than each of the "
                            f"allocation's tasks has ({g.shares.cpus_per_slot})")  # fmt: skip
        claim = _claim(opts, tasks)
        if opts.overlap or opts.nodelist is not None or g.shares.fits(claim):
            return tasks
        per_node = max(Counter(t.node for t in tasks).values())
        free = [n for n in g.nodes if g.shares.node_fits(n, per_node, claim)]
        if not free:
            return tasks
        order = free + [n for n in g.nodes if n not in free]
        try:
            moved = plan_step(opts, order, g.capacity, g.ntasks)
        except SrunError:
            return tasks
        return moved if g.shares.fits(_claim(opts, moved)) else tasks

    def _layouts(self, opts: SrunOptions) -> list[list[StepTask]]:
        """The step's tasks on each component it runs on (--het-group; component 0 without it, as Slurm)."""
        return [self._layout(opts, n) for n in (opts.het_group or (0,))]

    def _take(self, step_id: int, opts: SrunOptions, parts: list[list[StepTask]]) -> dict[str, tuple[int, ...]] | None:
        """Every component's share of the step, or none (it waits)."""
        groups = [self.groups[n] for n in (opts.het_group or (0,))]
        claims = [_claim(opts, tasks) for tasks in parts]
        if not all(g.shares.fits(c) for g, c in zip(groups, claims, strict=True)):
            return None
        slots: dict[str, tuple[int, ...]] = {}
        for g, c in zip(groups, claims, strict=True):
            slots.update(g.shares.take(step_id, c) or {})
        return slots

    async def step(
        self,
        args: list[str],
        cwd: str | None,
        exported: dict[str, str] | None = None,
        answer: SpoolAnswer | None = None,
    ) -> int:
        """Run one srun, printing what its tasks print as they print it (into `answer`); srun's exit status."""
        say = answer or SpoolAnswer(self.spool, "-")
        try:
            opts = parse_srun(args, job_id=self.cmd.job_id, components=len(self.groups))
            for n, part in zip(opts.het_group or (0,), self._layouts(opts), strict=True):
                g = self.groups[n]
                check_gpus(opts.gpus, Counter(t.node for t in part), g.gpus_per_slot, g.shares.slots_on)
        except (SrunError, GpuAskError) as e:
            say.err(f"{e}\n")
            return SRUN_USAGE_EXIT
        step_id = self.next_step
        self.next_step += 1
        waited = False
        async with self.changed:
            while True:
                parts = self._layouts(opts)
                slots = self._take(step_id, opts, parts)
                if slots is not None:
                    break
                if not waited:
                    say.err(BUSY)
                    waited = True
                await self.changed.wait()
        if waited:
            say.err(f"srun: Step created for StepId={self.cmd.job_id}.{step_id}\n")
        tasks = _one_step(parts)
        try:
            return await self._run_step(step_id, opts, tasks, slots, cwd, exported, say)
        finally:
            async with self.changed:
                for g in self.groups:
                    g.shares.release(step_id)
                self.changed.notify_all()

    async def _run_step(
        self,
        step_id: int,
        opts: SrunOptions,
        tasks: list[StepTask],
        slots: dict[str, tuple[int, ...]],
        cwd: str | None,
        exported: dict[str, str] | None,
        say: SpoolAnswer,
    ) -> int:
        passed = self.passed_environment(opts, exported)
        by_node: dict[str, NodeStep] = {}
        for t in tasks:
            ns = by_node.setdefault(
                t.node,
                NodeStep(job_id=self.cmd.job_id, step_id=step_id, argv=opts.argv, cwd=cwd, tasks=[], env=passed),
            )
            held = slots[t.node]
            ns.tasks.append(
                TaskRun(
                    procid=t.procid,
                    localid=t.localid,
                    slot=held[t.localid % len(held)],
                    env=task_environment(self.cmd.job_id, step_id, tasks, t),
                )
            )
        running = _Running(step_id, list(by_node))
        self.running[step_id] = running
        labels = _Labeller(opts.label)
        results: dict[int, TaskResult] = {}
        where: dict[int, str] = {t.procid: t.node for t in tasks}
        errors: list[str] = []
        try:
            started = await asyncio.gather(*(self._on(node, ns) for node, ns in by_node.items()))
            since = {node: 0 for node in by_node}
            open_nodes = set()
            for node, reply in zip(by_node, started, strict=True):
                if reply.error:
                    errors.append(f"{reply.error} (node {node})\n")
                    say.err(errors[-1])
                else:
                    open_nodes.add(node)
            pause = POLL_S
            while open_nodes:
                self._forward_signals(say.rid, step_id)
                polled = await asyncio.gather(
                    *(
                        self._on(n, StepPoll(job_id=self.cmd.job_id, step_id=step_id, since=since[n]))
                        for n in open_nodes
                    )
                )
                for node, progress in zip(list(open_nodes), polled, strict=True):
                    out = "".join(labels.feed(c.procid, "out", c.text) for c in progress.chunks if c.stream == "out")
                    err = "".join(labels.feed(c.procid, "err", c.text) for c in progress.chunks if c.stream == "err")
                    say.out(out)
                    say.err(err)
                    since[node] = progress.next
                    if progress.done:
                        open_nodes.discard(node)
                        if progress.error:
                            errors.append(f"{progress.error} (node {node})\n")
                            say.err(errors[-1])
                        for r in progress.results:
                            results[r.procid] = r
                if open_nodes:
                    # A quiet step is asked less often (up to once a second); output brings the pace back.
                    pause = POLL_S if any(p.chunks for p in polled) else min(pause * 2, QUIET_POLL_S)
                    await asyncio.sleep(pause)
        finally:
            self.running.pop(step_id, None)
        say.out(labels.flush("out"))
        say.err(labels.flush("err"))
        for p in sorted(results):
            if results[p].exit_code != 0:
                say.err(task_failure(where[p], p, results[p].exit_code))
        missing = [t.procid for t in tasks if t.procid not in results]
        codes = [r.exit_code for r in results.values()] + ([1] if missing or errors else [])
        code = max(codes, default=0)
        end = StepEnd(step_id, code, running.ended_by_script_end)
        log.info("%s: srun step %s", self.cmd.job_id, end.describe())
        if self.records is not None:
            self.records.record_end(self.cmd.job_id, end)
        return code

    def _forward_signals(self, rid: str, step_id: int) -> None:
        """Signals the batch script sent to this srun (the shim writes `<id>.sig<n>`): to the step's tasks, as srun
        forwards them."""
        for sig in sorted(self.spool.glob(f"{rid}.sig*")):
            try:
                name = _read(sig).strip()
            except (OSError, ValueError):
                continue
            finally:
                with contextlib.suppress(OSError):
                    os.unlink(sig)
            if name:
                task = asyncio.create_task(self.signal_steps(name, step_id), name=f"srun-signal:{rid}")
                self._signalling.add(task)
                task.add_done_callback(self._signalling.discard)

    async def _on(self, node: str, op: StepOp) -> StepProgress:
        try:
            if node == self.cmd.node and self.records is not None:
                return await serve_op(self.records, op)
            return await self.transport(node, op)
        except Exception as e:
            done = not isinstance(op, StepSignal)
            return StepProgress(done=done, error=f"srun: error: the step's tasks on {node} did not run: {e}")


@dataclass
class _GroupSlots:
    """One heterogeneous component's part of the allocation as steps share it (the whole job when it has one)."""

    nodes: list[str]
    ntasks: int
    capacity: int  # task slots per node
    shares: Shares
    gpus_per_slot: int

    @classmethod
    def of(cls, g: HetGroup) -> _GroupSlots:
        nodes = g.nodes or ["-"]
        capacity = max(g.ntasks_per_node, -(-g.ntasks // len(nodes)))
        shares = Shares({n: capacity for n in nodes}, cpus_per_slot=max(1, math.ceil(g.resources.cpus)))
        return cls(nodes, g.ntasks, capacity, shares, g.resources.whole_gpus)


def _one_step(parts: list[list[StepTask]]) -> list[StepTask]:
    """A step over several components is one step: task ids and node ids run on from one component to the next."""
    if len(parts) == 1:
        return parts[0]
    out: list[StepTask] = []
    nodes = 0
    for tasks in parts:
        for t in tasks:
            out.append(StepTask(len(out), t.node, nodes + t.nodeid, t.localid))
        nodes += len({t.node for t in tasks})
    return out


def _claim(opts: SrunOptions, tasks: Sequence[StepTask]) -> StepClaim:
    counts: dict[str, int] = {}
    for t in tasks:
        counts[t.node] = counts.get(t.node, 0) + 1
    gpus = any(v for v in (opts.gpus.total, opts.gpus.per_task, opts.gpus.per_node, opts.gpus.gres))
    return StepClaim(counts, opts.exact, opts.overlap, opts.cpus_per_task or 1, gpus)


# -- over the platform: the executors' request subjects ------------------------------------------------------------

STEP_REQUEST_TIMEOUT_S = 30.0  # start, poll and signal answer at once (the engine's exec start at most)
RELEASE_TIMEOUT_S = 10.0


class _Requester(Protocol):
    async def request(self, subject: str, payload: bytes = b"", timeout: float = 0.5) -> Any: ...


def _result(data: bytes) -> dict[str, Any]:
    answer = json.loads(data)
    if not answer.get("ok"):
        raise RuntimeError(answer.get("error") or "the executor refused the request")
    result: dict[str, Any] = answer.get("result") or {}
    return result


def nats_transports(nc: _Requester) -> tuple[StepTransport, ReleaseTransport]:
    """The batch node's way to the other nodes' executors (`subjects.slurm_step`, `subjects.slurm_release`)."""

    async def transport(node: str, op: StepOp) -> StepProgress:
        msg = await nc.request(subjects.slurm_step(node), op.model_dump_json().encode(), timeout=STEP_REQUEST_TIMEOUT_S)
        return StepProgress.model_validate(_result(msg.data))

    async def release(node: str, rel: Release) -> None:
        msg = await nc.request(subjects.slurm_release(node), rel.model_dump_json().encode(), timeout=RELEASE_TIMEOUT_S)
        _result(msg.data)

    return transport, release


def _body(payload: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in payload.items() if k != "team"}  # the ops adapter stamps the caller's team


async def serve_node_step(runtime: object, payload: dict[str, Any]) -> StepProgress:
    """A peer's answer to `subjects.slurm_step(node)`: start, poll or signal this node's tasks of a step."""
    op = parse_op(_body(payload))
    if not _is_docker(runtime):
        return StepProgress(done=True, error="srun: error: this node's runtime cannot run step tasks (the container "
                            "runtime can)")  # fmt: skip
    return await serve_op(runtime.slurm_tasks, op)


async def serve_release(runtime: object, payload: dict[str, Any]) -> dict[str, int]:
    """A peer's answer to `subjects.slurm_release(node)`: the batch script ended, its holders here exit."""
    rel = Release.model_validate(_body(payload))
    if not _is_docker(runtime):
        return {"released": 0}
    return {"released": await release_holders(runtime, rel.job_id)}


def _is_docker(runtime: object) -> TypeGuard[DockerRuntime]:
    from .docker import DockerRuntime

    return isinstance(runtime, DockerRuntime)


_SERVING: dict[tuple[int, str, int], asyncio.Task[None]] = {}  # (runtime, job, token) → its step server


def start_step_server(runtime: object, cmd: LaunchRanks, nc: Callable[[], _Requester]) -> asyncio.Task[None] | None:
    """On the batch node of a batch job, after its launch: serve its srun requests until the batch script ends.
    The launch is kept on the host, so that a restarted executor serves them again (`resume_step_server`)."""
    if not is_batch_job(cmd.spec) or not any(is_batch_rank(p) for p in cmd.ranks) or not _is_docker(runtime):
        return None
    key = (id(runtime), cmd.job_id, cmd.token)
    running = _SERVING.get(key)
    if running is not None and not running.done():
        return None
    saved = _launch_file(runtime.slurm_spool_root, cmd.job_id, cmd.token)
    try:
        if not saved.exists():
            saved.parent.mkdir(parents=True, exist_ok=True)
            saved.write_text(cmd.model_dump_json())
    except OSError as e:
        log.warning("keeping the launch of %s for a restart failed: %s", cmd.job_id, e)
    transport, release = nats_transports(nc())
    spool = spool_dir(runtime.slurm_spool_root, cmd.job_id, cmd.token)
    server = StepServer(runtime, cmd, spool, transport, release)
    task = asyncio.create_task(server.run(), name=f"srun:{cmd.job_id}")
    _SERVING[key] = task
    task.add_done_callback(lambda _t: _SERVING.pop(key, None) if _SERVING.get(key) is _t else None)
    return task


def resume_step_server(
    runtime: object, job_id: str, token: int, nc: Callable[[], _Requester]
) -> asyncio.Task[None] | None:
    """After an executor restart, for ranks it adopts: the step server of a batch job whose batch node this is."""
    if not _is_docker(runtime):
        return None
    saved = _launch_file(runtime.slurm_spool_root, job_id, token)
    try:
        cmd = LaunchRanks.model_validate_json(saved.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        log.warning("the kept launch of %s (token %s) cannot be read: %s", job_id, token, e)
        return None
    if runtime.node is not None and cmd.node != runtime.node:
        return None  # another node's, in a spool folder they share
    return start_step_server(runtime, cmd, nc)
