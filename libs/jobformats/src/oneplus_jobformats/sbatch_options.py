"""sbatch's option syntax: `#SBATCH` directives and command-line arguments, getopt style.

Long options take `--opt=value` or `--opt value` and may be abbreviated to a unique prefix; short options take
`-N2` or `-N 2`. Only the directives before the first command line of the script count, as in Slurm.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from oneplus_contracts.features import ConstraintError, parse_constraint
from oneplus_contracts.slurm import digits

from .errors import JobFormatError

VALUE, FLAG, OPTIONAL = "value", "flag", "optional"

# Options OnePlus reads: long name → (argument kind, short letter).
USED: dict[str, tuple[str, str | None]] = {
    "nodes": (VALUE, "N"),
    "ntasks": (VALUE, "n"),
    "ntasks-per-node": (VALUE, None),
    "ntasks-per-gpu": (VALUE, None),
    "gres": (VALUE, None),
    "gpus": (VALUE, "G"),
    "gpus-per-node": (VALUE, None),
    "gpus-per-task": (VALUE, None),
    "cpus-per-task": (VALUE, "c"),
    "cpus-per-gpu": (VALUE, None),
    "mem": (VALUE, None),
    "mem-per-cpu": (VALUE, None),
    "mem-per-gpu": (VALUE, None),
    "time": (VALUE, "t"),
    "partition": (VALUE, "p"),
    "qos": (VALUE, "q"),
    "account": (VALUE, "A"),
    "switches": (VALUE, None),
    "exclusive": (OPTIONAL, None),
    "oversubscribe": (FLAG, "s"),
    "signal": (VALUE, None),
    "requeue": (FLAG, None),
    "no-requeue": (FLAG, None),
    "job-name": (VALUE, "J"),
    "output": (VALUE, "o"),
    "container-image": (VALUE, None),
    "wrap": (VALUE, None),
    "parsable": (FLAG, None),
    "array": (VALUE, "a"),
    "dependency": (VALUE, "d"),
    "constraint": (VALUE, "C"),
    "begin": (VALUE, "b"),
    "nodelist": (VALUE, "w"),
    "exclude": (VALUE, "x"),
    "reservation": (VALUE, None),
}

# Real sbatch options OnePlus has no use for: accepted, and reported by name.
UNUSED: dict[str, tuple[str, str | None]] = {
    "error": (VALUE, "e"),
    "input": (VALUE, "i"),
    "chdir": (VALUE, "D"),
    "mail-type": (VALUE, None),
    "mail-user": (VALUE, None),
    "comment": (VALUE, None),
    "deadline": (VALUE, None),
    "hold": (FLAG, "H"),
    "export": (VALUE, None),
    "export-file": (VALUE, None),
    "get-user-env": (OPTIONAL, None),
    "licenses": (VALUE, "L"),
    "cluster-constraint": (VALUE, None),
    "time-min": (VALUE, None),
    "nice": (OPTIONAL, None),
    "priority": (VALUE, None),
    "open-mode": (VALUE, None),
    "propagate": (OPTIONAL, None),
    "quiet": (FLAG, "Q"),
    "verbose": (FLAG, "v"),
    "wait": (FLAG, "W"),
    "kill-on-invalid-dep": (VALUE, None),
    "mincpus": (VALUE, None),
    "sockets-per-node": (VALUE, None),
    "cores-per-socket": (VALUE, None),
    "threads-per-core": (VALUE, None),
    "ntasks-per-core": (VALUE, None),
    "ntasks-per-socket": (VALUE, None),
    "gpus-per-socket": (VALUE, None),
    "gpu-bind": (VALUE, None),
    "gpu-freq": (VALUE, None),
    "cpu-freq": (VALUE, None),
    "distribution": (VALUE, "m"),
    "hint": (VALUE, None),
    "mem-bind": (VALUE, None),
    "network": (VALUE, None),
    "tmp": (VALUE, None),
    "uid": (VALUE, None),
    "gid": (VALUE, None),
    "wckey": (VALUE, None),
    "clusters": (VALUE, "M"),
    "extra-node-info": (VALUE, "B"),
    "core-spec": (VALUE, "S"),
    "thread-spec": (VALUE, None),
    "profile": (VALUE, None),
    "acctg-freq": (VALUE, None),
    "bb": (VALUE, None),
    "bbf": (VALUE, None),
    "delay-boot": (VALUE, None),
    "overcommit": (FLAG, "O"),
    "no-kill": (OPTIONAL, "k"),
    "spread-job": (FLAG, None),
    "use-min-nodes": (FLAG, None),
    "test-only": (FLAG, None),
    "reboot": (FLAG, None),
    "mcs-label": (VALUE, None),
    "power": (VALUE, None),
    "tres-per-task": (VALUE, None),
    "tres-bind": (VALUE, None),
    "segment": (VALUE, None),
    "container": (VALUE, None),
    "container-id": (VALUE, None),
    "container-mounts": (VALUE, None),
    "container-workdir": (VALUE, None),
    "container-name": (VALUE, None),
    "container-env": (VALUE, None),
    "container-mount-home": (FLAG, None),
    "no-container-mount-home": (FLAG, None),
    "container-writable": (FLAG, None),
    "container-readonly": (FLAG, None),
}

ALL = {**USED, **UNUSED}
# A heterogeneous job's components: `#SBATCH hetjob` (`packjob`, its name before Slurm 20.02) in a script, `:` on the
# command line. HETJOB names the separator's place among a script's options.
HET_SEPARATORS = ("hetjob", "packjob")
HETJOB = "hetjob"
COMPONENT_SEPARATOR = ":"
# Spellings sbatch takes that are not prefixes of one option: `--cluster` is `--clusters` (sbatch(1)).
ALIASES = {"cluster": "clusters"}
SHORT = {short: name for name, (_, short) in ALL.items() if short}


@dataclass(frozen=True)
class Option:
    """One option as given: its canonical long name, its value (None for a flag) and where it was written."""

    name: str
    value: str | None
    where: str
    spelled: str

    def __str__(self) -> str:
        return self.spelled if self.value is None else f"{self.spelled}={self.value}"


def _long(token: str, tokens: Sequence[str], i: int, where: str) -> tuple[Option, int]:
    body = token[2:]
    key, eq, value = body.partition("=")
    name = key if key in ALL else ALIASES.get(key)
    if name is None:
        matches = [n for n in ALL if n.startswith(key)] if key else []
        if len(matches) > 1:
            raise JobFormatError(f"option '--{key}' is ambiguous ({', '.join('--' + m for m in matches)})", where=where)
        if not matches:
            raise JobFormatError(f"unrecognized option '--{key}'", where=where)
        name = matches[0]
    kind = ALL[name][0]
    spelled = "--" + name
    if kind == FLAG:
        if eq:
            raise JobFormatError(f"option '{spelled}' takes no value", where=where)
        return Option(name, None, where, spelled), i + 1
    if kind == OPTIONAL:
        return Option(name, value if eq else None, where, spelled), i + 1
    if eq:
        return Option(name, value, where, spelled), i + 1
    if i + 1 >= len(tokens):
        raise JobFormatError(f"option '{spelled}' needs a value", where=where)
    return Option(name, tokens[i + 1], where, spelled), i + 2


def _short(token: str, tokens: Sequence[str], i: int, where: str) -> tuple[list[Option], int]:
    out: list[Option] = []
    pos = 1
    while pos < len(token):
        letter = token[pos]
        name = SHORT.get(letter)
        if name is None:
            raise JobFormatError(f"invalid option '-{letter}'", where=where)
        kind = ALL[name][0]
        if kind == VALUE:
            rest = token[pos + 1 :]
            if rest:
                out.append(Option(name, rest, where, "-" + letter))
                return out, i + 1
            if i + 1 >= len(tokens):
                raise JobFormatError(f"option '-{letter}' needs a value", where=where)
            out.append(Option(name, tokens[i + 1], where, "-" + letter))
            return out, i + 2
        out.append(Option(name, None, where, "-" + letter))
        pos += 1
    return out, i + 1


def parse_tokens(tokens: Sequence[str], where: str, *, stop_at_positional: bool) -> tuple[list[Option], list[str]]:
    """Options from `tokens`; with `stop_at_positional`, the first other word and all after it are returned apart."""
    options: list[Option] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token == "--":
            return options, list(tokens[i + 1 :])
        if token.startswith("--"):
            opt, i = _long(token, tokens, i, where)
            options.append(opt)
        elif token.startswith("-") and len(token) > 1:
            opts, i = _short(token, tokens, i, where)
            options.extend(opts)
        elif stop_at_positional:
            return options, list(tokens[i:])
        else:
            raise JobFormatError(f"unexpected argument {token!r}: only sbatch options are allowed here", where=where)
    return options, []


def split_command_line(argv: Sequence[str]) -> tuple[list[str], str | None, list[str]]:
    """`sbatch [options] [: options ...] [script [args...]]` → (option words, script or None, script arguments).
    A heterogeneous job's components stay apart in the option words, as `:` words (sbatch_het.py)."""
    rest = list(argv)
    while True:
        _, rest = parse_tokens(rest, "command line", stop_at_positional=True)
        if not rest or rest[0] != COMPONENT_SEPARATOR:
            break
        rest = rest[1:]
    consumed = list(argv[: len(argv) - len(rest)])
    if consumed and consumed[-1] == "--":
        consumed.pop()
    if not rest:
        return consumed, None, []
    return consumed, rest[0], list(rest[1:])


def script_directives(script: str) -> list[Option]:
    """The options of the `#SBATCH` lines before the first command, in order."""
    options: list[Option] = []
    for lineno, line in enumerate(script.splitlines(), start=1):
        stripped = line.strip()
        if lineno == 1 and stripped.startswith("#!"):
            continue
        if not stripped:
            continue
        if not stripped.startswith("#"):
            break  # Slurm stops reading directives at the first command
        if not (line.startswith("#SBATCH") and (len(line) == 7 or line[7].isspace())):
            continue
        where = f"line {lineno}"
        try:
            tokens = shlex.split(line[7:], comments=True, posix=True)
        except ValueError as exc:
            raise JobFormatError(f"cannot split {line.strip()!r}: {exc}", where=where) from None
        if tokens and tokens[0] in HET_SEPARATORS:
            # `#SBATCH hetjob` ends one component of a heterogeneous job (sbatch_het.py splits them there).
            if len(tokens) > 1:
                raise JobFormatError(f"#SBATCH {tokens[0]} stands alone on its line (found {' '.join(tokens[1:])!r})",
                                     where=where)  # fmt: skip
            options.append(Option(HETJOB, None, where, f"#SBATCH {tokens[0]}"))
            continue
        found, _ = parse_tokens(tokens, where, stop_at_positional=False)
        options.extend(found)
    return options


@dataclass
class SbatchJob:
    """The merged options of one sbatch job (command line over script), and the remarks made while reading them."""

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
        if not digits(text):
            raise self.fail(opt, "must be a whole number")
        n = int(text)
        if n < minimum or n > 1_000_000:
            raise self.fail(opt, f"must be between {minimum} and 1000000")
        return n


_DEPENDENCY_TYPES = ("after", "afterany", "afterok", "afternotok", "aftercorr")


def dependency_fields(job: SbatchJob, fields: dict[str, Any]) -> None:
    """`--dependency` and `--constraint` into the spec's `dependencies`/`singleton`/`dependency_any`/`constraint`.

    Job ids in a dependency are OnePlus job ids: a job, an array (all its tasks) or a task (`j-abc_7`); `aftercorr`
    (an array's task waits for the same task of the named array) needs `--array`. `afterburstbuffer` and `+time` are
    refused.
    """
    opt = job.raw("dependency")
    if opt is not None:
        text = (opt.value or "").strip()
        if not text:
            raise job.fail(opt, "names no dependency")
        if "," in text and "?" in text:
            raise job.fail(opt, "mixes ',' (all) and '?' (any); Slurm takes one or the other")
        any_of = "?" in text
        deps: list[dict[str, Any]] = []
        for part in text.split("?" if any_of else ","):
            part = part.strip()
            if part == "singleton":
                fields["singleton"] = True
                continue
            kind, colon, ids = part.partition(":")
            if kind not in _DEPENDENCY_TYPES:
                known = ", ".join((*_DEPENDENCY_TYPES, "singleton"))
                raise job.fail(opt, f"{kind!r} is not a dependency OnePlus supports ({known})")
            job_ids = [j.strip() for j in ids.split(":")] if colon else []
            if not job_ids or any(not j for j in job_ids):
                raise job.fail(opt, f"{part!r} names no job id ({kind}:<job_id>[:<job_id>...])")
            if any("+" in j for j in job_ids):
                raise job.fail(opt, f"{part!r}: a delay (+minutes) after a dependency is not supported")
            if kind == "aftercorr" and job.raw("array") is None:
                raise job.fail(opt, f"{part!r}: aftercorr is for job arrays (each task waits for the task of its id); "
                               "add --array")  # fmt: skip
            deps.append({"type": kind, "job_ids": job_ids})
        if deps:
            fields["dependencies"] = deps
            if any_of and len(deps) > 1:
                fields["dependency_any"] = True
    copt = job.raw("constraint")
    if copt is not None:
        try:
            fields["constraint"] = parse_constraint(copt.value or "").text
        except ConstraintError as exc:
            raise job.fail(copt, str(exc)) from None
