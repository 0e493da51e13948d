"""Which part of a Slurm batch job's allocation each running `srun` step holds (Slurm's step resource sharing).

The allocation is counted in task slots: a node of the job has as many as the allocation's tasks there, each with one
task's CPUs, memory and GPUs (a rank's container: a task runs in the container of its slot, and sees its GPUs). As
srun(1) says of steps running side by side:

* a step without `--exact` is given every slot of each of its nodes (all their CPUs and memory);
* with `--exact`, only what its tasks ask for: `-c` CPUs each (1 by default) of a slot, and the slot's GPUs when the
  step asks for GPUs; so `--exact` steps share a node, and a slot while its CPUs last;
* with `--overlap`, it holds nothing and runs at once, beside (and inside) the others' slots;
* a step that does not fit beside the running ones waits until they have released enough (srun: "Job step creation
  temporarily disabled, retrying").

`--gpus`, `--gpus-per-task`, `--gpus-per-node` and `--gres=gpu:N` are checked against the allocation; since a task
sees the GPUs of its slot's container, a step's GPUs are those of the slots its tasks hold.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field


class GpuAskError(ValueError):
    """A step's GPU options the allocation cannot give; the message is srun's stderr line."""


@dataclass(frozen=True)
class GpuAsk:
    """A step's GPU options, as srun(1) spells them (None: not given)."""

    total: int | None = None  # -G/--gpus
    per_task: int | None = None  # --gpus-per-task
    per_node: int | None = None  # --gpus-per-node
    gres: int | None = None  # --gres=gpu[:type]:N (per node)
    option: str = ""  # the option as given, for the message

    @property
    def given(self) -> bool:
        return any(v is not None for v in (self.total, self.per_task, self.per_node, self.gres))


def check_gpus(ask: GpuAsk, tasks_on: Mapping[str, int], gpus_per_slot: int, slots_on: Mapping[str, int]) -> None:
    """Refuse GPU options the allocation cannot satisfy: more GPUs than it holds (on the step's nodes or in all), or
    more per task than one task's container has (a task sees its own container's GPUs only)."""
    if not ask.given:
        return
    ntasks = sum(tasks_on.values())
    total_here = gpus_per_slot * sum(slots_on.values())
    per_task: list[tuple[int, str]] = []
    if ask.total is not None:
        if ask.total > total_here:
            raise GpuAskError(
                f"srun: error: {ask.option}: more GPUs than the job's allocation has ({total_here})"
                if total_here
                else f"srun: error: {ask.option}: the job's allocation has no GPUs"
            )
        per_task.append((math.ceil(ask.total / max(ntasks, 1)), f"{ask.total} GPU(s) over {ntasks} task(s)"))
    for per_node, name in ((ask.per_node, "per node"), (ask.gres, "per node")):
        if per_node is None:
            continue
        most = gpus_per_slot * max(slots_on[n] for n in tasks_on)
        if per_node > most:
            raise GpuAskError(
                f"srun: error: {ask.option}: more GPUs than the job's allocation has {name} ({most})"
                if most
                else f"srun: error: {ask.option}: the job's allocation has no GPUs"
            )
        fewest = min(tasks_on.values())
        per_task.append((math.ceil(per_node / max(fewest, 1)), f"{per_node} GPU(s) per node over {fewest} task(s)"))
    if ask.per_task is not None:
        per_task.append((ask.per_task, f"{ask.per_task} GPU(s) per task"))
    for need, what in per_task:
        if need > gpus_per_slot:
            if not gpus_per_slot:
                raise GpuAskError(f"srun: error: {ask.option}: the job's allocation has no GPUs")
            raise GpuAskError(
                f"srun: error: {ask.option}: {what} is more than one task's {gpus_per_slot} GPU(s): each task runs "
                "in one of the allocation's task containers and sees its GPUs only (ask for more tasks)"
            )


@dataclass(frozen=True)
class StepClaim:
    """What a step asks of the allocation: its tasks per node and srun's sharing options."""

    tasks_on: Mapping[str, int]  # node → the step's tasks there (its nodes, in order)
    exact: bool = False
    overlap: bool = False
    cpus_per_task: int = 1  # -c/--cpus-per-task (what an --exact task takes of its slot)
    gpus: bool = False  # its tasks use GPUs (--gpus...): each holds its slot's GPUs


# One task's hold on a slot: (slot, CPUs, whether it holds the slot's GPUs).
Hold = tuple[int, int, bool]


@dataclass
class Shares:
    """The parts of the allocation the running steps hold. Not thread-safe: one step server owns it.

    A slot is one of the allocation's tasks on a node: `cpus_per_slot` CPUs and its container's GPUs. A step without
    --exact holds every slot of its nodes whole; an --exact task holds `cpus_per_task` CPUs of one slot (several may
    share a slot while its CPUs last) and, when it uses GPUs, the slot's GPUs alone."""

    slots_on: Mapping[str, int]  # node → task slots of the allocation there
    cpus_per_slot: int = 1
    held: dict[int, dict[str, list[Hold]]] = field(default_factory=dict)  # step → node → its holds

    def _used(self, node: str) -> tuple[list[int], list[bool]]:
        cpus = [0] * self.slots_on[node]
        gpus = [False] * self.slots_on[node]
        for holding in self.held.values():
            for slot, c, g in holding.get(node, ()):
                cpus[slot] += c
                gpus[slot] = gpus[slot] or g
        return cpus, gpus

    def free_on(self, node: str) -> list[int]:
        """The slots nobody holds any part of."""
        cpus, gpus = self._used(node)
        return [s for s in range(self.slots_on[node]) if not cpus[s] and not gpus[s]]

    def fits(self, claim: StepClaim) -> bool:
        return self._pick(claim) is not None

    def take(self, step_id: int, claim: StepClaim) -> dict[str, tuple[int, ...]] | None:
        """The slot each task of the step runs in, per node (the node's tasks in order); None when the step does
        not fit beside the running steps (it waits). An --overlap step holds nothing."""
        picked = self._pick(claim)
        if picked is None:
            return None
        slots, holds = picked
        if not claim.overlap:
            self.held[step_id] = holds
        return slots

    def release(self, step_id: int) -> None:
        self.held.pop(step_id, None)

    def _pick(self, claim: StepClaim) -> tuple[dict[str, tuple[int, ...]], dict[str, list[Hold]]] | None:
        slots: dict[str, tuple[int, ...]] = {}
        holds: dict[str, list[Hold]] = {}
        for node, count in claim.tasks_on.items():
            n = self.slots_on[node]
            if claim.overlap:
                slots[node] = tuple(i % n for i in range(count))  # shares whatever the others hold
                continue
            if not claim.exact:
                if len(self.free_on(node)) < n:
                    return None  # without --exact a step takes the whole node: it waits for a node nobody uses
                slots[node] = tuple(i % n for i in range(count))
                holds[node] = [(s, self.cpus_per_slot, True) for s in range(n)]
                continue
            cpus, gpus = self._used(node)
            mine: list[int] = []
            for _ in range(count):
                slot = next(
                    (
                        s
                        for s in range(n)
                        if self.cpus_per_slot - cpus[s] >= claim.cpus_per_task and not (claim.gpus and gpus[s])
                    ),
                    None,
                )
                if slot is None:
                    return None
                cpus[slot] += claim.cpus_per_task
                gpus[slot] = gpus[slot] or claim.gpus
                mine.append(slot)
            slots[node] = tuple(mine)
            holds[node] = [(s, claim.cpus_per_task, claim.gpus) for s in mine]
        return slots, holds

    def node_fits(self, node: str, count: int, claim: StepClaim) -> bool:
        """Whether `count` tasks of a step like `claim` would start on `node` now."""
        return (
            self._pick(StepClaim({node: count}, claim.exact, claim.overlap, claim.cpus_per_task, claim.gpus))
            is not None
        )
