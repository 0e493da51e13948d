"""Slurm batch semantics on the container runtime: the batch script runs once, `srun` starts step tasks.

A job of framework "sbatch" has one container per rank, as every job. The container of rank 0 (on the first node of
the allocation) runs the batch script with the Slurm batch environment; every other container holds its share of the
allocation (GPUs, CPUs, memory) running `holder_command()`, a shell that waits to be released.

`srun` in the batch script is a POSIX sh shim (slurm_bin/srun), bind-mounted read-only into every container of the
job and first on PATH. It writes its arguments into a spool directory the executor mounted into the batch container
(no network is needed: CPU-only containers have none) and waits for the result. `StepServer`, run by the executor of
the batch node, parses the options (`parse_srun`), lays the tasks out over the job's nodes (`plan_step`), gives each
task its environment (`task_environment`) and has each node run its tasks inside the job's containers there through
the engine's exec API (`run_tasks`): its own node directly, the others through a `StepTransport` (the executors'
NATS request subjects, `subjects.slurm_step`). The worst task's exit status is srun's.

When the batch container ends, the holders are released (`release_holders`, `subjects.slurm_release` for the other
nodes): they exit 0, so the job's outcome is the batch script's.

One step runs at a time; its output is printed when its tasks have ended, task by task (not interleaved live).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import shutil
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeGuard

from oneplus_contracts import JobSpec, LaunchRanks, RankPlacement, subjects
from oneplus_contracts.slurm import expand_hostlist
from pydantic import BaseModel, ConfigDict, Field

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
    if spec.resources.whole_gpus and gpus_here:  # a job without GPUs (its 0.001 share) has none, as in Slurm
        env["SLURM_GPUS_ON_NODE"] = str(gpus_here)
    if slurm is not None and slurm.cpus_per_task:
        env["SLURM_CPUS_PER_TASK"] = str(slurm.cpus_per_task)
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


_VALUED = {"-n": "ntasks", "--ntasks": "ntasks", "-N": "nodes", "--nodes": "nodes"}
_VALUED.update({"--ntasks-per-node": "ntasks-per-node"})
# Options taking a value that OnePlus reads itself (beside the counts above).
_READ_VALUED = {"-w", "--nodelist", "--jobid", "-m", "--distribution", "--export", "-W", "--wait"}
# Accepted and without effect here (the step runs in the job's containers as they are).
_IGNORED_VALUED = {"-J", "--job-name", "--mpi", "--cpu-bind", "-c", "--cpus-per-task"}
_IGNORED_FLAGS = {"--exact", "--overlap", "-u", "--unbuffered", "-K", "--kill-on-bad-exit"}
# Short options whose value may be glued on (-n4, -wnode1).
_SHORT_VALUED = ("-n", "-N", "-J", "-c", "-w", "-m", "-W")
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


def parse_srun(args: Sequence[str], job_id: str | None = None) -> SrunOptions:
    """srun's command line: the options OnePlus honours (-n, -N, --ntasks-per-node, -w, -l, --export, ...), then
    the task's command. `job_id`, when given, is the job's: --jobid naming another job is refused."""
    counts: dict[str, int] = {}
    label = False
    nodelist: tuple[str, ...] | None = None
    jobid: str | None = None
    export: tuple[bool, tuple[str, ...], tuple[tuple[str, str], ...]] = (True, (), ())
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
        elif name in _VALUED or name in _IGNORED_VALUED or name in _READ_VALUED:
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
                            "--ntasks-per-node, -w, -l and --export; see docs/submitting.md)")  # fmt: skip
        i += 1
    argv = args[i:]
    if not argv:
        raise SrunError("srun: error: no command to run")
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


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TaskRun(_Model):
    procid: int
    localid: int
    env: dict[str, str]


class NodeStep(_Model):
    """The tasks of one step that one node runs (the body of `subjects.slurm_step(node)`)."""

    job_id: str
    step_id: int
    argv: list[str]
    cwd: str | None = None
    tasks: list[TaskRun]
    # The batch shell's exported variables the step passes (--export), once for all tasks; each task's own `env`
    # (its SLURM_* step identity) is laid over them.
    env: dict[str, str] = Field(default_factory=dict)


class TaskResult(_Model):
    procid: int
    exit_code: int
    stdout: str = ""
    stderr: str = ""


class NodeStepReply(_Model):
    results: list[TaskResult] = Field(default_factory=list)
    error: str | None = None


class Release(_Model):
    """The batch script ended: release the job's holders on the node (the body of `subjects.slurm_release`)."""

    job_id: str


# Run a node's share of a step on that node (the batch node's own, directly; another's, over NATS).
StepTransport = Callable[[str, NodeStep], Awaitable[NodeStepReply]]
ReleaseTransport = Callable[[str, Release], Awaitable[None]]


# -- running tasks in the containers -------------------------------------------------------------------------------


async def run_tasks(runtime: DockerRuntime, step: NodeStep) -> NodeStepReply:
    """Run the step's tasks of this node, each inside the job's container of local rank (localid mod containers)."""
    try:
        containers = sorted(await runtime._current(step.job_id), key=lambda c: c.identity.local_rank)
    except LookupError as e:
        return NodeStepReply(error=f"srun: error: {e}")
    live = [c for c in containers if c.state == "running"]
    if not live:
        return NodeStepReply(error=f"srun: error: job {step.job_id} holds no running container on {runtime.node}")
    results = await asyncio.gather(
        *(_exec(runtime, live[t.localid % len(live)].id, step, t) for t in step.tasks), return_exceptions=True
    )
    out: list[TaskResult] = []
    for t, r in zip(step.tasks, results, strict=True):
        if isinstance(r, BaseException):
            out.append(TaskResult(procid=t.procid, exit_code=127, stderr=f"srun: error: task {t.procid}: {r}\n"))
        else:
            out.append(r)
    return NodeStepReply(results=out)


async def _exec(runtime: DockerRuntime, cid: str, step: NodeStep, task: TaskRun) -> TaskResult:
    async with runtime._engine("running a step task") as docker:
        container = docker.containers.container(cid)
        kwargs: dict[str, Any] = {"environment": {**step.env, **task.env}}
        if step.cwd:
            kwargs["workdir"] = step.cwd
        ex = await container.exec(step.argv, stdout=True, stderr=True, **kwargs)
        out: list[bytes] = []
        err: list[bytes] = []
        async with ex.start(detach=False) as stream:
            while (msg := await stream.read_out()) is not None:
                (err if msg.stream == 2 else out).append(msg.data)
        code: int | None = None
        for _ in range(100):  # the engine may report the exit a moment after the output ends
            info = await ex.inspect()
            if not info.get("Running") and info.get("ExitCode") is not None:
                code = int(info["ExitCode"])
                break
            await asyncio.sleep(0.05)
    text = b"".join(out).decode("utf-8", "replace")
    etext = b"".join(err).decode("utf-8", "replace")
    return TaskResult(procid=task.procid, exit_code=127 if code is None else code, stdout=text, stderr=etext)


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


def _labelled(text: str, procid: int, label: bool) -> str:
    if not label or not text:
        return text
    return "".join(f"{procid}: {line}" for line in text.splitlines(keepends=True))


class StepServer:
    """Serves the srun requests of one batch job on its batch node, until its batch container ends."""

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

    async def run(self) -> None:
        """Serve requests until the batch container has ended, then release the holders (every node's).

        Cancelled (the executor stops), it releases nothing: the batch script may still run, and a restarted executor
        serves it again (`resume_step_server`)."""
        while True:
            try:
                await self._serve_until_the_batch_ends()
                break
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("serving the srun requests of %s failed; serving them again", self.cmd.job_id)
                await asyncio.sleep(1.0)
        await self._release_all()

    async def _serve_until_the_batch_ends(self) -> None:
        self._answer_interrupted()
        polls = 0
        while polls % BATCH_CHECK_EVERY or await self._batch_running():
            polls += 1
            for req in sorted(self.spool.glob("*.req")):
                await self._serve(req)
            self._collect_acks()
            await asyncio.sleep(POLL_S)

    async def _batch_running(self) -> bool:
        try:
            found = await self.runtime._current(self.cmd.job_id)
        except LookupError:
            return False
        return any(c.identity.rank == 0 and c.state in ("running", "created", "configured") for c in found)

    async def _release_all(self) -> None:
        with contextlib.suppress(Exception):
            await release_holders(self.runtime, self.cmd.job_id)
        for node in self.cmd.nodes:
            if node == self.cmd.node:
                continue
            try:
                await self.release(node, Release(job_id=self.cmd.job_id))
            except Exception as e:
                log.warning("releasing the holders of %s on %s failed: %s", self.cmd.job_id, node, e)

    def _collect_acks(self) -> None:
        for ack in self.spool.glob("*.ack"):
            rid = ack.name[: -len(".ack")]
            for f in self.spool.glob(f"{rid}.*"):
                with contextlib.suppress(OSError):
                    f.unlink()

    async def _serve(self, req: Path) -> None:
        rid = req.name[: -len(".req")]
        try:
            lines = _read(req).splitlines()
        except OSError:
            return
        if len(lines) < 2 or lines[-1] != "end":
            return  # still being written
        try:
            argc = int(lines[0])
            args = [_read(self.spool / f"{rid}.arg{i}") for i in range(argc)]
            cwd = _read(self.spool / f"{rid}.cwd").strip() or None
            exported = self._exported(rid)
        except (OSError, ValueError) as e:
            out, err, code = "", f"srun: error: the request could not be read: {e}\n", SRUN_USAGE_EXIT
        else:
            # Taken before it runs: an executor restarted meanwhile answers it as interrupted, never runs it twice.
            with contextlib.suppress(OSError):
                os.replace(req, self.spool / f"{rid}.taken")
            out, err, code = await self.step(args, cwd, exported)
        self._answer(rid, out, err, code)

    def _answer(self, rid: str, out: str, err: str, code: int) -> None:
        for left in (f"{rid}.req", f"{rid}.taken"):
            with contextlib.suppress(OSError):
                os.unlink(self.spool / left)
        try:
            _write(self.spool / f"{rid}.out", out)
            _write(self.spool / f"{rid}.err", err)
            _write(self.spool / f"{rid}.rc", f"{code}\n")  # last: the shim waits for this file
        except OSError as e:
            log.warning("%s: answering srun request %s failed: %s", self.cmd.job_id, rid, e)

    def _answer_interrupted(self) -> None:
        """Steps a previous executor took and did not answer: their srun fails (its tasks may have run)."""
        for taken in self.spool.glob("*.taken"):
            rid = taken.name[: -len(".taken")]
            if not (self.spool / f"{rid}.rc").exists():
                why = "srun: error: the node's executor restarted while this step ran; its outcome is unknown\n"
                self._answer(rid, "", why, 1)

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

    async def step(
        self, args: list[str], cwd: str | None, exported: dict[str, str] | None = None
    ) -> tuple[str, str, int]:
        """Run one srun: (stdout, stderr, exit status)."""
        spec = self.cmd.spec
        try:
            opts = parse_srun(args, job_id=self.cmd.job_id)
            ntasks = spec.slurm.ntasks if spec.slurm is not None else self.cmd.world_size
            nodes = self.cmd.nodes or [self.cmd.node]
            # The solver may pack a CPU-only job on fewer nodes than --nodes asked for: their tasks still fit.
            capacity = max(tasks_per_node(spec), -(-ntasks // len(nodes)))
            tasks = plan_step(opts, nodes, capacity, ntasks)
        except SrunError as e:
            return "", f"{e}\n", SRUN_USAGE_EXIT
        step_id = self.next_step
        self.next_step += 1
        passed = self.passed_environment(opts, exported)
        by_node: dict[str, NodeStep] = {}
        for t in tasks:
            ns = by_node.setdefault(
                t.node,
                NodeStep(job_id=self.cmd.job_id, step_id=step_id, argv=opts.argv, cwd=cwd, tasks=[], env=passed),
            )
            ns.tasks.append(
                TaskRun(procid=t.procid, localid=t.localid, env=task_environment(self.cmd.job_id, step_id, tasks, t))
            )
        replies = await asyncio.gather(*(self._on(node, ns) for node, ns in by_node.items()))
        results: dict[int, TaskResult] = {}
        errors: list[str] = []
        for node, reply in zip(by_node, replies, strict=True):
            if reply.error:
                errors.append(f"{reply.error} (node {node})\n")
            for r in reply.results:
                results[r.procid] = r
        out = "".join(_labelled(results[p].stdout, p, opts.label) for p in sorted(results))
        err = "".join(_labelled(results[p].stderr, p, opts.label) for p in sorted(results)) + "".join(errors)
        missing = [t.procid for t in tasks if t.procid not in results]
        codes = [r.exit_code for r in results.values()] + ([1] if missing or errors else [])
        return out, err, max(codes, default=0)

    async def _on(self, node: str, step: NodeStep) -> NodeStepReply:
        try:
            if node == self.cmd.node:
                return await run_tasks(self.runtime, step)
            return await self.transport(node, step)
        except Exception as e:
            return NodeStepReply(error=f"srun: error: the step's tasks on {node} did not run: {e}")


# -- over the platform: the executors' request subjects ------------------------------------------------------------

STEP_TIMEOUT_S = 7 * 24 * 3600.0  # a step may run as long as its job; a peer that never answers ends with the job
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

    async def transport(node: str, step: NodeStep) -> NodeStepReply:
        msg = await nc.request(subjects.slurm_step(node), step.model_dump_json().encode(), timeout=STEP_TIMEOUT_S)
        return NodeStepReply.model_validate(_result(msg.data))

    async def release(node: str, rel: Release) -> None:
        msg = await nc.request(subjects.slurm_release(node), rel.model_dump_json().encode(), timeout=RELEASE_TIMEOUT_S)
        _result(msg.data)

    return transport, release


def _body(payload: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in payload.items() if k != "team"}  # the ops adapter stamps the caller's team


async def serve_node_step(runtime: object, payload: dict[str, Any]) -> NodeStepReply:
    """A peer's answer to `subjects.slurm_step(node)`: run this node's tasks of the step."""
    step = NodeStep.model_validate(_body(payload))
    if not _is_docker(runtime):
        return NodeStepReply(error="srun: error: this node's runtime cannot run step tasks (the container runtime can)")
    return await run_tasks(runtime, step)


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
