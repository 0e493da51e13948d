"""A heterogeneous sbatch job's components: `#SBATCH hetjob` in the script, `:` on the command line.

Each component has its own shape (nodes, tasks, GPUs, CPUs, memory, switches, exclusivity, nodelist, constraint);
the other options are the job's, as OnePlus runs one job with one id, queue and time limit: each is taken from the
first component that gives it (Slurm propagates most of them to the later components), and a later component that
gives another value is named in a warning.
"""

from __future__ import annotations

from collections.abc import Sequence

from .errors import JobFormatError
from .sbatch_options import COMPONENT_SEPARATOR, HETJOB, Option, parse_tokens, script_directives

# The options that shape one component (the rest are the job's).
COMPONENT_OPTIONS = frozenset(
    {
        "nodes", "ntasks", "ntasks-per-node", "ntasks-per-gpu", "gres", "gpus", "gpus-per-node", "gpus-per-task",
        "cpus-per-task", "cpus-per-gpu", "mem", "mem-per-cpu", "mem-per-gpu", "switches", "exclusive",
        "oversubscribe", "nodelist", "constraint",
    }
)  # fmt: skip
_MEMORY = ("mem", "mem-per-cpu", "mem-per-gpu")


def _normalised(opt: Option) -> Option:
    if opt.name == "no-requeue":  # one setting, two spellings: the last one given counts
        return Option("requeue", "no", opt.where, opt.spelled)
    return opt


def component_options(script: str, cli_args: Sequence[str], filename: str) -> list[dict[str, Option]]:
    """Each component's options, the command line's over the script's of the same component (one for a plain job).
    A component with no option at all is refused, naming its separator."""
    try:
        found = script_directives(script)
        cli_groups = _cli_groups(list(cli_args))
    except JobFormatError as exc:
        raise JobFormatError(exc.problem, filename=filename, where=exc.where) from None
    script_groups: list[list[Option]] = [[]]
    separators: list[Option | None] = [None]
    for opt in found:
        if opt.name == HETJOB:
            script_groups.append([])
            separators.append(opt)
        else:
            script_groups[-1].append(opt)
    count = max(len(script_groups), len(cli_groups))
    out: list[dict[str, Option]] = []
    for n in range(count):
        merged: dict[str, Option] = {}
        own = script_groups[n] if n < len(script_groups) else []
        cli = cli_groups[n] if n < len(cli_groups) else []
        for opt in [*own, *cli]:  # later wins: the command line overrides the script
            opt = _normalised(opt)
            merged[opt.name] = opt
        if count > 1 and not merged:
            raise _empty(n, separators[n] if n < len(separators) else None, filename)
        out.append(merged)
    return out


def _empty(n: int, separator: Option | None, filename: str) -> JobFormatError:
    if separator is not None:
        return JobFormatError(
            f"{separator.spelled}: heterogeneous job component {n} is empty: give it its #SBATCH options "
            "(e.g. --nodes, --ntasks) after this line, before the next hetjob or the script's first command",
            filename=filename,
            where=separator.where,
        )
    if n == 0:
        return JobFormatError(
            "heterogeneous job component 0 is empty: give its options before the first ':' or #SBATCH hetjob",
            filename=filename,
        )
    return JobFormatError(
        f"heterogeneous job component {n} is empty: give its options between the ':' words (sbatch [options0] : "
        "[options1] script)",
        filename=filename,
        where="command line",
    )


def _cli_groups(tokens: list[str]) -> list[list[Option]]:
    """The command line's options by component: split at each `:` word."""
    groups: list[list[str]] = [[]]
    for token in tokens:
        if token == COMPONENT_SEPARATOR:
            groups.append([])
        else:
            groups[-1].append(token)
    out: list[list[Option]] = []
    for n, words in enumerate(groups):
        where = "command line" if len(groups) == 1 else f"command line (component {n})"
        options, _ = parse_tokens(words, where, stop_at_positional=False)
        out.append(options)
    return out


def split_job_wide(parts: list[dict[str, Option]]) -> tuple[dict[str, Option], list[dict[str, Option]], list[str]]:
    """(the job's options, each component's shape options, warnings) of a heterogeneous job's components."""
    job: dict[str, Option] = {}
    shapes: list[dict[str, Option]] = []
    warnings: list[str] = []
    for n, part in enumerate(parts):
        shape = {k: v for k, v in part.items() if k in COMPONENT_OPTIONS}
        if n > 0 and not any(k in shape for k in _MEMORY) and "mem" in shapes[-1]:
            shape["mem"] = shapes[-1]["mem"]  # Slurm propagates --mem to the next component
        shapes.append(shape)
        for name, opt in part.items():
            if name in COMPONENT_OPTIONS:
                continue
            kept = job.get(name)
            if kept is None:
                job[name] = opt
            elif kept.value != opt.value:
                warnings.append(
                    f"{opt.where}: {opt}: OnePlus runs a heterogeneous job as one job: {kept} ({kept.where}) is "
                    f"used for every component"
                )
    return job, shapes, warnings
