"""Queue configuration: the organisation → team tree, guarantees and borrowing, priority classes, policy knobs.

The config is kept in the `queues` KV bucket as YAML; intake calls `validate_job` to reject a job whose queue or
priority class does not exist, and the scheduling cycle reads everything else.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Annotated, Any, Literal

import yaml
from oneplus_contracts import JobSpec
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
DEFAULT_QUEUE = "default"


class QueueConfigError(ValueError):
    """The queue configuration is invalid, or a job names something it does not define."""


class UnknownQueue(QueueConfigError):
    def __init__(self, name: str, known: Iterable[str]) -> None:
        self.queue = name
        super().__init__(f"unknown queue {name!r}; known queues: {', '.join(sorted(known)) or '(none)'}")


class UnknownPriorityClass(QueueConfigError):
    def __init__(self, name: str, known: Iterable[str]) -> None:
        self.priority_class = name
        super().__init__(f"unknown priority class {name!r}; known classes: {', '.join(sorted(known)) or '(none)'}")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class QueueSpec(_Model):
    """One node of the queue tree: an organisation (no parent) or a team under one."""

    name: str
    parent: str | None = None
    guarantee_gpus: Annotated[float, Field(ge=0)] = 0.0
    borrow_limit_gpus: Annotated[float, Field(ge=0)] | None = Field(
        default=None, description="GPUs it may use above its guarantee; null: no limit"
    )
    weight: Annotated[float, Field(gt=0)] = 1.0
    description: str = ""
    placement: Literal["best-fit", "fgd", "cp-sat"] = Field(
        default="best-fit",
        description="How its jobs' GPUs are chosen: best fit, FGD (the node and GPUs where the fragmentation "
        "expected for the cycle's workload mix grows least; Weng et al., ATC '23), or cp-sat (its first waiting jobs "
        "placed jointly each cycle when that places more than best fit one by one; see `batch`)",
    )
    queueing: Literal["best-effort-fifo", "strict-fifo"] = Field(
        default="best-effort-fifo",
        description="Whether its jobs may pass one another: best-effort-fifo (a job that cannot start now does not "
        "hold back later ones of the queue) or strict-fifo (by priority, then submission; the first that waits "
        "holds back the rest of the queue); Kueue's queueing strategies",
    )
    sharing: Literal["mps", "time-slice"] = Field(
        default="mps",
        description="How its GPU shares (gpus below 1) run: mps (isolated under the node's MPS daemon with their SM "
        "and memory limits; only nodes that run MPS take them) or time-slice (any node, no memory or compute "
        "isolation between the tenants of a GPU)",
    )
    mix_gpu_models: bool = Field(
        default=False,
        description="Whether a gang of its jobs may span nodes of several GPU models; false: one model per gang "
        "(Kueue's one flavor per pod set), unless the job's gpu_models lists several",
    )

    gpu_models: list[str] | None = Field(
        default=None,
        description="GPU models its jobs run on (Kueue's flavors): a job naming no models gets these (a team queue "
        "without its own takes its parent's); a job naming others is refused; null: any model",
    )

    @model_validator(mode="after")
    def _valid_name(self) -> QueueSpec:
        if not _NAME_RE.match(self.name):
            raise ValueError(f"queue name {self.name!r} must be 1-128 letters, digits, '.', '_' or '-'")
        return self

    @property
    def limit_gpus(self) -> float:
        """The most GPUs this queue may hold: guarantee plus borrow limit."""
        if self.borrow_limit_gpus is None:
            return math.inf
        return self.guarantee_gpus + self.borrow_limit_gpus


class PriorityClass(_Model):
    value: Annotated[int, Field(ge=0, le=1_000_000)]
    preemptible: bool = Field(default=True, description="False makes every job of the class non-preemptible")
    description: str = ""


class FairSharePolicy(_Model):
    half_life_s: Annotated[float, Field(gt=0)] = 7 * 24 * 3600.0
    weight: Annotated[float, Field(ge=0)] = 1000.0


class AgeingPolicy(_Model):
    """Waiting raises a job's score by `weight` per `period_s`, without limit, so nothing waits forever.

    A cap (`max_bonus`, Slurm's PriorityMaxAge) is allowed but gives that guarantee up: under a steady stream of
    higher-priority work, a job whose bonus stopped growing is overtaken by every newcomer that waits a little.
    """

    weight: Annotated[float, Field(ge=0)] = 1000.0
    period_s: Annotated[float, Field(gt=0)] = 24 * 3600.0
    max_bonus: Annotated[float, Field(ge=0)] | None = None


class JobSizePolicy(_Model):
    """Small requests first: the score drops by `weight` per decade of requested GPU-hours (GPUs × time limit) above
    one GPU-hour, as Slurm's PriorityFavorSmall does with its job-size factor. Ageing still lifts every job, so a
    large request is delayed, never starved. A job without a time limit counts `no_limit_hours` per GPU.
    """

    weight: Annotated[float, Field(ge=0)] = 2000.0
    no_limit_hours: Annotated[float, Field(gt=0)] = Field(
        default=24.0 * 7, description="Hours assumed for a job that gives no time limit"
    )


class PreemptionPolicy(_Model):
    enabled: bool = True
    preemption_delay_s: Annotated[float, Field(ge=0)] = Field(
        default=0.0, description="A pending job waits this long before it may evict anyone"
    )
    min_runtime_s: Annotated[float, Field(ge=0)] = Field(
        default=3600.0,  # 0 thrashed on mixed-cluster replays: gangs evicted minutes after their start, again and again
        description="Floor on a victim's run time since its (re)start against priority preemption (reclaim of "
        "borrowed GPUs skips it); a job's own min_runtime_s adds",
    )
    restart_cost_s: Annotated[float, Field(ge=0)] = Field(
        default=60.0, description="Seconds of GPU time a restart costs each victim GPU (load, warm-up)"
    )
    protection_backoff: Annotated[float, Field(ge=1)] = Field(
        default=2.0, description="Each earlier preemption multiplies a job's minimum run time by this"
    )
    max_preemptions_per_job: Annotated[int, Field(ge=1)] = Field(
        default=3, description="A job preempted this many times is never preempted again"
    )
    rate_limit_gangs: Annotated[int, Field(ge=1)] = Field(default=20, description="Victim gangs per rate window")
    searches_per_cycle: Annotated[int, Field(ge=0)] = Field(
        default=8, description="Victim searches per cycle: each runs several trial placements"
    )
    rate_window_s: Annotated[float, Field(gt=0)] = 300.0
    max_candidates: Annotated[int, Field(ge=1)] = Field(
        default=64, description="Victim candidates examined per domain, cheapest first"
    )
    exact_search_max: Annotated[int, Field(ge=0, le=16)] = Field(
        default=10, description="Up to this many candidates in a domain, every subset is tried (exact minimum)"
    )


class BackfillPolicy(_Model):
    scan_limit: Annotated[int, Field(ge=0)] = Field(
        default=200, description="Pending jobs examined after the head-of-line job is blocked"
    )
    default_time_limit_s: Annotated[float, Field(gt=0)] | None = Field(
        default=None, description="Assumed time limit of jobs that give none; null: such jobs never end for planning"
    )
    min_age_reserve_s: Annotated[float, Field(ge=0)] = Field(
        default=0.0,
        description="A blocked job is protected (its block reserved) only once it has waited this long; until then "
        "jobs behind it take any free GPUs (Slurm's bf_min_age_reserve)",
    )


class BatchPolicy(_Model):
    """How a `placement: cp-sat` queue places its first waiting jobs jointly (docs/placement.md, "CP-SAT in the live
    cycle")."""

    window: Annotated[int, Field(ge=2, le=256)] = Field(
        default=32, description="Waiting jobs of the queue, first in its order, placed jointly each cycle"
    )
    time_limit_s: Annotated[float, Field(gt=0, le=10)] = Field(
        default=0.2, description="CP-SAT's bound per queue and cycle; best fit's answer stands unless it beats it"
    )
    max_wait_s: Annotated[float, Field(ge=0)] = Field(
        default=600.0,
        description="A job that has waited this long is left out of the window and served by best fit in its turn: "
        "a joint answer that keeps passing it over cannot starve it",
    )


class BoardPolicy(_Model):
    """Mixed board kinds: a one-node gang offered only a weaker board (docs/queueing.md, "A weaker board now, or a
    strong one later"), and which gangs leave the strong boards to others (docs/placement.md)."""

    wait_for_faster: bool = Field(
        default=True,  # on the mixed-cluster replay: 0.74x the best baseline's mean JCT, the lowest slowdown
        description="Wait for a strong board when it is expected to finish the job sooner than running slower now",
    )
    keep_strong_boards: bool = Field(
        default=True,
        description="A one-GPU job, or a gang whose ring the network bounds, takes the weakest board kind at par "
        "for it, keeping the NVLink boards for gangs that ring inside one node; false: best fit alone. Turn it off "
        "where boards differ in compute speed that the jobs need (the model counts communication only)",
    )
    comm_fraction: Annotated[float, Field(ge=0, le=1)] = Field(
        default=0.2,  # the middle of the simulator's range for one-node jobs, f ~ U(0.1, 0.3)
        description="The share of a step spent communicating, assumed for every job (the model's f)",
    )


class QueueConfig(_Model):
    queues: list[QueueSpec] = Field(default_factory=lambda: [QueueSpec(name=DEFAULT_QUEUE)])
    priority_classes: dict[str, PriorityClass] = Field(default_factory=dict)
    default_priority_class: str | None = None
    fairshare: FairSharePolicy = Field(default_factory=FairSharePolicy)
    ageing: AgeingPolicy = Field(default_factory=AgeingPolicy)
    job_size: JobSizePolicy = Field(default_factory=JobSizePolicy)
    preemption: PreemptionPolicy = Field(default_factory=PreemptionPolicy)
    backfill: BackfillPolicy = Field(default_factory=BackfillPolicy)
    boards: BoardPolicy = Field(default_factory=BoardPolicy)
    batch: BatchPolicy = Field(default_factory=BatchPolicy)

    @model_validator(mode="after")
    def _coherent_tree(self) -> QueueConfig:
        if not self.queues:
            raise ValueError("queues: at least one queue is needed")
        tree = _QueueTree.build(self.queues)
        by_name, children = tree.by_name, tree.children
        for parent, kids in children.items():
            if parent is None:
                continue
            total = sum(by_name[k].guarantee_gpus for k in kids)
            if total > by_name[parent].guarantee_gpus + 1e-9:
                raise ValueError(
                    f"queues: the guarantees of {parent!r}'s children sum to {total:g} GPUs, "
                    f"more than its own guarantee of {by_name[parent].guarantee_gpus:g}"
                )
        if self.default_priority_class is not None and self.default_priority_class not in self.priority_classes:
            raise ValueError(
                f"default_priority_class {self.default_priority_class!r} is not one of the priority_classes "
                f"({', '.join(sorted(self.priority_classes)) or 'none defined'})"
            )
        for name in self.priority_classes:
            if not _NAME_RE.match(name):
                raise ValueError(f"priority class name {name!r} must be 1-128 letters, digits, '.', '_' or '-'")
        return self

    @cached_property
    def tree(self) -> _QueueTree:
        """Lookups by name, children and paths; a plain object, so hot loops pay no pydantic attribute cost."""
        return _QueueTree.build(self.queues)

    # -- the tree -------------------------------------------------------------------------------------------------

    def queue(self, name: str) -> QueueSpec:
        by_name = self.tree.by_name
        try:
            return by_name[name]
        except KeyError:
            raise UnknownQueue(name, by_name) from None

    def children(self, name: str | None) -> list[str]:
        """Children of a queue; `None` gives the organisations (top-level queues)."""
        return list(self.tree.children.get(name, ()))

    def is_leaf(self, name: str) -> bool:
        self.queue(name)
        return not self.tree.children.get(name)

    def leaf_queues(self) -> list[str]:
        children = self.tree.children
        return [q.name for q in self.queues if not children.get(q.name)]

    @cached_property
    def mixing_queues(self) -> frozenset[str]:
        """Queues whose gangs may span GPU models: `mix_gpu_models` set on the queue or on an ancestor."""
        mixing = {q.name for q in self.queues if q.mix_gpu_models}
        return frozenset(q.name for q in self.queues if mixing.intersection(self.path(q.name)))

    @cached_property
    def timeslice_queues(self) -> frozenset[str]:
        """Queues whose GPU shares may run unisolated: `sharing: time-slice` set on the queue or on an ancestor."""
        slicing = {q.name for q in self.queues if q.sharing == "time-slice"}
        return frozenset(q.name for q in self.queues if slicing.intersection(self.path(q.name)))

    def path(self, name: str) -> tuple[str, ...]:
        """Queue names from the organisation down to `name`."""
        try:
            return self.tree.paths[name]
        except KeyError:
            raise UnknownQueue(name, self.tree.by_name) from None

    # -- jobs -----------------------------------------------------------------------------------------------------

    def validate_job(self, spec: JobSpec) -> None:
        """Raise `QueueConfigError` (with a message a person can act on) when the job cannot be queued."""
        if not self.is_leaf(spec.queue):
            raise QueueConfigError(
                f"queue {spec.queue!r} is an organisation queue; submit to one of its teams: "
                f"{', '.join(sorted(self.children(spec.queue)))}"
            )
        self._priority_class(spec)

    def queue_models(self, name: str) -> list[str] | None:
        """The GPU models a queue's jobs run on: its own `gpu_models`, else the nearest ancestor's; None: any."""
        by_name = self.tree.by_name
        for q in reversed(self.path(name)):
            models = by_name[q].gpu_models
            if models:
                return list(models)
        return None

    def with_queue_models(self, spec: JobSpec) -> JobSpec:
        """`spec` restricted to its queue's GPU models (a job naming none gets them); `QueueConfigError` when the job
        names models its queue does not run on. Intake applies it before admission."""
        allowed = self.queue_models(spec.queue)
        if not allowed:
            return spec
        asked = spec.resources.gpu_models
        if not asked:
            resources = spec.resources.model_copy(update={"gpu_models": allowed})
            return spec.model_copy(update={"resources": resources})
        outside = [m for m in asked if not any(a.lower() in m.lower() or m.lower() in a.lower() for a in allowed)]
        if outside:
            raise QueueConfigError(
                f"queue {spec.queue!r} runs on GPU models {allowed}; the job asks for {outside} outside them"
            )
        return spec

    def _priority_class(self, spec: JobSpec) -> PriorityClass | None:
        name = spec.priority_class or self.default_priority_class
        if name is None:
            return None
        try:
            return self.priority_classes[name]
        except KeyError:
            raise UnknownPriorityClass(name, self.priority_classes) from None

    def priority_of(self, spec: JobSpec) -> int:
        """Static priority: the class's value (or the default class's) plus the job's own `priority`."""
        pc = self._priority_class(spec)
        return (pc.value if pc else 0) + spec.priority

    def preemptible(self, spec: JobSpec) -> bool:
        """A job is preemptible unless it or its priority class says otherwise."""
        pc = self._priority_class(spec)
        return spec.preemptible and (pc.preemptible if pc else True)


@dataclass(frozen=True)
class _QueueTree:
    by_name: dict[str, QueueSpec]
    children: dict[str | None, list[str]]
    paths: dict[str, tuple[str, ...]]

    @classmethod
    def build(cls, queues: Sequence[QueueSpec]) -> _QueueTree:
        by_name: dict[str, QueueSpec] = {}
        for q in queues:
            if q.name in by_name:
                raise ValueError(f"queues: {q.name!r} is defined twice")
            by_name[q.name] = q
        for q in queues:
            if q.parent is not None and q.parent not in by_name:
                raise ValueError(f"queues: {q.name!r} has unknown parent {q.parent!r}")
        paths = {q.name: _path_to_root(q.name, by_name) for q in queues}
        children: dict[str | None, list[str]] = {}
        for q in queues:
            children.setdefault(q.parent, []).append(q.name)
        return cls(by_name, children, paths)


def _path_to_root(name: str, by_name: dict[str, QueueSpec]) -> tuple[str, ...]:
    path = [name]
    seen = {name}
    parent = by_name[name].parent
    while parent is not None:
        if parent in seen:
            raise ValueError(f"queues: the parents of {name!r} form a cycle through {parent!r}")
        seen.add(parent)
        path.append(parent)
        parent = by_name[parent].parent
    return tuple(reversed(path))


def default_config() -> QueueConfig:
    """One `default` queue with no guarantee and no limit, so a bare system schedules by priority and age."""
    return QueueConfig()


def load_queue_config(yaml_text: str) -> QueueConfig:
    """Parse the YAML form; every problem comes back as a `QueueConfigError` naming the key."""
    try:
        data: Any = yaml.safe_load(yaml_text)
    except yaml.YAMLError as exc:
        raise QueueConfigError(f"queue config is not valid YAML: {exc}") from exc
    if data is None:
        return default_config()
    if not isinstance(data, dict):
        raise QueueConfigError(f"queue config must be a mapping with a 'queues' list, got {type(data).__name__}")
    try:
        return QueueConfig.model_validate(data)
    except ValidationError as exc:
        raise QueueConfigError(describe_validation(exc)) from exc


def describe_validation(exc: ValidationError) -> str:
    """One `key.path: problem` line per error, as every queue-config error reads."""
    lines = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = err["msg"].removeprefix("Value error, ")
        lines.append(f"{where}: {msg}")
    return "invalid queue config: " + "; ".join(lines)
