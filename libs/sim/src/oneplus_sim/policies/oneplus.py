"""The `oneplus` policy: the live solver's own code, `oneplus_queueing.schedule_cycle`, on a mirrored ClusterState.

The adapter keeps placement's mutable `ClusterState` in step with the simulator (apply on start, release when a job
ends or a preempted job has checkpointed), turns trace jobs into `JobSpec`s once, and feeds each cycle's decision
back: placements start, victims are preempted, the decision's carry goes into the next cycle as in the service.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections.abc import Mapping, Sequence
from typing import Any

from oneplus_contracts import Allocation, CheckpointPolicy, ElasticRange, JobSpec, RankResources, TopologyConstraint
from oneplus_contracts.advance import AdvanceReservation
from oneplus_placement.capacity import CapacityIndexes
from oneplus_placement.snapshot import ClusterState
from oneplus_queueing.apply import apply_decision
from oneplus_queueing.config import (
    PriorityClass,
    QueueConfig,
    QueueConfigError,
    default_config,
    describe_validation,
)
from oneplus_queueing.cycle import schedule_cycle
from oneplus_queueing.fairshare import UsageHistory
from oneplus_queueing.model import CycleCarry, PendingJob, RunningJob
from pydantic import ValidationError

from ..engine import SimContext
from ..state import Placement
from ..trace import PRIORITY_CLASSES, SimJob

# The solver runs at most this often in simulated time; events in between are batched into one cycle.
DEFAULT_CYCLE_INTERVAL_S = 60.0
# Multi-node gangs that fit in one leaf ask for it (`domain: leaf, mode: required`), as a distributed training job
# would; the queueing layer's reservation keeps them from starving. Off: they take the tightest domain free now.
# A rank of a trace job that names no CPU or memory takes a token amount, so both models of the node agree.
_TOKEN_CPUS, _TOKEN_MEMORY_MB = 0.001, 1
USAGE_CHARGE_EVERY_S = 3600.0  # fair-share usage is an exact integral, so charging hourly loses nothing


def sim_queue_config(overrides: Mapping[str, Any] | None = None) -> QueueConfig:
    """The live default queue config (`default_config()`), plus the trace rule's priority classes with `high` not
    preemptible, since trace jobs name them. `overrides` (the mapping form of a queue config) is merged on top, key by
    key; lists replace."""
    classes = {
        name: PriorityClass(value=value, preemptible=name != "high", description=f"trace rule class {name}")
        for name, value in PRIORITY_CLASSES.items()
    }
    base = default_config().model_copy(update={"priority_classes": classes, "default_priority_class": "normal"})
    if not overrides:
        return base
    try:
        config = QueueConfig.model_validate(_merge(base.model_dump(mode="json"), overrides))
    except ValidationError as exc:
        raise QueueConfigError(describe_validation(exc)) from None
    for name in PRIORITY_CLASSES:  # every trace job must stay queueable, or it would silently never run
        config.validate_job(JobSpec(name="probe", priority_class=name, resources=RankResources(gpus=1)))
    return config


def _merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def job_spec(job: SimJob, grace_s: float, leaf_required: bool = False, elastic: bool = False) -> JobSpec:
    """The JobSpec the live system would receive; `leaf_required` keeps a multi-node gang under one leaf; `elastic`
    makes a job the --elastic rule marked an elastic gang (it asks its maximum)."""
    gpus = job.gpu_milli / 1000 if job.gpu_milli else float(job.gpus_per_rank)
    ranks = job.elastic_max or job.ranks
    topology = TopologyConstraint(domain="leaf", mode="required") if leaf_required and ranks > 1 else None
    if job.one_node:
        topology = TopologyConstraint(domain="node", mode="required")  # a job the --elastic rule split stays whole
    if job.exclusive:
        topology = (topology or TopologyConstraint()).model_copy(update={"exclusive": True})
    if job.tp_group and not job.gpu_milli:  # each TP group inside one NVLink domain, as the user would ask
        topology = (topology or TopologyConstraint()).model_copy(update={"group_gpus": job.tp_group})
    return JobSpec(
        name=job.job_id,
        priority_class=job.priority_class,
        preemptible=job.preemptible,
        ranks=ranks,
        resources=RankResources(
            gpus=gpus,
            cpus=job.cpus or _TOKEN_CPUS,
            memory_mb=job.memory_mb or _TOKEN_MEMORY_MB,
            gpu_models=list(job.gpu_models) if job.gpu_models else None,
        ),
        checkpoint=CheckpointPolicy(
            grace_s=math.ceil(grace_s),
            interval_s=math.ceil(job.checkpoint_interval_s) if job.checkpoint_interval_s else None,
        ),
        time_limit_s=max(1, math.ceil(job.limit_s)),
        **({"topology": topology} if topology else {}),
        **(
            {"elastic": ElasticRange(min_ranks=job.elastic_min, max_ranks=job.elastic_max)}
            if elastic and job.elastic_min < job.elastic_max
            else {}
        ),
    )


class OnePlusPolicy:
    name = "oneplus"

    def __init__(
        self,
        seed: int = 0,
        config: QueueConfig | None = None,
        grace_s: float = 30.0,
        cycle_interval_s: float = DEFAULT_CYCLE_INTERVAL_S,
        leaf_required: bool = True,
        reservations: Sequence[AdvanceReservation] = (),
        elastic: bool = False,
    ) -> None:
        # Elastic: jobs the --elastic rule marked are elastic gangs (start smaller, grow, shrink); the engine then
        # also runs a cycle with nobody pending while one runs below its maximum, so that it can grow.
        self.elastic = elastic
        self._indexes = CapacityIndexes()
        if elastic:
            self.name = "oneplus-elastic"
        self.leaf_required = leaf_required
        # Advance reservations, each known to the scheduler from its created_ts (when it was announced).
        self.reservations = list(reservations)
        self.min_cycle_interval_s = cycle_interval_s
        self.seed = seed
        self.config = config or sim_queue_config()
        self.grace_s = grace_s
        self.usage = UsageHistory.for_config(self.config)
        self._state: ClusterState | None = None
        self._specs: dict[str, JobSpec] = {}
        self._pending: dict[str, PendingJob] = {}
        self._running: dict[str, RunningJob] = {}
        self._carry = CycleCarry()
        self._checkpoints: list[tuple[float, str, float]] = []  # (when, job, run start) of the next checkpoint
        self._preemptions: dict[str, int] = {}
        self._charged = -math.inf
        self._leaf_room = 0  # most nodes under one leaf: a gang of more ranks cannot ask for one leaf
        self.counters: dict[str, int] = {
            "batch_plans": 0,
            "elastic_grows": 0,
            "elastic_shrinks": 0,
        }  # cycles × cp-sat queues whose joint plan was used

    def queue_key(self, job: SimJob) -> tuple[float, ...]:
        return (-job.priority, job.order)

    @property
    def carry(self) -> CycleCarry:
        """What the last cycle handed the next: nominations and the protected job, as in the solver."""
        return self._carry

    # ---- what the engine tells us ---------------------------------------------------------------------------
    def released(self, job: SimJob) -> None:
        run = self._running.pop(job.job_id, None)
        if run is not None and self._state is not None:
            self._state.release(run.allocation)

    # ---- one cycle ------------------------------------------------------------------------------------------
    def schedule(self, ctx: SimContext) -> None:
        if self._state is None:
            self._state = ClusterState(ctx.cluster.layout)
            self._leaf_room = max(len(nodes) for nodes in ctx.cluster.leaves.values())
        now = ctx.now
        self._advance_checkpoints(ctx)
        if now - self._charged >= USAGE_CHARGE_EVERY_S:
            self.usage.charge(max(now, self.usage.as_of), self._running.values())
            self._charged = now
        pending = [self._pending_job(j) for j in ctx.pending]
        decision = schedule_cycle(
            now,
            self._state,
            pending,
            list(self._running.values()),
            self.config,
            self.usage,
            seed=self.seed,
            carry=self._carry,
            reservations=[r for r in self.reservations if r.created_ts <= now],
            indexes=self._indexes,  # kept from cycle to cycle, as the live solver keeps them
        )
        self.counters["batch_plans"] += decision.stats.batch_solves
        applied = apply_decision(decision, self._state, self._pending, self._running, self.usage)
        for e in applied.evicted:
            victim = e.victim.job_id
            # It holds its GPUs for the grace, then the engine releases it; an elastic resize checkpoints first.
            ctx.preempt(victim, checkpoint=e.resize_to is not None, counted=not e.grows)
            if e.grows:
                self.counters["elastic_grows"] += 1
            else:
                self._preemptions[victim] = self._preemptions.get(victim, 0) + 1
                self.counters["elastic_shrinks"] += e.resize_to is not None
            self._pending.pop(victim, None)
        by_id = {j.job_id: j for j in ctx.pending} if applied.started else {}
        for run in applied.started:
            job = by_id[run.job_id]
            ctx.start(job, self._placement(ctx, run.allocation))
            self._pending.pop(run.job_id, None)
            self._schedule_checkpoint(ctx, job)
        self._carry = decision.carry

    # ---- conversions ----------------------------------------------------------------------------------------
    def _spec(self, job: SimJob) -> JobSpec:
        spec = self._specs.get(job.job_id)
        if spec is None:
            ranks = job.elastic_max or job.ranks
            leaf = self.leaf_required and ranks > 1 and self._leaf_room >= ranks
            spec = self._specs[job.job_id] = job_spec(job, self.grace_s, leaf, self.elastic)
        return spec

    def _pending_job(self, job: SimJob) -> PendingJob:
        p = self._pending.get(job.job_id)
        if p is None:
            p = self._pending[job.job_id] = PendingJob(
                job.job_id, self._spec(job), job.submit_s, self._preemptions.get(job.job_id, 0)
            )
        return p

    @staticmethod
    def _placement(ctx: SimContext, alloc: Allocation) -> Placement:
        layout = ctx.cluster.layout
        slots = tuple((layout.index(r.node), tuple(r.gpus)) for r in alloc.ranks)
        return Placement(slots, alloc.ranks[0].gpu_milli if alloc.ranks else 0)

    # ---- checkpoints: RunningJob.checkpoint_ts drives victim choice by lost work ----------------------------
    def _schedule_checkpoint(self, ctx: SimContext, job: SimJob) -> None:
        run = ctx.running.get(job.job_id)
        interval = job.checkpoint_interval_s
        if run is None or not interval:
            return
        next_progress = (math.floor(run.done_at_start / interval) + 1) * interval
        if next_progress >= job.duration_s:
            return
        when = run.start_s + (next_progress - run.done_at_start) * run.slowdown
        heapq.heappush(self._checkpoints, (when, job.job_id, run.start_s))

    def _advance_checkpoints(self, ctx: SimContext) -> None:
        while self._checkpoints and self._checkpoints[0][0] <= ctx.now:
            when, job_id, start = heapq.heappop(self._checkpoints)
            run, sim_run = self._running.get(job_id), ctx.running.get(job_id)
            if run is None or sim_run is None or sim_run.start_s != start or run.preempting:
                continue  # the run it belonged to has ended
            self._running[job_id] = dataclasses.replace(run, checkpoint_ts=when)
            interval = sim_run.job.checkpoint_interval_s
            assert interval is not None
            progress = sim_run.done_at_start + (when - start) / sim_run.slowdown
            nxt = progress + interval
            if nxt < sim_run.job.duration_s:
                heapq.heappush(self._checkpoints, (when + interval * sim_run.slowdown, job_id, start))
