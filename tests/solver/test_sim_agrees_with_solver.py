"""The simulator's `oneplus` policy and the live solver make the same decision for the same cluster and queue.

Both run `schedule_cycle` with the live default queue config; this checks that what each builds around it (the
solver's working set from topology records over a real NATS and Redis, the simulator's state from its cluster and
trace jobs) feeds it the same snapshot. Four H100 nodes, two to a leaf, and 12 gangs asking 48 GPUs, all submitted
at once: the first cycle places the same gangs on the same GPUs and protects the same job in both.
"""

from __future__ import annotations

import time

from nats.aio.client import Client
from oneplus_contracts import Allocation, JobAccepted, NodeRecord, subjects
from oneplus_queueing.model import CycleCarry
from oneplus_sim.cluster import SimCluster, uniform_cluster
from oneplus_sim.engine import SimContext, Simulation
from oneplus_sim.policies.oneplus import OnePlusPolicy, job_spec, sim_queue_config
from oneplus_sim.trace import PRIORITY_CLASSES, SimJob
from oneplus_testing import Servers
from test_cycle_store_ops import solver_on_fresh_bus, wait_for_nodes

GRACE_S = 30.0
# (GPUs, time limit in s, class): more than the 32 GPUs free, with sizes and limits the job-size factor tells apart.
GANGS = [
    (8, 7_200, "normal"),
    (1, 600, "normal"),
    (16, 3_600, "normal"),
    (2, 1_800, "low"),
    (4, 14_400, "normal"),
    (1, 3_600, "high"),
    (8, 600, "normal"),
    (3, 900, "normal"),
    (2, 86_400, "normal"),
    (4, 1_200, "low"),
    (1, 300, "normal"),
    (8, 28_800, "high"),
]


def trace_jobs() -> list[SimJob]:
    jobs = []
    for i, (gpus, limit, cls) in enumerate(GANGS):
        j = SimJob(f"g{i:02d}", 0.0, float(limit), float(gpus), time_limit_s=float(limit), order=i)
        j.ranks, j.gpus_per_rank = (gpus // 8, 8) if gpus > 8 else (1, gpus)
        j.priority_class, j.priority, j.preemptible = cls, PRIORITY_CLASSES[cls], cls != "high"
        jobs.append(j)
    return jobs


class FirstCycle:
    """The simulator's `oneplus` policy, remembering what its first cycle started and carried."""

    name = "oneplus"

    def __init__(self) -> None:
        self.policy = OnePlusPolicy(grace_s=GRACE_S)
        self.min_cycle_interval_s = self.policy.min_cycle_interval_s
        self.started: dict[str, tuple[tuple[int, tuple[int, ...]], ...]] | None = None
        self.carry: CycleCarry | None = None

    def queue_key(self, job: SimJob) -> tuple[float, ...]:
        return self.policy.queue_key(job)

    def released(self, job: SimJob) -> None:
        self.policy.released(job)

    def schedule(self, ctx: SimContext) -> None:
        before = set(ctx.running)
        self.policy.schedule(ctx)
        if self.started is None:
            self.started = {k: r.placement.slots for k, r in ctx.running.items() if k not in before}
            self.carry = self.policy.carry


def gpus_by_node(sim: SimCluster, slots: tuple[tuple[int, tuple[int, ...]], ...]) -> list[tuple[str, tuple[int, ...]]]:
    return [(sim.nodes[n].name, tuple(g)) for n, g in slots]


def of_allocation(alloc: Allocation) -> list[tuple[str, tuple[int, ...]]]:
    return [(r.node, tuple(r.gpus)) for r in alloc.ranks]


async def test_the_first_cycle_places_the_same_gangs_on_the_same_gpus_in_the_simulator_and_the_solver(
    nc: Client, servers: Servers, cluster_name: str
) -> None:
    sim_cluster = uniform_cluster(4, nodes_per_leaf=2)
    jobs = trace_jobs()
    first = FirstCycle()
    Simulation(sim_cluster, jobs, first, preempt_grace_s=GRACE_S).run()
    assert first.started is not None and first.carry is not None
    sim_placed = {k: gpus_by_node(sim_cluster, v) for k, v in first.started.items()}
    assert 0 < sum(len(g) for slots in sim_placed.values() for _, g in slots) <= 32
    assert len(sim_placed) < len(jobs), "the cluster must be oversubscribed for a head to be protected"

    async with solver_on_fresh_bus(nc, servers, cluster_name) as solver:
        solver.config = sim_queue_config()  # the live default plus the trace's priority classes
        kv = await nc.jetstream().key_value(subjects.TOPOLOGY_KV)
        for topo in sim_cluster.topology.nodes:
            await kv.put(topo.node, NodeRecord(topology=topo, last_heartbeat=time.time()).model_dump_json().encode())
        await wait_for_nodes(solver, len(sim_cluster.topology.nodes))
        leaf = {j.job_id: j.ranks > 1 for j in jobs}  # the simulator's rule: a multi-node gang asks for one leaf
        await solver.owner.commit(
            *[
                JobAccepted(event_id=f"acc-{j.job_id}", job_id=j.job_id, spec=job_spec(j, GRACE_S, leaf[j.job_id]))
                for j in jobs
            ]
        )
        await solver.schedule_once()
        decision = solver.decision
        assert decision is not None
        live_placed = {k: of_allocation(a) for k, a in decision.placements.items()}

    assert live_placed == sim_placed
    assert decision.carry.protected == first.carry.protected and decision.carry.protected is not None
    assert dict(decision.carry.nominations) == dict(first.carry.nominations)
