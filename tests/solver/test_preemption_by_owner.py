"""Preemption is the owner's reaction: the cycle that chooses victims records them `preempting` itself and the
reaction sends each victim's nodes the preempt command after that record; the grace timer is the owner's, read from
the records, and kills a victim that neither checkpointed nor ended within its grace.
"""

from __future__ import annotations

import time
from typing import TypeVar

from nats.aio.client import Client
from nats.js.api import ConsumerConfig, DeliverPolicy
from oneplus_contracts import CancelRanks, CheckpointPolicy, JobAccepted, JobSpec, PreemptRanks, subjects
from oneplus_queueing.config import load_queue_config
from oneplus_queueing.preemption import STOP_SLACK_S
from oneplus_testing import Servers
from pydantic import BaseModel
from test_cycle_store_ops import add_nodes, solver_on_fresh_bus

GRACE_S = 20
C = TypeVar("C", bound=BaseModel)


def job(name: str, priority: int, *, preemptible: bool) -> JobSpec:
    return JobSpec(
        name=name,
        priority=priority,
        preemptible=preemptible,
        resources={"gpus": 8},  # type: ignore[arg-type]
        checkpoint=CheckpointPolicy(signal="SIGUSR2", grace_s=GRACE_S),
        simulate={"duration_s": 600},  # type: ignore[arg-type]
    )


async def commands(nc: Client, kind: str, model: type[C]) -> list[C]:
    """The commands of `kind` the commands stream holds for any node."""
    sub = await nc.jetstream().subscribe(
        subjects.node_command("*", kind),
        ordered_consumer=True,
        config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL),
    )
    out: list[C] = []
    try:
        while True:
            try:
                msg = await sub.next_msg(timeout=0.5)
            except TimeoutError:
                return out
            out.append(model.model_validate_json(msg.data))
    finally:
        await sub.unsubscribe()


async def test_the_cycle_records_its_victim_preempting_then_asks_its_node_and_kills_it_after_the_grace(
    nc: Client, servers: Servers, cluster_name: str
) -> None:
    async with solver_on_fresh_bus(nc, servers, cluster_name) as solver:
        solver.config = load_queue_config("preemption: {min_runtime_s: 0}\n")
        await add_nodes(nc, solver, 1)
        await solver.owner.commit(JobAccepted(event_id="a-low", job_id="low", spec=job("low", 0, preemptible=True)))
        assert await solver.schedule_once() == 1
        low = solver.owner.index.get("low")
        assert low is not None and low.token is not None
        await solver.owner.commit(
            JobAccepted(event_id="a-high", job_id="high", spec=job("high", 1000, preemptible=False))
        )
        await solver.schedule_once()

        victim = solver.owner.index.get("low")
        assert victim is not None and victim.state == "PREEMPTING", "the owner recorded its cycle's victim itself"
        assert victim.token == low.token and "preempted for high" in (victim.reason or "")
        preempts = await commands(nc, "preempt", PreemptRanks)
        assert [(c.job_id, c.node, c.token, c.signal, c.grace_s) for c in preempts] == [
            ("low", "n0", low.token, "SIGUSR2", float(GRACE_S))
        ]
        assert solver.owner.index.get("high").state == "ACCEPTED", "the preemptor waits for the GPUs"

        # The grace timer: nothing before the grace and the stop's slack run out, then the ranks are killed.
        await solver.controller.preemption_timers(victim.updated_ts + GRACE_S)
        assert await commands(nc, "cancel", CancelRanks) == []
        await solver.controller.preemption_timers(victim.updated_ts + GRACE_S + STOP_SLACK_S + 1)
        cancels = await commands(nc, "cancel", CancelRanks)
        assert [(c.job_id, c.node, c.token) for c in cancels] == [("low", "n0", low.token)]
        assert "no checkpoint within" in cancels[0].reason


async def test_a_new_owner_asks_a_victim_it_finds_preempting_again(
    nc: Client, servers: Servers, cluster_name: str
) -> None:
    async with solver_on_fresh_bus(nc, servers, cluster_name) as solver:
        solver.config = load_queue_config("preemption: {min_runtime_s: 0}\n")
        await add_nodes(nc, solver, 1)
        await solver.owner.commit(JobAccepted(event_id="a-low", job_id="low", spec=job("low", 0, preemptible=True)))
        assert await solver.schedule_once() == 1

        async def lost(victims: object) -> None:
            raise RuntimeError("the owner died between its commit and its commands")

        solver.controller.ask_to_stand_aside = lost  # type: ignore[method-assign]
        await solver.owner.commit(
            JobAccepted(event_id="a-high", job_id="high", spec=job("high", 1000, preemptible=False))
        )
        await solver.schedule_once()
        assert solver.owner.index.get("low").state == "PREEMPTING"
        assert await commands(nc, "preempt", PreemptRanks) == []
        del solver.controller.ask_to_stand_aside  # the class's own again, as in a new owner
        await solver.controller.preemption_timers(time.time())
        asked = [c.job_id for c in await commands(nc, "preempt", PreemptRanks)]
        assert asked == ["low"], "the timer found the victim not asked by this owner and asked it"
