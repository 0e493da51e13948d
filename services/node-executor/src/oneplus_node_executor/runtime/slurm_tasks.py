"""A node's share of running `srun` steps: their tasks run inside the job's containers here (the engine's exec API).

Every node's executor keeps the steps it runs (`NodeTasks`, one per runtime). The batch node's step server starts a
node's share of a step (`NodeStep`), then asks for its output and end as they come (`StepPoll`, a short request: the
executors answer their request subjects one at a time) and forwards signals (`StepSignal`). The same calls serve the
batch node's own share directly and the other nodes' over `subjects.slurm_step(node)`.

A task is started through `/bin/sh -c` that reports its process id first and then `exec`s the command, so that a
signal (scancel, preemption's checkpoint signal, the script's end, srun's own) reaches the task's own process.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import logging
import signal as _signal
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from .docker import DockerRuntime

log = logging.getLogger("oneplus.executor.slurm")

PID_MARK = b"\x1eoneplus-task "  # the first line the task's shell writes on stderr: its process id
# $1: srun's working directory, entered where the container has it (a task elsewhere starts in its container's own).
TASK_SHELL = 'printf "\\036oneplus-task %s\\n" "$$" >&2; [ -z "$1" ] || cd "$1" 2>/dev/null; shift; exec "$@"'
KEEP_OUTPUT_CHUNKS = 100_000  # a step whose output nobody collects stops being buffered past this


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TaskRun(_Model):
    procid: int
    localid: int
    env: dict[str, str]
    slot: int | None = None  # the task's slot on the node (its container's local index); None: localid


class NodeStep(_Model):
    """Start the tasks of one step that one node runs (`subjects.slurm_step(node)`, op "start")."""

    op: Literal["start"] = "start"
    job_id: str
    step_id: int
    argv: list[str]
    cwd: str | None = None
    tasks: list[TaskRun]
    # The batch shell's exported variables the step passes (--export), once for all tasks; each task's own `env`
    # (its SLURM_* step identity) is laid over them.
    env: dict[str, str] = Field(default_factory=dict)


class StepPoll(_Model):
    """What a node's share of a step printed from chunk `since` on, and its tasks' exits once all have ended."""

    op: Literal["poll"] = "poll"
    job_id: str
    step_id: int
    since: int = 0


class StepSignal(_Model):
    """Signal the running tasks of the job here (of one step, or of all)."""

    op: Literal["signal"] = "signal"
    job_id: str
    step_id: int | None = None
    signal: str


StepOp = NodeStep | StepPoll | StepSignal


class OutputChunk(_Model):
    procid: int
    stream: Literal["out", "err"]
    text: str


class TaskResult(_Model):
    procid: int
    exit_code: int


class StepProgress(_Model):
    """A node's answer: output chunks [from, next), whether every task here has ended, and how."""

    chunks: list[OutputChunk] = Field(default_factory=list)
    next: int = 0
    done: bool = False
    results: list[TaskResult] = Field(default_factory=list)
    error: str | None = None
    signalled: int = 0


def signal_name(sig: str | int) -> str:
    """`kill -s`'s spelling (TERM, USR1) of SIGTERM, USR1, 15, ..."""
    if isinstance(sig, int) or str(sig).isdigit():
        return _signal.Signals(int(sig)).name.removeprefix("SIG")
    text = str(sig).upper()
    name = text if text.startswith("SIG") else "SIG" + text
    return _signal.Signals[name].name.removeprefix("SIG")


@dataclass
class _Task:
    procid: int
    cid: str
    pid: int | None = None
    done: bool = False


@dataclass
class _Step:
    job_id: str
    step_id: int
    tasks: list[_Task]
    chunks: list[OutputChunk] = field(default_factory=list)
    base: int = 0  # index of chunks[0]: what the poller already has is dropped
    results: dict[int, TaskResult] = field(default_factory=dict)
    runner: asyncio.Task[None] | None = None
    error: str | None = None

    @property
    def done(self) -> bool:
        return self.runner is not None and self.runner.done()

    def add(self, procid: int, stream: Literal["out", "err"], text: str) -> None:
        if text and len(self.chunks) < KEEP_OUTPUT_CHUNKS:
            self.chunks.append(OutputChunk(procid=procid, stream=stream, text=text))


@dataclass(frozen=True)
class StepEnd:
    """A step's end as the batch node saw it (for the job's end reason and the executor's log)."""

    step_id: int
    exit_code: int
    ended_by_script_end: bool = False

    def describe(self) -> str:
        if self.ended_by_script_end:
            return f"{self.step_id} ended with the batch script (exit {self.exit_code})"
        return f"{self.step_id} exit {self.exit_code}"


class NodeTasks:
    """The steps whose tasks run on this node, and the batch node's record of its jobs' steps."""

    def __init__(self, runtime: DockerRuntime) -> None:
        self.runtime = runtime
        self.steps: dict[tuple[str, int], _Step] = {}
        self.ends: dict[str, list[StepEnd]] = {}  # job → its steps' ends (on its batch node)
        self.served: dict[str, asyncio.Event] = {}  # job → set once its step server has ended its steps

    # -- one step's share here ---------------------------------------------------------------------------------

    async def start(self, step: NodeStep) -> StepProgress:
        key = (step.job_id, step.step_id)
        if key in self.steps and not self.steps[key].done:
            return StepProgress()  # a redelivered start: it runs already (an ended one is an earlier attempt's)
        try:
            containers = sorted(await self.runtime._current(step.job_id), key=lambda c: c.identity.local_rank)
        except LookupError as e:
            return StepProgress(done=True, error=f"srun: error: {e}")
        live = [c for c in containers if c.state == "running" and not c.identity.is_launcher]
        if not live:
            where = self.runtime.node or "this node"
            return StepProgress(
                done=True, error=f"srun: error: job {step.job_id} holds no running container on {where}"
            )
        tasks = []
        for t in step.tasks:
            slot = t.localid if t.slot is None else t.slot
            tasks.append(_Task(procid=t.procid, cid=live[slot % len(live)].id))
        state = _Step(job_id=step.job_id, step_id=step.step_id, tasks=tasks)
        self.steps[key] = state
        state.runner = asyncio.create_task(self._run(state, step), name=f"srun:{step.job_id}.{step.step_id}")
        return StepProgress()

    async def _run(self, state: _Step, step: NodeStep) -> None:
        async def one(task: _Task, run: TaskRun) -> None:
            try:
                code = await self._exec(state, task, step, run)
            except Exception as e:
                state.add(task.procid, "err", f"srun: error: task {task.procid}: {e}\n")
                code = 127
            task.done = True
            state.results[task.procid] = TaskResult(procid=task.procid, exit_code=code)

        await asyncio.gather(*(one(t, r) for t, r in zip(state.tasks, step.tasks, strict=True)))

    async def _exec(self, state: _Step, task: _Task, step: NodeStep, run: TaskRun) -> int:
        async with self.runtime._engine("running a step task") as docker:
            container = docker.containers.container(task.cid)
            argv = ["/bin/sh", "-c", TASK_SHELL, "srun-task", step.cwd or "", *step.argv]
            ex = await container.exec(argv, stdout=True, stderr=True, environment={**step.env, **run.env})
            decode = {s: codecs.getincrementaldecoder("utf-8")("replace") for s in (1, 2)}
            head = b""  # stderr until the task's shell has said its process id
            async with ex.start(detach=False) as stream:
                while (msg := await stream.read_out()) is not None:
                    data = bytes(msg.data)
                    if msg.stream == 2 and task.pid is None:
                        head += data
                        if b"\n" not in head and len(head) < 256:
                            continue
                        line, _, data = head.partition(b"\n")
                        if line.startswith(PID_MARK) and line[len(PID_MARK) :].strip().isdigit():
                            task.pid = int(line[len(PID_MARK) :])
                        else:
                            task.pid = 0  # no mark (not our shell): nothing to signal, everything is output
                            data = head
                    if data:
                        which: Literal["out", "err"] = "err" if msg.stream == 2 else "out"
                        state.add(task.procid, which, decode[msg.stream].decode(data))
            if head and task.pid is None:
                state.add(task.procid, "err", head.decode("utf-8", "replace"))
            for s, which in ((1, "out"), (2, "err")):
                state.add(task.procid, which, decode[s].decode(b"", final=True))
            for _ in range(100):  # the engine may report the exit a moment after the output ends
                info = await ex.inspect()
                if not info.get("Running") and info.get("ExitCode") is not None:
                    return int(info["ExitCode"])
                await asyncio.sleep(0.05)
        return 127

    def poll(self, job_id: str, step_id: int, since: int) -> StepProgress:
        state = self.steps.get((job_id, step_id))
        if state is None:
            why = f"srun: error: step {job_id}.{step_id} is not running on {self.runtime.node or 'this node'}"
            return StepProgress(done=True, error=why + " (its executor restarted?)")
        drop = max(0, min(since - state.base, len(state.chunks)))
        if drop:
            del state.chunks[:drop]
            state.base += drop
        done = state.done
        chunks = list(state.chunks)
        out = StepProgress(chunks=chunks, next=state.base + len(chunks), done=done, error=state.error)
        if done:
            out.results = [state.results[p] for p in sorted(state.results)]
            if not chunks:
                self.steps.pop((job_id, step_id), None)  # all of it was collected
        return out

    # -- signals -----------------------------------------------------------------------------------------------

    def running(self, job_id: str) -> bool:
        return any(not s.done for (job, _), s in self.steps.items() if job == job_id)

    async def signal(self, job_id: str, sig: str, step_id: int | None = None) -> int:
        """Send `sig` to the running tasks of the job here (of one step, or all); how many were signalled."""
        try:
            name = signal_name(sig)
        except (KeyError, ValueError):
            log.warning("%s: %r is not a signal; the step tasks were not signalled", job_id, sig)
            return 0
        targets = [
            t
            for (job, sid), s in list(self.steps.items())
            if job == job_id and (step_id is None or sid == step_id) and not s.done
            for t in s.tasks
            if not t.done and t.pid
        ]
        sent = await asyncio.gather(*(self._kill(t, name) for t in targets))
        return sum(sent)

    async def _kill(self, task: _Task, name: str) -> bool:
        try:
            async with self.runtime._engine("signalling a step task") as docker:
                ex = await docker.containers.container(task.cid).exec(
                    ["/bin/sh", "-c", f"kill -s {name} {task.pid}"], stdout=True, stderr=True
                )
                async with ex.start(detach=False) as stream:
                    while await stream.read_out() is not None:
                        pass
            return True
        except Exception as e:  # the task or its container ended meanwhile
            log.debug("signalling task %s (pid %s) failed: %s", task.procid, task.pid, e)
            return False

    async def end(self, job_id: str, grace_s: float) -> None:
        """The job is stopped here: SIGTERM its running tasks and give them up to grace_s to end (Slurm's KillWait)
        before their containers are stopped."""
        if not self.running(job_id):
            return
        await self.signal(job_id, "SIGTERM")
        runners = [s.runner for (job, _), s in self.steps.items() if job == job_id and s.runner is not None]
        live = [r for r in runners if not r.done()]
        if live:
            await asyncio.wait(live, timeout=grace_s)

    def forget(self, job_id: str) -> None:
        for key in [k for k in self.steps if k[0] == job_id]:
            state = self.steps.pop(key)
            if state.runner is not None and not state.runner.done():
                state.runner.cancel()
        self.ends.pop(job_id, None)
        self.served.pop(job_id, None)

    # -- the batch node's record of a job's steps --------------------------------------------------------------

    def record_end(self, job_id: str, end: StepEnd) -> None:
        self.ends.setdefault(job_id, []).append(end)

    def summary(self, job_id: str, most: int = 12) -> str | None:
        """The job's steps' ends in one clause: 'srun steps: 0 exit 0, 1 ended with the batch script (exit 143)'."""
        ends = sorted(self.ends.get(job_id, []), key=lambda e: e.step_id)
        if not ends:
            return None
        shown = ", ".join(e.describe() for e in ends[:most])
        more = f", {len(ends) - most} more" if len(ends) > most else ""
        return f"srun steps: {shown}{more}"

    async def steps_served(self, job_id: str, timeout_s: float) -> None:
        """Wait (bounded) until the job's step server has ended its steps, so that their ends are in the reason."""
        event = self.served.get(job_id)
        if event is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), timeout_s)


async def serve_op(tasks: NodeTasks, op: StepOp) -> StepProgress:
    """One request of the batch node's step server about this node's share of a step."""
    if isinstance(op, NodeStep):
        return await tasks.start(op)
    if isinstance(op, StepPoll):
        return tasks.poll(op.job_id, op.step_id, op.since)
    return StepProgress(signalled=await tasks.signal(op.job_id, op.signal, op.step_id))


def parse_op(payload: dict[str, Any]) -> StepOp:
    op = payload.get("op", "start")
    if op == "poll":
        return StepPoll.model_validate(payload)
    if op == "signal":
        return StepSignal.model_validate(payload)
    return NodeStep.model_validate(payload)
