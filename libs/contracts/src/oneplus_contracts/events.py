"""Job lifecycle events (past tense) and the current-state record kept per job."""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Literal

from pydantic import Field, SerializerFunctionWrapHandler, TypeAdapter, model_serializer

from .jobspec import Domain, JobSpec, Strict

JobState = Literal[
    "SUBMITTED",
    "ACCEPTED",
    "REJECTED",
    "PLACED",
    "STARTING",
    "RUNNING",
    "PREEMPTING",
    "CHECKPOINTED",
    "SUCCEEDED",
    "FAILED",
    "CANCELLED",
]
TERMINAL_STATES: frozenset[str] = frozenset({"REJECTED", "SUCCEEDED", "FAILED", "CANCELLED"})
ACTIVE_STATES: frozenset[str] = frozenset({"PLACED", "STARTING", "RUNNING", "PREEMPTING"})
# Who is to blame for an end: the job's own exit, or the platform (a node, executor, engine or reservation lost).
Fault = Literal["job", "infrastructure"]


def new_id(prefix: str = "") -> str:
    return prefix + uuid.uuid4().hex[:12]


class RankPlacement(Strict):
    rank: int = Field(ge=0)
    node: str
    gpus: list[int]
    gpu_milli: int = Field(default=0, ge=0, le=1000, description="Share of each GPU; 0 for whole GPUs")
    mig: list[str] = Field(
        default_factory=list, description="UUIDs (MIG-...) of the MIG instances the rank holds; its gpus are then empty"
    )
    sharing: Literal["mps", "time-slice"] | None = Field(
        default=None,
        description="How a GPU share runs where it was placed: mps (isolated under the node's MPS daemon) or "
        "time-slice (its queue allows it; no memory or compute isolation); null for whole GPUs",
    )
    gpu_memory_mb: int | None = Field(
        default=None,
        ge=1,
        description="GPU memory (MiB) the share pins on its GPU (the job's resources.gpu_memory_mb); null: none asked",
    )

    @model_serializer(mode="wrap")
    # No return annotation: pydantic then keeps one schema for input and output (no JobSpec-Input/-Output split).
    def _without_unset(self, handler: SerializerFunctionWrapHandler):  # type: ignore[no-untyped-def]
        # A whole-GPU rank has neither: left out, every stored allocation stays as small as before these keys.
        data = handler(self)
        if isinstance(data, dict):
            if not data.get("mig", True):
                data.pop("mig")
            if data.get("sharing", 0) is None:
                data.pop("sharing")
            if data.get("gpu_memory_mb", 0) is None:
                data.pop("gpu_memory_mb")
        return data

    cpus: float = 1.0
    memory_mb: int = 1024


class Allocation(Strict):
    ranks: list[RankPlacement]
    domain: Domain = "node"
    ring_gbps: float = 0.0
    solver: str = "greedy"
    score: dict[str, float] = Field(default_factory=dict, description="Objective terms of the decision")

    @property
    def nodes(self) -> list[str]:
        seen: dict[str, None] = {}
        for r in self.ranks:
            seen.setdefault(r.node, None)
        return list(seen)


class _Event(Strict):
    event_id: str = Field(default_factory=lambda: new_id("ev-"))
    job_id: str
    ts: float = Field(default_factory=time.time)


class JobSubmitted(_Event):
    type: Literal["submitted"] = "submitted"
    spec: JobSpec
    source: str = "cli"


class JobAccepted(_Event):
    type: Literal["accepted"] = "accepted"
    spec: JobSpec
    source: str = "cli"
    warnings: list[str] = Field(default_factory=list)


class JobRejected(_Event):
    type: Literal["rejected"] = "rejected"
    reason: str
    source: str = "cli"
    team: str | None = None


class JobPlaced(_Event):
    type: Literal["placed"] = "placed"
    allocation: Allocation
    token: int
    attempt: int = 1


class JobStarting(_Event):
    type: Literal["starting"] = "starting"
    node: str
    token: int


class JobRunning(_Event):
    type: Literal["running"] = "running"
    node: str
    token: int


class JobNodeFinished(_Event):
    """One node's ranks of the job have ended; the job ends when every node has."""

    type: Literal["node_finished"] = "node_finished"
    node: str
    token: int
    exit_code: int
    reason: str
    fault: Fault = Field(
        default="job",
        description="'infrastructure' when the platform ended the ranks, not the job (requeued, within a budget)",
    )


class JobFinished(_Event):
    type: Literal["finished"] = "finished"
    state: Literal["SUCCEEDED", "FAILED", "CANCELLED"]
    reason: str
    token: int | None = None
    exit_code: int | None = None


class JobCancelRequested(_Event):
    type: Literal["cancel_requested"] = "cancel_requested"
    reason: str = "cancelled by user"
    by: str | None = None


class JobPreempting(_Event):
    type: Literal["preempting"] = "preempting"
    token: int
    preemptor: str | None = None
    reason: str


class JobCheckpointed(_Event):
    type: Literal["checkpointed"] = "checkpointed"
    node: str
    token: int
    checkpoint_ts: float
    acknowledged: bool = Field(description="False when the grace period ran out before the job acknowledged")


class JobRequeued(_Event):
    type: Literal["requeued"] = "requeued"
    reason: str
    token: int | None = Field(
        default=None, description="The attempt it ends: a requeue decided for an earlier attempt does not apply"
    )
    checkpoint_ts: float | None = None
    fault: Fault | None = Field(
        default=None, description="'infrastructure' for a requeue after a platform fault (counted in infra_requeues)"
    )


JobEvent = Annotated[
    JobSubmitted
    | JobAccepted
    | JobRejected
    | JobPlaced
    | JobStarting
    | JobRunning
    | JobNodeFinished
    | JobFinished
    | JobCancelRequested
    | JobPreempting
    | JobCheckpointed
    | JobRequeued,
    Field(discriminator="type"),
]
JOB_EVENT_ADAPTER: TypeAdapter[JobEvent] = TypeAdapter(JobEvent)
EVENT_TYPES: tuple[str, ...] = (
    "submitted",
    "accepted",
    "rejected",
    "placed",
    "starting",
    "running",
    "node_finished",
    "finished",
    "cancel_requested",
    "preempting",
    "checkpointed",
    "requeued",
)


def parse_job_event(data: bytes | str) -> JobEvent:
    return JOB_EVENT_ADAPTER.validate_json(data)


class JobRecord(Strict):
    """Current state of one job, as kept in the `jobs` KV bucket (a cache of the event stream)."""

    job_id: str
    spec: JobSpec
    state: JobState
    submitted_ts: float
    updated_ts: float
    reason: str | None = None
    allocation: Allocation | None = None
    token: int | None = None
    attempt: int = 0
    preemptions: int = 0
    traceparent: str | None = None
    checkpoint_ts: float | None = None
    progress_s: float = Field(default=0.0, description="Run time saved by checkpoints across earlier attempts")
    placed_ts: float | None = None
    started_ts: float | None = None
    finished_ts: float | None = None
    nodes_started: list[str] = Field(
        default_factory=list, description="nodes whose executor has reported on its ranks, for this attempt"
    )
    nodes_running: list[str] = Field(
        default_factory=list, description="nodes whose executor has reported its ranks running, for this attempt"
    )
    nodes_done: dict[str, int] = Field(default_factory=dict, description="node → exit code, for this attempt")
    node_reasons: dict[str, str] = Field(
        default_factory=dict, description="node → why its ranks ended (the executor's words), for this attempt"
    )
    infra_nodes: list[str] = Field(
        default_factory=list, description="nodes whose ranks the platform ended (not the job), for this attempt"
    )
    infra_requeues: int = Field(default=0, ge=0, description="requeues after infrastructure faults, all attempts")
    ended_token: int | None = Field(
        default=None,
        description="Fencing token of the last attempt that was requeued: a reservation under it belongs to no attempt",
    )
    source: str = "cli"
    warnings: list[str] = Field(default_factory=list)
    cancel_requested: bool = False
    seq: int = Field(default=0, ge=0, description="Job-event stream sequence of the last event folded into this record")

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES
