"""A job with `simulate` set, run as a real container: a shell script that behaves as the simulated runtime would.

`simulate` marks a synthetic job (the demo, the simulator, tests). Under the container runtime its rank runs this
script in the job's image instead of its command, so the whole real path is exercised (image, create, env, cpuset,
limits, signals, logs, exit codes) with an image as small as busybox: it needs only `sh`, `sleep` and `date`.
The script sleeps for `duration_s` and exits with `exit_code`; on the checkpoint signal it takes
`checkpoint_after_s`, writes the checkpoint marker and goes on; on SIGTERM it stops at once with 143.
"""

from __future__ import annotations

import shlex

from oneplus_contracts import JobSpec

# A container's PID 1 gets no default signal handlers: without this trap SIGTERM would wait out the stop grace.
_STOP = 'kill $p 2>/dev/null; echo "stopped by SIGTERM"; exit 143'


def _seconds(value: float) -> str:
    """`sleep` takes decimals; three places are finer than the engine's own timing."""
    return f"{max(value, 0.0):.3f}".rstrip("0").rstrip(".") or "0"


def synthetic_script(spec: JobSpec, resume_progress_s: float = 0.0) -> str:
    """The shell script of one rank of a synthetic job (`spec.simulate` must be set).

    A resumed attempt runs only the work left after its last checkpoint, as the simulated runtime does.
    """
    sim = spec.simulate
    if sim is None:
        raise ValueError(f"job {spec.name!r} has no `simulate` section: it runs its own command")
    code = sim.exit_code & 0xFF  # a process exit status is one byte, as the engine will report it
    left = max(0.0, sim.duration_s - resume_progress_s)
    shown = shlex.join(spec.command) if spec.command else "(no command)"
    said = f"simulated run of {shown}: {_seconds(left)} s, then exit {code}"
    if resume_progress_s > 0:
        said += f" (resumed: {_seconds(resume_progress_s)} s were done before the last checkpoint)"
    lines = [f"echo {shlex.quote(said)}"]
    trap_name = spec.checkpoint.signal.removeprefix("SIG")
    stop = _STOP
    if sim.checkpoint_after_s is not None and trap_name != "KILL":
        write = (
            f"sleep {_seconds(sim.checkpoint_after_s)}; "
            'date +%s > "$ONEPLUS_CHECKPOINT_MARKER"; '
            'echo "checkpoint written to $ONEPLUS_CHECKPOINT_MARKER"'
        )
        if trap_name == "TERM":
            stop = f"{write}; {stop}"  # the checkpoint signal is the stop signal: checkpoint, then stop
        else:
            lines.append(f"trap {shlex.quote(write)} {trap_name}")
    lines.append(f"trap {shlex.quote(stop)} TERM")
    # `wait` returns when a trapped signal arrives: wait again until the sleep itself has ended.
    lines.append(f"sleep {_seconds(left)} & p=$!")
    lines.append('while kill -0 "$p" 2>/dev/null; do wait "$p"; done')
    lines.append(f'echo "exited {code}"')
    lines.append(f"exit {code}")
    return "\n".join(lines)


def synthetic_command(spec: JobSpec, resume_progress_s: float = 0.0) -> list[str]:
    """The container command of a synthetic job's rank."""
    return ["sh", "-c", synthetic_script(spec, resume_progress_s)]
