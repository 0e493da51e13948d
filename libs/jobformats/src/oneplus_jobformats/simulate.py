"""A simulated duration given with the inputs users have: `--simulate-s` on the command line, a `#ONEPLUS
--simulate-s=N` line in an sbatch script, the `oneplus.io/simulate-s` annotation of a Kubeflow manifest.

On the simulated runtime (the dev stack, the demo, the tests) a job runs no process: it holds its GPUs for
`simulate.duration_s`. These forms set that duration, so queueing can be tried with an sbatch script or a
PyTorchJob as they are; on a real runtime a job with `simulate` runs a stand-in (docs/executor.md).
"""

from __future__ import annotations

import math
import shlex

from oneplus_contracts import JobSpec, SimulatedRun

from .errors import JobFormatError

SIMULATE_ANNOTATION = "oneplus.io/simulate-s"
DIRECTIVE = "#ONEPLUS"
OPTION = "--simulate-s"
MAX_SIMULATE_S = 7 * 24 * 3600.0  # SimulatedRun.duration_s's bound


def parse_simulate_s(value: object, *, source: str) -> float:
    """Seconds ≥ 0 and at most a week; anything else is one error naming `source` and the value."""
    text = str(value).strip()
    try:
        seconds = float(text)
    except ValueError:
        raise JobFormatError(f"{source}: {text!r} is not a number of seconds") from None
    if not math.isfinite(seconds) or seconds < 0 or seconds > MAX_SIMULATE_S:
        raise JobFormatError(f"{source}: {text!r} must be between 0 and {MAX_SIMULATE_S:g} seconds")
    return seconds


def sbatch_simulate_s(script: str, *, filename: str) -> float | None:
    """The `#ONEPLUS --simulate-s=N` of a batch script, read where sbatch reads `#SBATCH`: in the comment block
    before the first command. Slurm itself ignores the line (a comment), so the script runs unchanged there."""
    found: float | None = None
    for number, line in enumerate(script.splitlines(), start=1):
        stripped = line.strip()
        if number == 1 and stripped.startswith("#!"):
            continue
        if stripped and not stripped.startswith("#"):
            break  # the first command ends the directives, as for #SBATCH
        if not stripped.startswith(DIRECTIVE) or stripped[len(DIRECTIVE) : len(DIRECTIVE) + 1] not in ("", " ", "\t"):
            continue
        where = f"line {number}"
        try:
            tokens = shlex.split(stripped[len(DIRECTIVE) :], comments=True)
        except ValueError as exc:
            raise JobFormatError(f"{DIRECTIVE}: {exc}", filename=filename, where=where) from None
        i = 0
        while i < len(tokens):
            token = tokens[i]
            name, eq, value = token.partition("=")
            if name != OPTION:
                raise JobFormatError(
                    f"unknown {DIRECTIVE} option {token!r}; the one known is {OPTION}=SECONDS",
                    filename=filename,
                    where=where,
                )
            if not eq:
                if i + 1 >= len(tokens):
                    raise JobFormatError(f"{OPTION} needs a value (seconds)", filename=filename, where=where)
                i += 1
                value = tokens[i]
            try:
                found = parse_simulate_s(value, source=f"{DIRECTIVE} {OPTION}")
            except JobFormatError as exc:
                raise JobFormatError(exc.problem, filename=filename, where=where) from None
            i += 1
    return found


def with_simulated_duration(spec: JobSpec, seconds: float) -> JobSpec:
    """`spec` simulated for `seconds`, keeping the exit code and checkpoint delay it already gives."""
    current = spec.simulate or SimulatedRun()
    return spec.model_copy(update={"simulate": current.model_copy(update={"duration_s": seconds})})
