"""A small hand-built world for queueing tests: a real cluster state, running gangs, and a tiny event loop."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from oneplus_contracts import Allocation, CheckpointPolicy, JobSpec, RankPlacement, RankResources, TopologyConstraint
from oneplus_placement.snapshot import ClusterState
from oneplus_queueing.apply import apply_decision
from oneplus_queueing.config import QueueConfig, default_config
from oneplus_queueing.cycle import schedule_cycle
from oneplus_queueing.fairshare import UsageHistory
from oneplus_queueing.model import CycleDecision, PendingJob, RunningJob
from oneplus_topology.cluster import Cluster, synthetic_cluster


def spec(
    name: str,
    gpus: float,
    ranks: int = 1,
    *,
    queue: str = "default",
    priority: int = 0,
    priority_class: str | None = None,
    preemptible: bool = True,
    time_limit_s: int | None = None,
    min_runtime_s: int = 0,
    domain: str | None = None,
    grace_s: int = 0,
) -> JobSpec:
    topo = TopologyConstraint(domain=domain, mode="required") if domain else TopologyConstraint()
    return JobSpec(
        name=name,
        queue=queue,
        priority=priority,
        priority_class=priority_class,
        preemptible=preemptible,
        ranks=ranks,
        resources=RankResources(gpus=gpus),
        topology=topo,
        time_limit_s=time_limit_s,
        min_runtime_s=min_runtime_s,
        checkpoint=CheckpointPolicy(grace_s=grace_s),
    )


def unfloored(config: QueueConfig | None = None) -> QueueConfig:
    """The config without the site's floor on a victim's run time (an hour by default): these worlds run for
    seconds, and the tests that use it are about which victims are chosen, not when they become eligible."""
    config = config or default_config()
    return config.model_copy(update={"preemption": config.preemption.model_copy(update={"min_runtime_s": 0.0})})


class World:
    """`n_nodes` 8-GPU H100 nodes, `nodes_per_leaf` per leaf (or the given cluster), and the jobs running on them."""

    def __init__(self, n_nodes: int = 2, nodes_per_leaf: int = 2, cluster: Cluster | None = None) -> None:
        self.cluster = cluster or synthetic_cluster(n_nodes, nodes_per_leaf=nodes_per_leaf)
        self.state = ClusterState.from_cluster(self.cluster)
        self.running: dict[str, RunningJob] = {}

    def node(self, i: int) -> str:
        return self.cluster.nodes[i].node

    def run(
        self,
        job_id: str,
        where: Sequence[tuple[int, Sequence[int]]],
        *,
        started: float = 0.0,
        checkpoint: float | None = None,
        preemptions: int = 0,
        preempting: bool = False,
        **kw: object,
    ) -> RunningJob:
        """A gang already running: one rank per (node index, GPU indexes) entry."""
        per_rank = len(where[0][1])
        s = spec(job_id, per_rank, ranks=len(where), **kw)  # type: ignore[arg-type]
        alloc = Allocation(
            ranks=[RankPlacement(rank=r, node=self.node(n), gpus=list(g)) for r, (n, g) in enumerate(where)]
        )
        self.state.apply(alloc)
        job = RunningJob(job_id, s, alloc, started, checkpoint, preemptions, preempting)
        self.running[job_id] = job
        return job

    def finish(self, job_id: str) -> RunningJob:
        job = self.running.pop(job_id)
        self.state.release(job.allocation)
        return job

    def free_gpus(self) -> set[tuple[str, int]]:
        out = set()
        for slot in self.state.slots:
            for g in slot.shape.gpu_indexes(self.state.free[slot.index]):
                out.add((slot.name, g))
        return out


@dataclass
class Loop:
    """Discrete events: arrivals and job ends; a cycle after each, preemptions carried out at once."""

    world: World
    config: QueueConfig
    durations: dict[str, float] = field(default_factory=dict)  # actual run time per job (≤ its time limit)
    arrivals: list[tuple[float, PendingJob]] = field(default_factory=list)
    pending: dict[str, PendingJob] = field(default_factory=dict)
    started_at: dict[str, float] = field(default_factory=dict)
    decisions: list[CycleDecision] = field(default_factory=list)
    usage: UsageHistory = field(default_factory=UsageHistory)
    now: float = 0.0

    def submit(self, at: float, job: PendingJob, duration: float) -> None:
        """`duration` is what the job would run; its time limit, when it has one, cuts it short."""
        self.arrivals.append((at, job))
        limit = job.spec.time_limit_s
        self.durations[job.job_id] = duration if limit is None else min(duration, float(limit))

    def next_event(self) -> float | None:
        times = [t for t, _ in self.arrivals if t > self.now]
        times += [r.started_ts + self.durations[r.job_id] for r in self.world.running.values()]
        later = [t for t in times if t > self.now]
        return min(later) if later else None

    def step(self) -> CycleDecision:
        for job_id, run in list(self.world.running.items()):
            if run.started_ts + self.durations[job_id] <= self.now:
                self.world.finish(job_id)
        for t, job in self.arrivals:
            if t <= self.now and job.job_id not in self.pending and job.job_id not in self.started_at:
                self.pending[job.job_id] = job
        self.usage.charge(self.now, self.world.running.values())
        while True:
            d = schedule_cycle(
                self.now,
                self.world.state,
                list(self.pending.values()),
                list(self.world.running.values()),
                self.config,
                self.usage,
                carry=self.decisions[-1].carry if self.decisions else None,
            )
            self.decisions.append(d)
            applied = apply_decision(d, self.world.state, self.pending, self.world.running, self.usage)
            for run in applied.started:
                del self.pending[run.job_id]
                self.started_at[run.job_id] = self.now
            if not applied.evicted:
                return d
            for e in applied.evicted:  # victims checkpoint at once (grace 0) and go back to the queue
                v, run = e.victim.job_id, e.victim
                self.world.finish(v)
                self.durations[v] -= self.now - run.started_ts
                self.started_at.pop(v, None)
                self.pending[v] = PendingJob(v, run.spec, run.started_ts, run.preemptions + 1, self.now)

    def run_until(self, end: float) -> None:
        while self.now <= end:
            self.step()
            nxt = self.next_event()
            if nxt is None:
                break
            self.now = nxt
