"""An sbatch script (its `#SBATCH` directives, overridden by command-line options) as a JobSpec.

Rank rule: a GPU job has one rank per node with the node's GPUs, unless --ntasks-per-node (or --ntasks)
splits each node's GPUs evenly among its tasks, then one rank per task. A job with no GPU has one rank per task.
"""

from __future__ import annotations

import hashlib
import os
import re
import signal as _signal
import time
import unicodedata
from collections.abc import Sequence
from pathlib import PurePath
from typing import Any

from oneplus_contracts.arrays import ArrayError, JobArray
from oneplus_contracts.slurm import digits

from .errors import JobFormatError, Translation, spec_from_fields
from .priorities import priority_of
from .quantities import slurm_time_s
from .sbatch_gang import gang_fields
from .sbatch_het import component_options, split_job_wide
from .sbatch_options import UNUSED, Option, SbatchJob, dependency_fields, parse_tokens, script_directives
from .sbatch_where import where_fields
from .site import SiteMap, SiteMapError, apply_default_share, site_from_env

_NAME_BAD = re.compile(r"[^A-Za-z0-9._-]+")
OUTPUT_LABEL = "slurm/output"
NAME_LABEL = "slurm/job-name"
ACCOUNT_LABEL = "slurm/account"


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
    script: str,
    cli_args: Sequence[str] = (),
    *,
    filename: str = "<stdin>",
    script_args: Sequence[str] = (),
    site: SiteMap | None = None,
    submit_dir: str | None = None,
    now: float | None = None,
) -> Translation:
    """Translate an sbatch script; `cli_args` are sbatch options that override the script's directives.

    `script_args` are the arguments after the script on sbatch's command line ($1, $2, ... inside the script).
    `site` maps the site's QOS, partitions and accounts (default: the file named by ONEPLUS_SITE_FILE).
    `submit_dir` is SLURM_SUBMIT_DIR (default: this process's working directory, where sbatch runs; "" when it is
    not known, as for a script that arrives over the bus: the ranks then get no SLURM_SUBMIT_DIR).
    `now` is when `--begin=now+1hour` counts from (default: this moment).

    The job is a Slurm batch job (framework "sbatch"): its script runs once, on the node of rank 0, with the Slurm
    batch environment; the other ranks hold the allocation and run the tasks of the script's `srun` steps.
    """
    try:
        site = site if site is not None else site_from_env()
    except SiteMapError as exc:
        raise JobFormatError(str(exc), filename=filename) from None
    if script.strip() and not script.lstrip("\ufeff").startswith("#!"):
        raise JobFormatError(
            "this does not look like a batch script: the first line must start with #! followed by the path to an "
            "interpreter",
            filename=filename,
            where="line 1",
        )
    parts = component_options(script.lstrip("\ufeff"), cli_args, filename)
    when = time.time() if now is None else now
    if len(parts) > 1:
        return _heterogeneous(parts, script, script_args, filename, site, submit_dir, when)
    options, _ = _merge(script.lstrip("\ufeff"), cli_args, filename)
    job = SbatchJob(options, filename)
    fields = _translate(job, script, script_args, site, submit_dir, when)
    spec = spec_from_fields(fields, filename=filename, origin=_origin(job))
    return Translation(spec=spec, warnings=sorted(job.warnings, key=_by_line), kind="sbatch")


def _translate(
    job: SbatchJob, script: str, script_args: Sequence[str], site: SiteMap, submit_dir: str | None, now: float
) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    _check_conflicts(job)
    _identity(job, fields, script, list(script_args), site)
    gang_fields(job, fields)
    _limits(job, fields)
    # Slurm's DefMemPerGPU/DefCpuPerGPU: what a job that sets no CPU or memory gets, from the site map.
    job.warnings.extend(apply_default_share(fields, site))
    dependency_fields(job, fields)
    _array(job, fields, site)
    where_fields(job, fields, now)
    _batch(job, fields, submit_dir)
    _report_unused(job)
    return fields


def _heterogeneous(
    parts: list[dict[str, Option]],
    script: str,
    script_args: Sequence[str],
    filename: str,
    site: SiteMap,
    submit_dir: str | None,
    now: float,
) -> Translation:
    """A heterogeneous job (`#SBATCH hetjob`, `sbatch a : b`): one job whose gang is its components' ranks in order;
    the job's own options from sbatch_het.split_job_wide, each component's shape read as a job's would be."""
    job_wide, shapes, warnings = split_job_wide(parts)
    head = SbatchJob({**job_wide, **shapes[0]}, filename)
    array = head.raw("array")
    if array is not None:
        raise head.fail(array, "a heterogeneous job cannot be a job array (Slurm refuses it too)")
    fields = _translate(head, script, script_args, site, submit_dir, now)
    components = [_component(fields)]
    warnings.extend(_of_component(head.warnings, 0))
    for n, shape in enumerate(shapes[1:], start=1):
        job = SbatchJob(shape, filename)
        own: dict[str, Any] = {}
        _check_conflicts(job)
        gang_fields(job, own)
        _limits(job, own)
        job.warnings.extend(apply_default_share(own, site))
        dependency_fields(job, own)
        where_fields(job, own, now)
        components.append(_component(own))
        warnings.extend(_of_component(job.warnings, n))
    fields["components"] = components
    fields["ranks"] = sum(c["ranks"] for c in components)
    fields["resources"] = components[0]["resources"]
    fields["topology"] = components[0]["topology"]
    spec = spec_from_fields(fields, filename=filename, origin=_origin(head))
    return Translation(spec=spec, warnings=sorted(warnings, key=_by_line), kind="sbatch")


def _of_component(warnings: list[str], n: int) -> list[str]:
    """A remark on the whole job ("job asks for no GPU") said of the component it is about."""
    return [f"component {n} {w[4:]}" if w.startswith("job ") else w for w in warnings]


def _component(fields: dict[str, Any]) -> dict[str, Any]:
    """One component of a heterogeneous job, from the fields its shape options gave (taken out of `fields`)."""
    slurm = fields.get("slurm", {})
    out: dict[str, Any] = {
        "ranks": fields.pop("ranks"),
        "resources": fields.pop("resources"),
        "topology": fields.pop("topology", {}),
        "slurm": {k: slurm[k] for k in ("ntasks", "ntasks_per_node", "cpus_per_task") if k in slurm},
    }
    for key in ("nodelist", "constraint"):
        if key in fields:
            out[key] = fields.pop(key)
    return out


def _batch(job: SbatchJob, fields: dict[str, Any], submit_dir: str | None) -> None:
    """What the batch environment needs beyond the ranks (gang_fields put ntasks and ntasks_per_node)."""
    fields["framework"] = "sbatch"
    slurm: dict[str, Any] = fields.setdefault("slurm", {})
    slurm["job_name"] = job.value("job-name") or fields["name"]
    slurm["submit_dir"] = (submit_dir or None) if submit_dir is not None else os.getcwd()
    for key, option in (("partition", "partition"), ("account", "account")):
        given = job.value(option)
        if given:
            slurm[key] = given


def _array(job: SbatchJob, fields: dict[str, Any], site: SiteMap) -> None:
    """`--array=0-999%50`: one job per task id, at most 50 running; ids below the site's max_array_size."""
    opt = job.raw("array")
    if opt is None:
        return
    try:
        array = JobArray.parse(opt.value or "", max_array_size=site.max_array_size)
    except ArrayError as exc:
        raise job.fail(opt, str(exc).split(": ", 1)[-1]) from None
    fields["array"] = {"indices": array.indices, "max_running": array.max_running}


def _by_line(warning: str) -> tuple[int, int]:
    """Script lines in order, then the command line, then remarks on the whole job."""
    m = re.match(r"line (\d{1,9}):", warning)
    if m:
        return 0, int(m.group(1))
    return (1, 0) if warning.startswith("command line") else (2, 0)


def _origin(job: SbatchJob) -> dict[str, str]:
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


def _check_conflicts(job: SbatchJob) -> None:
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


def _identity(job: SbatchJob, fields: dict[str, Any], script: str, script_args: list[str], site: SiteMap) -> None:
    """Name, queue, priority, team, image, command and output."""
    name = job.value("job-name")
    labels: dict[str, str] = fields.setdefault("labels", {})
    if name is None:
        fields["name"] = _default_name(job.filename)
    else:
        # Slurm takes any job name; OnePlus names are letters, digits, '.', '_' and '-': the name as given is kept
        # in a label (squeue's NAME), the job id and commands use the spelled one.
        fields["name"] = _spelled(name, "sbatch")
        if fields["name"] != name:
            labels[NAME_LABEL] = name
    partition = job.raw("partition")
    if partition is not None:
        parts = [p for p in (partition.value or "").split(",") if p]
        if not parts:
            raise job.fail(partition, "needs a partition name")
        if len(parts) > 1:
            job.warn(partition, f"OnePlus queues a job in one queue; using {parts[0]!r}")
        fields["queue"] = site.queue_of(parts[0])
    qos = job.raw("qos")
    if qos is not None:
        first = site.priority_class_of((qos.value or "").split(",")[0])
        try:
            fields["priority"] = priority_of(first)
        except ValueError as exc:
            raise job.fail(qos, f"{exc} (or map the site's QOS names in ONEPLUS_SITE_FILE)") from None
        fields["priority_class"] = first
    account = job.value("account")
    mapped = site.team_of(account) if account else None
    if account and mapped:
        fields["team"] = mapped
        if mapped != account:
            labels[ACCOUNT_LABEL] = account
    elif account:
        # Slurm accounts take any characters (`six@a100`); a OnePlus team is spelled like a name.
        fields["team"] = _spelled(account, "default")
        if fields["team"] != account:
            labels[ACCOUNT_LABEL] = account
            job.warn(job.options["account"], f"the team is {fields['team']!r} (a team name has no {account!r} form)")
    image = job.value("container-image")
    if image:
        fields["image"] = image
    output = job.value("output")
    if output:
        labels[OUTPUT_LABEL] = output
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
    if not labels:
        del fields["labels"]
    if job.value("requeue") == "no":
        fields["preemptible"] = False  # a job that must not be requeued cannot be preempted and resumed


def _spelled(text: str, fallback: str) -> str:
    """A Slurm name as a OnePlus name: accents dropped (`café` -> `cafe`), other characters as '-'."""
    if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", text):
        return text
    folded = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    cleaned = _NAME_BAD.sub("-", folded).strip("-._")
    if not cleaned:
        digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:8]
        cleaned = f"{fallback}-{digest}"
    return cleaned[:128]


def _default_name(filename: str) -> str:
    stem = PurePath(filename).name if filename and not filename.startswith("<") else "sbatch"
    cleaned = _NAME_BAD.sub("-", stem).strip("-.") or "sbatch"
    return cleaned[:128]


def _limits(job: SbatchJob, fields: dict[str, Any]) -> None:
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
        if not digits(count) or int(count) < 1:
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


def _checkpoint(job: SbatchJob, opt: Option) -> dict[str, Any]:
    """`--signal=[{R|B}:]<sig>[@<secs>]`: the checkpoint signal and the grace before the end."""
    text = (opt.value or "").strip()
    where, colon, rest = text.partition(":")
    flags = where if colon and where in ("R", "B", "RB", "BR") else ""
    if flags:
        if "R" in flags:
            job.warn(opt, "the R: flag is not used by OnePlus")
        text = rest
    # B: or not, OnePlus signals the batch shell (B:'s meaning), not the tasks of srun steps (docs/submitting.md).
    sig, at, secs = text.partition("@")
    grace = 60  # sbatch(1): the default sig_time
    if at:
        if not digits(secs) or int(secs) > 65535:
            raise job.fail(opt, "sig_time must be 0-65535 seconds")
        grace = int(secs)
    return {"signal": _signal_name(job, opt, sig), "grace_s": grace}


def _signal_name(job: SbatchJob, opt: Option, sig: str) -> str:
    sig = sig.strip()
    if digits(sig):
        try:
            return _signal.Signals(int(sig)).name
        except ValueError:
            raise job.fail(opt, f"{sig} is not a signal number") from None
    if not sig:
        raise job.fail(opt, "names no signal")
    return sig.upper() if sig.upper().startswith("SIG") else "SIG" + sig.upper()


def _report_unused(job: SbatchJob) -> None:
    for name, opt in job.options.items():
        if name in UNUSED:
            job.warn(opt, "not used by OnePlus")
