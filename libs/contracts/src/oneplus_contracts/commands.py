"""Commands (imperative) sent to one node's executor or to the preemption service."""

from __future__ import annotations

import hashlib
import signal as _signal
import time
from collections.abc import Sequence
from typing import Annotated, Literal, Self

from pydantic import Field, TypeAdapter, model_validator

from .events import Allocation, RankPlacement, new_id
from .jobspec import JobSpec, Strict


class _Command(Strict):
    command_id: str = Field(default_factory=lambda: new_id("cmd-"))
    job_id: str
    node: str
    token: int = Field(description="Fencing token of the reservation; stale tokens are refused")
    ts: float = Field(default_factory=time.time)


class LaunchRanks(_Command):
    kind: Literal["launch"] = "launch"
    spec: JobSpec
    ranks: list[RankPlacement] = Field(description="The ranks of this job that run on this node")
    world_size: int
    node_rank: int
    nodes: list[str]
    master_addr: str
    master_port: int = 29500
    ranks_per_node: list[int] = Field(
        default_factory=list, description="How many of the job's ranks each of `nodes` runs (an MPI hostfile's slots)"
    )
    hosts: dict[str, str] = Field(
        default_factory=dict,
        description="Node name → address, for the nodes whose address is known: the ranks' "
        "/etc/hosts, so that MASTER_ADDR and an MPI hostfile's names resolve in the containers",
    )
    resume_from_checkpoint_ts: float | None = None
    resume_progress_s: float = Field(default=0.0, ge=0, description="Work done up to the last checkpoint")
    multi_node_nvlink: bool = Field(
        default=False,
        description="The job's nodes share one multi-node NVLink domain (placement's domain 'nvlink', a GB200 NVL72 "
        "rack): its containers get an IMEX channel so that CUDA and NCCL reach the other trays' GPU memory",
    )
    traceparent: str | None = Field(
        default=None,
        description="The job's trace (W3C traceparent) when the command travels inside a `launch_batch`, whose one "
        "header cannot carry every job's; a command sent alone carries it in its message header instead",
    )


def batch_command_id(launches: Sequence[LaunchRanks]) -> str:
    """The id of a batch of launches, fixed by theirs: the same batch sent again is dropped as a duplicate."""
    digest = hashlib.sha256("\n".join(c.command_id for c in launches).encode()).hexdigest()[:24]
    return f"launch-batch-{launches[0].node if launches else ''}-{digest}"


class LaunchBatch(Strict):
    """Several jobs' launches on one node in one message: one append for what one commit of the owner placed there.
    The executor handles each as it handles a `launch` alone (its own fencing token, its own facts)."""

    kind: Literal["launch_batch"] = "launch_batch"
    command_id: str = Field(default="", description="Derived from the launches' ids when left empty")
    node: str
    launches: list[LaunchRanks] = Field(min_length=1, description="This node's launches, each with its own token")
    ts: float = Field(default_factory=time.time)

    @model_validator(mode="after")
    def _one_node(self) -> Self:
        # A launch addressed to another node would run on the wrong GPUs: refuse the message as malformed.
        strays = sorted({c.node for c in self.launches if c.node != self.node})
        if strays:
            raise ValueError(f"launch_batch for node {self.node} holds launches for {', '.join(strays)}")
        if not self.command_id:
            self.command_id = batch_command_id(self.launches)
        return self

    @classmethod
    def of(cls, launches: Sequence[LaunchRanks]) -> Self:
        """The batch of `launches`, all for one node (their order kept: the executor launches them in it)."""
        return cls(node=launches[0].node, launches=list(launches))


class PreemptRanks(_Command):
    kind: Literal["preempt"] = "preempt"
    signal: str = "SIGUSR1"
    grace_s: float = 120.0
    reason: str = "preempted"


class CancelRanks(_Command):
    kind: Literal["cancel"] = "cancel"
    reason: str = "cancelled"


def signal_name(raw: object) -> str:
    """A signal as `SIGUSR1`, from `USR1`, `SIGUSR1`, `usr1` or its number (`10`); ValueError naming the value."""
    text = str(raw if raw is not None else "").strip()
    try:
        if text.isdigit():
            return _signal.Signals(int(text)).name
        upper = text.upper()
        return _signal.Signals[upper if upper.startswith("SIG") else "SIG" + upper].name
    except (KeyError, ValueError):
        raise ValueError(f"--signal {text[:32]!r} is not a signal (USR1, SIGTERM, 10, ...)") from None


class SignalRanks(_Command):
    """`scancel --signal`: deliver a signal to the job's running processes here (the batch script, the ranks, the
    running srun steps' tasks) without ending the job."""

    kind: Literal["signal"] = "signal"
    signal: str = Field(description="The signal's name, e.g. SIGUSR1")
    by: str = ""


NodeCommand = Annotated[
    LaunchRanks | LaunchBatch | PreemptRanks | CancelRanks | SignalRanks, Field(discriminator="kind")
]
NODE_COMMAND_ADAPTER: TypeAdapter[NodeCommand] = TypeAdapter(NodeCommand)


class PreemptionRequest(Strict):
    """An operator's request that victims stand aside for a job (the preemption service forwards each named victim
    to the job owner as `preempting`); the owner's own cycle records its victims itself and sends none."""

    request_id: str = Field(default_factory=lambda: new_id("pre-"))
    job_id: str
    priority: int
    gpus: float
    reason: str
    ts: float = Field(default_factory=time.time)
    victims: list[str] = Field(default_factory=list, description="The jobs to preempt; empty: the cycle decides")
    nominated: Allocation | None = Field(default=None, description="The GPUs the preemptor gets once victims are gone")
    lost_work_gpu_s: float = 0.0


class FactOutcome(Strict):
    """What the job owner made of a fact reported with `AWAIT_FOLD_HEADER`, once the folded record is in the hot view
    (core NATS on `subjects.fact_outcome`): a reporter waiting on it can read its own write right after."""

    job_id: str
    event_id: str
    type: str
    applied: bool  # False: refused as an illegal transition, or already in the job stream


class SubmitReply(Strict):
    """Answer to a request on the submit subject."""

    ok: bool
    job_id: str | None = None
    duplicate: bool = False
    error: str | None = None
    warnings: list[str] = Field(default_factory=list)
