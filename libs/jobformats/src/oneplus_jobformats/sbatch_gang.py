"""The rank rule of sbatch jobs: nodes, tasks and GPU options to ranks and per-rank resources.

A GPU job has one rank per node with the node's GPUs, unless the tasks per node split those GPUs evenly: then one
rank per task. A job with no GPU has one rank per task.
"""

from __future__ import annotations

import re
from typing import Any

from oneplus_contracts.slurm import digits

from .errors import JobFormatError
from .gang import CPU_ONLY_GPU_SHARE, cpu_only_remark
from .quantities import slurm_memory_mb
from .sbatch_options import SbatchJob

_GPU_SPEC = re.compile(r"(?:([A-Za-z][\w.-]{0,63}):)?(\d{1,6})", re.ASCII)


def _gpu_spec(job: SbatchJob, name: str) -> tuple[str | None, int] | None:
    """`[type:]count` of --gpus, --gpus-per-node, --gpus-per-task."""
    opt = job.raw(name)
    if opt is None:
        return None
    text = (opt.value or "").strip()
    if "," in text:
        raise job.fail(opt, "several GPU types per job are not supported; ask for one type")
    m = _GPU_SPEC.fullmatch(text)
    if not m:
        raise job.fail(opt, "expected [type:]count, e.g. 8 or h100:8")
    return m.group(1), int(m.group(2))


def _gres_gpus(job: SbatchJob) -> tuple[str | None, int] | None:
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
            if digits(parts[1]):
                count = int(parts[1])
            else:
                gtype = parts[1]
        elif len(parts) == 3:
            gtype = parts[1]
            if not digits(parts[2]):
                raise job.fail(opt, f"{entry!r}: GPU count {parts[2]!r} is not a whole number")
            count = int(parts[2])
        if result is not None:
            raise job.fail(opt, "gpu appears twice in --gres")
        result = (gtype or None, count)
    return result


def _node_count(job: SbatchJob) -> int | None:
    opt = job.raw("nodes")
    if opt is None:
        return None
    text = (opt.value or "").strip()
    m = re.fullmatch(r"(\d{1,7})(?:-(\d{1,7}))?", text, re.ASCII)
    if not m:
        raise job.fail(opt, "expected a node count or min-max, e.g. 4 or 2-4")
    low = int(m.group(1))
    high = int(m.group(2)) if m.group(2) else low
    if low < 1:
        raise job.fail(opt, "the node count must be at least 1")
    if high < low:
        raise job.fail(opt, f"the minimum ({low}) is above the maximum ({high}); use min-max, e.g. {high}-{low}")
    if high != low:
        job.warn(opt, f"a gang has a fixed size; using the minimum, exactly {low} nodes")
    return low


def gang_fields(job: SbatchJob, fields: dict[str, Any]) -> None:
    """Ranks and what each asks for, by the rank rule in the module docstring."""
    nodes_given = _node_count(job)
    ntasks = job.count("ntasks")
    per_node = job.count("ntasks-per-node")
    nodes = nodes_given or (-(-ntasks // per_node) if ntasks and per_node else 1)
    tasks = ntasks or (nodes * per_node if per_node else nodes)
    if ntasks and nodes_given and ntasks < nodes_given:
        raise job.fail(
            job.options["nodes"],
            f"{nodes_given} nodes are more than the {ntasks} tasks (--ntasks): each node needs a task",
        )
    if per_node and ntasks and ntasks > nodes * per_node:
        raise job.fail(job.options["ntasks"], f"{ntasks} tasks do not fit {nodes} node(s) x {per_node} per node")
    per_gpu = job.count("ntasks-per-gpu")
    if per_gpu is not None:
        # sbatch(1): tasks = ntasks-per-gpu x GPUs; not with --ntasks-per-node or --gpus-per-task.
        for other in ("ntasks-per-node", "gpus-per-task"):
            if job.has(other):
                raise job.fail(job.options["ntasks-per-gpu"], f"--ntasks-per-gpu and --{other} are mutually exclusive")
        gpu_type, gpn = _gpus_per_node(job, nodes, nodes)
        if not gpn:
            raise job.fail(job.options["ntasks-per-gpu"], "needs GPUs (--gpus, --gpus-per-node or --gres=gpu)")
        if ntasks and ntasks != nodes * gpn * per_gpu:
            raise job.fail(job.options["ntasks"], f"{ntasks} tasks, but --ntasks-per-gpu gives {nodes * gpn * per_gpu}")
        tasks = nodes * gpn * per_gpu
    else:
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
                opt = job.options.get("ntasks-per-node") or job.options.get("ntasks") or job.options["ntasks-per-gpu"]
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
    whole_node = resources.pop("whole_node_memory", False)
    # What Slurm allocates it also enforces (cgroups): an asked-for CPU count or size is request and cap alike.
    # What was not asked for is reserved at the default and not capped (the dry run says so).
    if "cpus" in resources:
        resources["cpu_limit"] = resources["cpus"]
    if "memory_mb" in resources:
        resources["memory_limit_mb"] = resources["memory_mb"]
    fields["ranks"] = ranks
    fields["resources"] = resources
    # The allocation the batch environment describes and a step (srun) may use: tasks and tasks per node.
    slurm: dict[str, Any] = fields.setdefault("slurm", {})
    slurm.update({"ntasks": tasks, "ntasks_per_node": per_node or -(-tasks // nodes)})
    if cpus_per_task:
        slurm["cpus_per_task"] = cpus_per_task
    if nodes_given == 1 and ranks > 1:
        fields["topology"] = {"domain": "node", "mode": "required"}
    if nodes_given or per_node:
        # sbatch(1): --nodes (or the nodes --ntasks-per-node lays the tasks on) are that many distinct nodes.
        if ranks % nodes == 0:
            fields.setdefault("topology", {})["nodes"] = nodes
        else:
            opt = job.options.get("nodes") or job.options["ntasks-per-node"]
            job.warn(
                opt, f"{ranks} tasks do not spread evenly over {nodes} nodes; they are placed without a node count"
            )
    if whole_node:
        fields.setdefault("topology", {})["exclusive"] = True


def _gpus_per_node(job: SbatchJob, nodes: int, tasks: int) -> tuple[str | None, int]:
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


def _memory(job: SbatchJob, resources: dict[str, Any], *, ranks_per_node: int) -> None:
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
                # sbatch(1): --mem=0 is all of each node's memory: the job takes its nodes whole, without a cap.
                job.warn(opt, "all of each node's memory: the job's nodes are exclusive to it, memory is not capped")
                resources["whole_node_memory"] = True
                return
            resources["memory_mb"] = max(1, mb // ranks_per_node)
        elif name == "mem-per-cpu":
            resources["memory_mb"] = max(1, round(mb * float(resources.get("cpus", 1.0))))
        else:
            resources["memory_mb"] = max(1, round(mb * max(1.0, float(resources["gpus"]))))
