"""What a scheduling cycle reads (pending and running jobs) and what it decides."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from oneplus_contracts import Allocation, Domain, JobRecord, JobSpec
from oneplus_contracts.jobindex import HOLDING_STATES

from .elastic import running_size

ReasonCode = Literal[
    "Priority",  # jobs ahead of it (or the protected reservation) come first
    "Resources",  # not enough free GPUs/CPU/memory now
    "Topology",  # enough GPUs, but not inside the domain its constraint asks for
    "QuotaExceeded",  # its queue (or an ancestor) is at guarantee + borrow limit
    "Preempting",  # victims are being evicted for it; the freed GPUs are nominated for it
    "InvalidQueue",  # its queue or priority class is not in the queue config
    "Dependency",  # its --dependency (or singleton) is not satisfied yet; it is not considered
    "DependencyNeverSatisfied",  # a dependency can never be satisfied: the job is ended
    "BadConstraints",  # no node of the cluster has the features its --constraint asks for
    "JobArrayTaskLimit",  # its array already runs as many tasks as its %N allows (Slurm's reason)
    "BeginTime",  # its --begin time has not come yet (Slurm's reason)
    "Reservation",  # its --reservation has not started, has ended, is gone or does not admit it (Slurm's reason)
]
PreemptionKind = Literal["priority", "reclaim", "resize"]  # resize: an elastic gang restarts at another size


@dataclass(frozen=True, slots=True)
class PendingJob:
    job_id: str
    spec: JobSpec
    submitted_ts: float
    preemptions: int = 0
    checkpoint_ts: float | None = None

    @classmethod
    def from_record(cls, rec: JobRecord) -> PendingJob:
        if rec.state != "ACCEPTED":
            raise ValueError(f"job {rec.job_id} is {rec.state}, not pending (ACCEPTED)")
        return cls(rec.job_id, rec.spec, rec.submitted_ts, rec.preemptions, rec.checkpoint_ts)

    @property
    def queue(self) -> str:
        return self.spec.queue

    @property
    def gpus(self) -> float:
        return self.spec.total_gpus


@dataclass(frozen=True, slots=True)
class RunningJob:
    """A job that holds GPUs: placed, starting, running or already being preempted."""

    job_id: str
    spec: JobSpec
    allocation: Allocation
    started_ts: float
    checkpoint_ts: float | None = None
    preemptions: int = 0
    preempting: bool = False

    @classmethod
    def from_record(cls, rec: JobRecord) -> RunningJob:
        if rec.state not in HOLDING_STATES or rec.allocation is None:
            raise ValueError(f"job {rec.job_id} is {rec.state} without an allocation; it holds no GPUs")
        started = rec.started_ts if rec.started_ts is not None else rec.updated_ts
        return cls(
            rec.job_id,
            running_size(rec.spec, rec.allocation),  # an elastic job counts the ranks it runs with
            rec.allocation,
            started,
            rec.checkpoint_ts,
            rec.preemptions,
            rec.state in ("PREEMPTING", "CHECKPOINTED"),  # a checkpointed victim's ranks are stopping: vacating
        )

    @property
    def queue(self) -> str:
        return self.spec.queue

    @property
    def gpus(self) -> float:
        return self.spec.total_gpus

    def end_ts(self, default_time_limit_s: float | None = None) -> float | None:
        """When its time limit runs out; None when it has none (it may run forever)."""
        limit = self.spec.time_limit_s if self.spec.time_limit_s is not None else default_time_limit_s
        return None if limit is None else self.started_ts + limit

    def lost_work_gpu_s(self, now: float) -> float:
        """GPU-seconds thrown away if it stopped now: work since its last checkpoint of this run."""
        since = max(self.started_ts, self.checkpoint_ts if self.checkpoint_ts is not None else self.started_ts)
        return self.gpus * max(0.0, now - since)


@dataclass(frozen=True, slots=True)
class PendingReason:
    job_id: str
    code: ReasonCode
    message: str


@dataclass(frozen=True, slots=True)
class Reservation:
    """The head-of-line job's protected block: the domain it will start in, and when."""

    job_id: str
    domain: Domain
    domain_name: str  # the node, leaf or spine name; "cluster" for the whole cluster
    nodes: tuple[str, ...]
    start_ts: float | None  # None: some blocker has no time limit, so the start cannot be known
    allocation: Allocation


@dataclass(frozen=True, slots=True)
class VictimChoice:
    preemptor: str
    victims: tuple[str, ...]
    kinds: tuple[PreemptionKind, ...]  # per victim: on what grounds it is evicted
    nominated: Allocation  # the allocation the preemptor gets once the victims are gone
    lost_work_gpu_s: float  # Σ GPUs × time since last checkpoint, plus restart costs
    freed_gpus: float
    grace_s: float  # the longest checkpoint grace among the victims: when the nominated GPUs free up
    # Elastic victims that come back at once at another size (shrunk for the preemptor, or the job itself growing):
    # victim → the allocation nominated for its restart.
    resized: Mapping[str, Allocation] = field(default_factory=dict)

    @property
    def kind(self) -> PreemptionKind:
        """`reclaim` when any victim is evicted to give a queue its guarantee back, `resize` when an elastic job grows
        (it is its own victim), else `priority`."""
        if "reclaim" in self.kinds:
            return "reclaim"
        return "resize" if self.victims == (self.preemptor,) else "priority"


@dataclass
class CycleStats:
    placement_calls: int = 0
    skipped_by_count: int = 0
    skipped_by_memo: int = 0
    victim_searches: int = 0
    batch_solves: int = 0  # cp-sat queues whose joint plan beat best fit this cycle
    wall_s: float = 0.0


@dataclass(frozen=True, slots=True)
class CycleCarry:
    """What one cycle hands the next: the GPUs nominated for preemptors, and the job whose block is protected.

    Every driver (the solver, the simulator, the test harness) passes the previous decision's `carry` back in, so a
    preemptor gets the GPUs its victims free and a protected job stays first among its priority's jobs until it runs.
    """

    nominations: Mapping[str, Allocation] = field(default_factory=dict)
    protected: str | None = None


@dataclass
class CycleDecision:
    now: float
    placements: dict[str, Allocation] = field(default_factory=dict)
    reasons: dict[str, PendingReason] = field(default_factory=dict)
    reservation: Reservation | None = None
    preemptions: list[VictimChoice] = field(default_factory=list)
    nominations: dict[str, Allocation] = field(default_factory=dict)  # preemptor → GPUs kept for it
    order: list[str] = field(default_factory=list)  # pending job ids, first to be served first
    scores: dict[str, float] = field(default_factory=dict)
    unsatisfiable: dict[str, str] = field(default_factory=dict)  # job → why its dependencies never can be met
    stats: CycleStats = field(default_factory=CycleStats)

    @property
    def carry(self) -> CycleCarry:
        return CycleCarry(dict(self.nominations), self.reservation.job_id if self.reservation is not None else None)
