"""An sbatch script (its `#SBATCH` directives, overridden by command-line options) as a JobSpec.

Rank rule: a GPU job has one rank per node with the node's GPUs, unless --ntasks-per-node (or --ntasks)
splits each node's GPUs evenly among its tasks, then one rank per task. A job with no GPU has one rank per task.
"""

from __future__ import annotations

import re
import signal as _signal
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any

from .errors import JobFormatError, Translation, spec_from_fields
from .gang import CPU_ONLY_GPU_SHARE, cpu_only_remark
from .priorities import priority_of
from .quantities import slurm_memory_mb, slurm_time_s
from .sbatch_options import UNUSED, Option, parse_tokens, script_directives

_NAME_BAD = re.compile(r"[^A-Za-z0-9._-]+")
_GPU_SPEC = re.compile(r"^(?:([A-Za-z][\w.-]*):)?(\d+)$")
OUTPUT_LABEL = "slurm/output"


@dataclass
class _Job:
    """The merged options, read one by one; whatever is used is removed so leftovers can be reported."""

    options: dict[str, Option]
    filename: str
    warnings: list[str] = field(default_factory=list)

    def has(self, name: str) -> bool:
        return name in self.options

    def raw(self, name: str) -> Option | None:
        return self.options.get(name)

    def fail(self, opt: Option, problem: str) -> JobFormatError:
        return JobFormatError(f"{opt}: {problem}", filename=self.filename, where=opt.where)

    def warn(self, opt: Option, remark: str) -> None:
        self.warnings.append(f"{opt.where}: {opt}: {remark}")

    def value(self, name: str) -> str | None:
        opt = self.options.get(name)
        return None if opt is None else (opt.value or "")

    def count(self, name: str, *, minimum: int = 1) -> int | None:
        opt = self.options.get(name)
        if opt is None:
            return None
        text = (opt.value or "").strip()
        if not text.isdigit():
            raise self.fail(opt, "must be a whole number")
        n = int(text)
        if n < minimum or n > 1_000_000:
            raise self.fail(opt, f"must be between {minimum} and 1000000")
        return n


def _merge(script: str, cli_args: Sequence[str], filename: str) -> tuple[dict[str, Option], list[str]]:
    try:
        found = script_directives(script)
        cli, rest = parse_tokens(list(cli_args), "command line", stop_at_positional=False)
    except JobFormatError as exc:
        raise JobFormatError(exc.problem, filename=filename, where=exc.where) from None
    merged: dict[str, Option] = {}
    for opt in [*found, *cli]:  # later wins: the command line overrides the script
        if opt.name == "no-requeue":  # one setting, two spellings: the last one given counts
            opt = Option("requeue", "no", opt.where, opt.spelled)
        merged[opt.name] = opt
    return merged, rest


def parse_sbatch(
    script: str, cli_args: Sequence[str] = (), *, filename: str = "<stdin>", script_args: Sequence[str] = ()
) -> Translation:
    """Translate an sbatch script; `cli_args` are sbatch options that override the script's directives.

    `script_args` are the arguments after the script on sbatch's command line ($1, $2, ... inside the script).
    """
    if script.strip() and not script.lstrip("\ufeff").startswith("#!"):
        raise JobFormatError(
            "this does not look like a batch script: the first line must start with #! followed by the path to an "
            "interpreter",
            filename=filename,
            where="line 1",
        )
    options, _ = _merge(script.lstrip("\ufeff"), cli_args, filename)
    job = _Job(options, filename)
    fields: dict[str, Any] = {}
    _check_conflicts(job)
    _identity(job, fields, script, list(script_args))
    _gang(job, fields)
    _limits(job, fields)
    _report_unused(job)
    spec = spec_from_fields(fields, filename=filename, origin=_origin(job))
    return Translation(spec=spec, warnings=job.warnings, kind="sbatch")


def _origin(job: _Job) -> dict[str, str]:
    """Where each JobSpec field came from, for error messages."""
    names = {
        "name": "job-name",
        "queue": "partition",
        "team": "account",
        "time_limit_s": "time",
        "checkpoint": "signal",
    }
    out: dict[str, str] = {}
    for field_name, option in names.items():
        opt = job.raw(option)
        if opt is not None:
            out[field_name] = f"{opt.where}: {opt}"
    return out


def _check_conflicts(job: _Job) -> None:
    """The combinations Slurm itself refuses."""
    gres = job.raw("gres")
    gpn = job.raw("gpus-per-node")
    if gres is not None and gpn is not None and "gpu" in (gres.value or ""):
        raise job.fail(gpn, "--gres=gpu and --gpus-per-node are mutually exclusive (sbatch(1))")
    mems = [job.raw(n) for n in ("mem", "mem-per-cpu", "mem-per-gpu")]
    given = [m for m in mems if m is not None]
    if len(given) > 1:
        raise job.fail(
            given[1], f"--mem, --mem-per-cpu and --mem-per-gpu are mutually exclusive (also given: {given[0]})"
        )
    exclusive, over = job.raw("exclusive"), job.raw("oversubscribe")
    if exclusive is not None and over is not None:
        raise job.fail(over, "--exclusive and --oversubscribe are mutually exclusive")
    cpt, cpg = job.raw("cpus-per-task"), job.raw("cpus-per-gpu")
    if cpt is not None and cpg is not None:
        raise job.fail(cpg, "--cpus-per-task and --cpus-per-gpu are mutually exclusive")
    array = job.raw("array")
    if array is not None:
        raise job.fail(array, "job arrays are not supported; submit one job per array element")


def _identity(job: _Job, fields: dict[str, Any], script: str, script_args: list[str]) -> None:
    """Name, queue, priority, team, image, command and output."""
    name = job.value("job-name")
    fields["name"] = name if name is not None else _default_name(job.filename)
    partition = job.raw("partition")
    if partition is not None:
        parts = [p for p in (partition.value or "").split(",") if p]
        if not parts:
            raise job.fail(partition, "needs a partition name")
        if len(parts) > 1:
            job.warn(partition, f"OnePlus queues a job in one queue; using {parts[0]!r}")
        fields["queue"] = parts[0]
    qos = job.raw("qos")
    if qos is not None:
        first = (qos.value or "").split(",")[0]
        try:
            fields["priority"] = priority_of(first)
        except ValueError as exc:
            raise job.fail(qos, str(exc)) from None
        fields["priority_class"] = first
    account = job.value("account")
    if account:
        fields["team"] = account
    image = job.value("container-image")
    if image:
        fields["image"] = image
    output = job.value("output")
    if output:
        fields["labels"] = {OUTPUT_LABEL: output}
    wrap = job.value("wrap")
    if wrap is not None:
        if script.strip():
            raise job.fail(job.options["wrap"], "--wrap replaces the script; give one or the other")
        fields["command"] = ["/bin/sh", "-c", wrap]
    elif script.strip():
        interpreter = script.lstrip("\ufeff").splitlines()[0][2:].split()
        # `sh -c SCRIPT NAME ARGS...`: the script sees NAME as $0 and ARGS as $1...
        fields["command"] = [*(interpreter or ["/bin/sh"]), "-c", script, fields["name"], *script_args]
    else:
        raise JobFormatError("no batch script: give a script or --wrap", filename=job.filename)
    if job.value("requeue") == "no":
        fields["preemptible"] = False  # a job that must not be requeued cannot be preempted and resumed


def _default_name(filename: str) -> str:
    stem = PurePath(filename).name if filename and not filename.startswith("<") else "sbatch"
    cleaned = _NAME_BAD.sub("-", stem).strip("-.") or "sbatch"
    return cleaned[:128]


def _gpu_spec(job: _Job, name: str) -> tuple[str | None, int] | None:
    """`[type:]count` of --gpus, --gpus-per-node, --gpus-per-task."""
    opt = job.raw(name)
    if opt is None:
        return None
    text = (opt.value or "").strip()
    if "," in text:
        raise job.fail(opt, "several GPU types per job are not supported; ask for one type")
    m = _GPU_SPEC.match(text)
    if not m:
        raise job.fail(opt, "expected [type:]count, e.g. 8 or h100:8")
    return m.group(1), int(m.group(2))


def _gres_gpus(job: _Job) -> tuple[str | None, int] | None:
    """GPUs per node from --gres=gpu[:type][:count][,other...]; other generic resources are reported."""
    opt = job.raw("gres")
    if opt is None:
        return None
    result: tuple[str | None, int] | None = None
    for entry in (opt.value or "").split(","):
        entry = entry.strip()
        if not entry or entry == "none":
            continue
        parts = entry.split(":")
        if parts[0] != "gpu":
            job.warn(opt, f"generic resource {parts[0]!r} is not used by OnePlus")
            continue
        if len(parts) > 3:
            raise job.fail(opt, f"{entry!r}: expected gpu[:type][:count]")
        gtype: str | None = None
        count = 1
        if len(parts) == 2:
            if parts[1].isdigit():
                count = int(parts[1])
            else:
                gtype = parts[1]
        elif len(parts) == 3:
            gtype = parts[1]
            if not parts[2].isdigit():
                raise job.fail(opt, f"{entry!r}: GPU count {parts[2]!r} is not a whole number")
            count = int(parts[2])
        if result is not None:
            raise job.fail(opt, "gpu appears twice in --gres")
        result = (gtype or None, count)
    return result


def _node_count(job: _Job) -> int | None:
    opt = job.raw("nodes")
    if opt is None:
        return None
    text = (opt.value or "").strip()
    m = re.match(r"^(\d+)(?:-(\d+))?$", text)
    if not m:
        raise job.fail(opt, "expected a node count or min-max, e.g. 4 or 2-4")
    low = int(m.group(1))
    high = int(m.group(2)) if m.group(2) else low
    if low < 1 or high < low:
        raise job.fail(opt, "the node count must be at least 1 and min <= max")
    if high != low:
        job.warn(opt, f"a gang has a fixed size; using the minimum, {low} nodes")
    return low


def _gang(job: _Job, fields: dict[str, Any]) -> None:
    """Ranks and what each asks for, by the rank rule in the module docstring."""
    nodes_given = _node_count(job)
    ntasks = job.count("ntasks")
    per_node = job.count("ntasks-per-node")
    nodes = nodes_given or (-(-ntasks // per_node) if ntasks and per_node else 1)
    tasks = ntasks or (nodes * per_node if per_node else nodes)
    if per_node and ntasks and ntasks > nodes * per_node:
        raise job.fail(job.options["ntasks"], f"{ntasks} tasks do not fit {nodes} node(s) x {per_node} per node")
    gpu_type, gpn = _gpus_per_node(job, nodes, tasks)
    cpus_per_task = job.count("cpus-per-task")
    if gpn:
        if tasks % nodes:
            raise job.fail(
                job.options.get("ntasks") or job.options["nodes"],
                f"{tasks} tasks cannot be spread evenly over {nodes} nodes with GPUs",
            )
        per = tasks // nodes
        if per > 1 and gpn % per == 0:
            ranks, gpus, tasks_per_rank = tasks, gpn // per, 1
        else:
            if per > 1:
                opt = job.options.get("ntasks-per-node") or job.options["ntasks"]
                job.warn(opt, f"{per} tasks do not split {gpn} GPUs per node evenly; one rank per node runs them all")
            ranks, gpus, tasks_per_rank = nodes, gpn, per
        resources: dict[str, Any] = {"gpus": gpus}
        if gpu_type:
            resources["gpu_models"] = [gpu_type]
    else:
        ranks, tasks_per_rank = tasks, 1
        resources = {"gpus": CPU_ONLY_GPU_SHARE}
        job.warnings.append(f"job {cpu_only_remark()}")
    cpg = job.count("cpus-per-gpu")
    if cpg and gpn:
        resources["cpus"] = cpg * resources["gpus"]
    elif cpus_per_task or tasks_per_rank > 1:
        resources["cpus"] = (cpus_per_task or 1) * tasks_per_rank
    _memory(job, resources, ranks_per_node=max(1, ranks // nodes))
    fields["ranks"] = ranks
    fields["resources"] = resources
    if nodes_given == 1 and ranks > 1:
        fields["topology"] = {"domain": "node", "mode": "required"}


def _gpus_per_node(job: _Job, nodes: int, tasks: int) -> tuple[str | None, int]:
    gres = _gres_gpus(job)
    per_node = _gpu_spec(job, "gpus-per-node")
    total = _gpu_spec(job, "gpus")
    per_task = _gpu_spec(job, "gpus-per-task")
    found: list[tuple[str, tuple[str | None, int]]] = []
    if gres is not None:
        found.append(("--gres", gres))
    if per_node is not None:
        found.append(("--gpus-per-node", per_node))
    if total is not None:
        t, n = total
        if n % nodes:
            raise job.fail(job.options["gpus"], f"{n} GPUs cannot be spread evenly over {nodes} nodes")
        found.append(("--gpus", (t, n // nodes)))
    if per_task is not None:
        t, n = per_task
        if tasks % nodes:
            raise job.fail(job.options["gpus-per-task"], f"{tasks} tasks do not spread evenly over {nodes} nodes")
        found.append(("--gpus-per-task", (t, n * (tasks // nodes))))
    if not found:
        return None, 0
    counts = {spec[1] for _, spec in found}
    if len(counts) > 1:
        said = ", ".join(f"{name} gives {spec[1]}" for name, spec in found)
        raise JobFormatError(f"GPU options disagree on GPUs per node ({said})", filename=job.filename)
    types = {spec[0] for _, spec in found if spec[0]}
    if len(types) > 1:
        raise JobFormatError(f"GPU options name different GPU types: {sorted(types)}", filename=job.filename)
    return (types.pop() if types else None), found[0][1][1]


def _memory(job: _Job, resources: dict[str, Any], *, ranks_per_node: int) -> None:
    for name in ("mem", "mem-per-cpu", "mem-per-gpu"):
        opt = job.raw(name)
        if opt is None:
            continue
        try:
            mb = slurm_memory_mb(opt.value or "")
        except ValueError as exc:
            raise job.fail(opt, str(exc)) from None
        if name == "mem":
            if mb == 0:
                job.warn(opt, "all of a node's memory cannot be asked for; each rank gets the default")
                return
            resources["memory_mb"] = max(1, mb // ranks_per_node)
        elif name == "mem-per-cpu":
            resources["memory_mb"] = max(1, round(mb * float(resources.get("cpus", 1.0))))
        else:
            resources["memory_mb"] = max(1, round(mb * max(1.0, float(resources["gpus"]))))


def _limits(job: _Job, fields: dict[str, Any]) -> None:
    """Time limit, checkpoint signal, switches, exclusivity."""
    time_opt = job.raw("time")
    if time_opt is not None:
        try:
            fields["time_limit_s"] = slurm_time_s(time_opt.value or "")
        except ValueError as exc:
            raise job.fail(time_opt, str(exc)) from None
    sig = job.raw("signal")
    if sig is not None:
        fields["checkpoint"] = _checkpoint(job, sig)
    topology: dict[str, Any] = fields.setdefault("topology", {})
    switches = job.raw("switches")
    if switches is not None:
        count, _, wait = (switches.value or "").partition("@")
        if not count.isdigit() or int(count) < 1:
            raise job.fail(switches, "expected count[@max-time], e.g. 1@30:00")
        topology["max_leaves"] = int(count)
        if wait:
            try:
                wait_s = slurm_time_s(wait)
            except ValueError as exc:
                raise job.fail(switches, str(exc)) from None
            job.warn(switches, f"the wait limit ({wait_s} s) is not used; at most {count} leaves is always kept")
    exclusive = job.raw("exclusive")
    if exclusive is not None:
        if exclusive.value not in (None, "", "topo", "user", "mcs"):
            raise job.fail(exclusive, "expected --exclusive, or --exclusive=user|mcs|topo")
        if exclusive.value in ("user", "mcs"):
            job.warn(exclusive, "OnePlus does not share nodes by user or MCS label; the nodes are exclusive to the job")
        topology["exclusive"] = True
    if not topology:
        del fields["topology"]


def _checkpoint(job: _Job, opt: Option) -> dict[str, Any]:
    """`--signal=[{R|B}:]<sig>[@<secs>]`: the checkpoint signal and the grace before the end."""
    text = (opt.value or "").strip()
    where, colon, rest = text.partition(":")
    if colon and where in ("R", "B", "RB", "BR"):
        if "B" in where:
            job.warn(opt, "B: (batch shell only) is not kept; OnePlus signals every rank")
        text = rest
    sig, at, secs = text.partition("@")
    grace = 60  # sbatch(1): the default sig_time
    if at:
        if not secs.isdigit() or int(secs) > 65535:
            raise job.fail(opt, "sig_time must be 0-65535 seconds")
        grace = int(secs)
    return {"signal": _signal_name(job, opt, sig), "grace_s": grace}


def _signal_name(job: _Job, opt: Option, sig: str) -> str:
    sig = sig.strip()
    if sig.isdigit():
        try:
            return _signal.Signals(int(sig)).name
        except ValueError:
            raise job.fail(opt, f"{sig} is not a signal number") from None
    if not sig:
        raise job.fail(opt, "names no signal")
    return sig.upper() if sig.upper().startswith("SIG") else "SIG" + sig.upper()


def _report_unused(job: _Job) -> None:
    for name, opt in job.options.items():
        if name in UNUSED:
            job.warn(opt, "not used by OnePlus")
