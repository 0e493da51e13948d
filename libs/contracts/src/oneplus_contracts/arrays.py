"""Slurm job arrays (`--array=0-999%50`, `1,3,5-9:2`): the index expression, the tasks it makes (pure).

An array is accepted as ONE fact (its JobSpec with `array` set, under the array's job id); the job owner expands it
into one job per task, `<array id>_<task id>`, each with `array_task` set and `array` cleared, in one commit. Every
task is then an ordinary job: placed, run, cancelled and depended on by its own id. The array's id names all of its
tasks (`scancel`, `afterok:`), and `%N` is held by the scheduler (oneplus_queueing).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from functools import cached_property
from itertools import pairwise

from pydantic import BaseModel, ConfigDict, Field, field_validator

# Slurm's MaxArraySize default: task ids 0..1000. A site raises it (site file `max_array_size`).
DEFAULT_MAX_ARRAY_SIZE = 1001
# Slurm's own ceiling for MaxArraySize; no site may go past it.
MAX_ARRAY_SIZE_CEILING = 4_000_001

_TASK_SUFFIX = re.compile(r"^(?P<array>.+)_(?P<task>\d{1,7})$")
_RANGE = re.compile(r"^(?P<first>\d+)(?:-(?P<last>\d+)(?::(?P<step>\d+))?)?$")


class _Strict(BaseModel):
    """As jobspec.Strict (which imports this module): unknown fields are refused by name."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class ArrayError(ValueError):
    """An index expression Slurm would refuse; the message names the value."""


def parse_indices(text: str, *, max_array_size: int = MAX_ARRAY_SIZE_CEILING) -> tuple[tuple[int, ...], int | None]:
    """`0-999%50` → (task ids, sorted and each once; 50). `max_array_size` bounds the ids (id < max_array_size)."""
    raw = str(text).strip()
    spec, throttle = raw, None
    if "%" in raw:
        spec, _, limit = raw.partition("%")
        if not limit.isdigit():
            raise ArrayError(f"--array={raw}: %{limit}: the task limit must be a whole number")
        throttle = int(limit)
        if throttle < 1:
            raise ArrayError(f"--array={raw}: %{limit}: at most 0 tasks at once would never run one; use %1 or more")
    if not spec:
        raise ArrayError(f"--array={raw}: no task ids")
    ids: set[int] = set()
    for part in spec.split(","):
        m = _RANGE.match(part.strip())
        if m is None:
            raise ArrayError(f"--array={raw}: {part!r} is not an id, a range a-b or a range with a step a-b:s")
        first = int(m["first"])
        last = int(m["last"]) if m["last"] is not None else first
        step = int(m["step"]) if m["step"] is not None else 1
        if step < 1:
            raise ArrayError(f"--array={raw}: {part}: the step must be 1 or more (got {step})")
        if last < first:
            raise ArrayError(f"--array={raw}: {part}: the range ends ({last}) before it starts ({first})")
        if last >= max_array_size:
            raise ArrayError(
                f"--array={raw}: task id {last} is above the site's max_array_size ({max_array_size}: ids 0-"
                f"{max_array_size - 1}; Slurm's MaxArraySize, max_array_size in the site file)"
            )
        ids.update(range(first, last + 1, step))
    return tuple(sorted(ids)), throttle


def compact(ids: Sequence[int]) -> str:
    """Sorted task ids in Slurm's short form: `1,3,5-9:2` → `1-9:2`, `0-999`, `1,4,7-9`."""
    out: list[str] = []
    i, n = 0, len(ids)
    while i < n:
        j = i
        if i + 1 < n:
            step = ids[i + 1] - ids[i]
            while j + 1 < n and ids[j + 1] - ids[j] == step:
                j += 1
            if j - i >= 2 or (j - i == 1 and step == 1):
                out.append(f"{ids[i]}-{ids[j]}" + (f":{step}" if step != 1 else ""))
                i = j + 1
                continue
        out.append(str(ids[i]))
        i += 1
    return ",".join(out)


def regular_step(ids: Sequence[int]) -> int:
    """SLURM_ARRAY_TASK_STEP: the gap between consecutive ids when it is the same throughout, else 1."""
    if len(ids) < 2:
        return 1
    step = ids[1] - ids[0]
    return step if all(b - a == step for a, b in pairwise(ids)) else 1


class JobArray(_Strict):
    """Slurm's `--array`: which task ids, and how many of them may run at once (`%N`)."""

    indices: str = Field(description="Slurm's index expression without %N: '0-999', '1,3,5-9:2'")
    max_running: int | None = Field(default=None, ge=1, description="%N: most tasks running at once; null: no limit")

    @field_validator("indices")
    @classmethod
    def _readable(cls, v: str) -> str:
        if "%" in v:
            raise ValueError(f"indices={v!r}: give the task limit as max_running, not %N")
        return compact(parse_indices(v)[0])

    @classmethod
    def parse(cls, text: str, *, max_array_size: int = MAX_ARRAY_SIZE_CEILING) -> JobArray:
        """`--array=TEXT` (`0-999%50`); ArrayError naming the value when Slurm would refuse it."""
        ids, throttle = parse_indices(text, max_array_size=max_array_size)
        return cls(indices=compact(ids), max_running=throttle)

    @cached_property
    def task_ids(self) -> tuple[int, ...]:
        return parse_indices(self.indices)[0]

    @property
    def tasks(self) -> int:
        return len(self.task_ids)

    def text(self) -> str:
        """As sbatch takes it: `0-999%50`."""
        return self.indices + (f"%{self.max_running}" if self.max_running else "")

    def check_size(self, max_array_size: int) -> None:
        """ArrayError when a task id is not below the site's `max_array_size`."""
        top = self.task_ids[-1]
        if top >= max_array_size:
            raise ArrayError(
                f"--array={self.text()}: task id {top} is above the site's max_array_size ({max_array_size}: ids "
                f"0-{max_array_size - 1}; Slurm's MaxArraySize, max_array_size in the site file)"
            )


class ArrayTask(_Strict):
    """One task of an array: what SLURM_ARRAY_* say, and the `%N` the scheduler holds its array to."""

    array_job_id: str = Field(description="SLURM_ARRAY_JOB_ID: the array's job id (what submitting it answered)")
    task_id: int = Field(ge=0, description="SLURM_ARRAY_TASK_ID")
    count: int = Field(ge=1, description="SLURM_ARRAY_TASK_COUNT")
    min: int = Field(ge=0, description="SLURM_ARRAY_TASK_MIN")
    max: int = Field(ge=0, description="SLURM_ARRAY_TASK_MAX")
    step: int = Field(ge=1, description="SLURM_ARRAY_TASK_STEP")
    max_running: int | None = Field(default=None, ge=1, description="%N of the array")
    indices: str = Field(description="The array's task ids in Slurm's form ('0-999'): every task names them all")


def task_job_id(array_job_id: str, task_id: int) -> str:
    return f"{array_job_id}_{task_id}"


def split_task_id(job_id: str) -> tuple[str, int] | None:
    """`j-abc_7` → (`j-abc`, 7); None for a job id that names no task."""
    m = _TASK_SUFFIX.match(job_id)
    return (m["array"], int(m["task"])) if m else None


def array_tasks(array_job_id: str, array: JobArray) -> list[ArrayTask]:
    ids = array.task_ids
    count, low, high, step = len(ids), ids[0], ids[-1], regular_step(ids)
    return [
        ArrayTask(
            array_job_id=array_job_id,
            task_id=t,
            count=count,
            min=low,
            max=high,
            step=step,
            max_running=array.max_running,
            indices=array.indices,
        )
        for t in ids
    ]


def array_environment(task: ArrayTask) -> dict[str, str]:
    """The SLURM_ARRAY_* variables of a task's ranks."""
    return {
        "SLURM_ARRAY_JOB_ID": task.array_job_id,
        "SLURM_ARRAY_TASK_ID": str(task.task_id),
        "SLURM_ARRAY_TASK_COUNT": str(task.count),
        "SLURM_ARRAY_TASK_MIN": str(task.min),
        "SLURM_ARRAY_TASK_MAX": str(task.max),
        "SLURM_ARRAY_TASK_STEP": str(task.step),
    }


def fill_pattern(pattern: str, array_job_id: str, task_id: int) -> str:
    """sbatch's filename pattern with `%A` (the array's id) and `%a` (the task's) filled in; `%%` stays a '%'."""
    out: list[str] = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "%" and i + 1 < len(pattern):
            nxt = pattern[i + 1]
            if nxt == "A":
                out.append(array_job_id)
                i += 2
                continue
            if nxt == "a":
                out.append(str(task_id))
                i += 2
                continue
            out.append(pattern[i : i + 2])  # other patterns (%j, %x, %%) are left as they are
            i += 2
            continue
        out.append(c)
        i += 1
    return "".join(out)


def array_state(states: Iterable[str]) -> str | None:
    """One state for an array's tasks, as a dependency on the array reads it (Slurm: `afterok:123` holds once every
    task succeeded): pending while any task waits, running while any holds GPUs, else SUCCEEDED when all did, FAILED
    when any failed, CANCELLED otherwise. None for no tasks."""
    seen = set(states)
    if not seen:
        return None
    if seen & {"SUBMITTED", "ACCEPTED"}:
        return "ACCEPTED"
    if seen & {"PLACED", "STARTING", "RUNNING", "PREEMPTING", "CHECKPOINTED"}:
        return "RUNNING"
    if seen == {"SUCCEEDED"}:
        return "SUCCEEDED"
    if "FAILED" in seen or "REJECTED" in seen:
        return "FAILED"
    return "CANCELLED"
