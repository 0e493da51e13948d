"""One commit's launches go out as one command message per node (issue 42, item 1): the jobs one binding placed on a
node reach its executor in one `launch_batch`, one append to the commands stream, each launch whole (its own token and
trace); a node with one launch gets a plain `launch`, as an executor from before batches reads it.

The solver runs in this process against real NATS and Redis with its loops off.
"""

from __future__ import annotations

import asyncio
import json
import time

from nats.aio.client import Client
from oneplus_bus.ledger import read_stream
from oneplus_contracts import (
    NODE_COMMAND_ADAPTER,
    Allocation,
    JobAccepted,
    JobRecord,
    JobSpec,
    LaunchBatch,
    LaunchRanks,
    RankPlacement,
    subjects,
)
from oneplus_placement_solver.app import Solver
from oneplus_placement_solver.launch import chunked, launch_commands
from oneplus_testing import Servers
from test_cycle_store_ops import add_nodes, solver_on_fresh_bus


def one_gpu(i: int) -> JobSpec:
    return JobSpec(name=f"b{i}", resources={"gpus": 1}, simulate={"duration_s": 60})  # type: ignore[arg-type]


async def commands(nc: Client, jobs: int) -> list[tuple[str, bytes, dict[str, str]]]:
    """The launch messages on the commands stream, once they hold `jobs` launches: (subject's node, body, headers)."""
    js = nc.jetstream()
    deadline = time.monotonic() + 10
    while True:
        rows = await read_stream(js, subjects.COMMANDS_STREAM, 1, subjects.node_command("*", "launch"))
        out = [(json.loads(data)["node"], data, headers) for _, data, headers in rows]
        held = sum(len(json.loads(d).get("launches", [None])) for _, d, _ in out)
        if held >= jobs:
            return out
        assert time.monotonic() < deadline, f"{held} of {jobs} launches sent"
        await asyncio.sleep(0.05)


async def place(solver: Solver, jobs: int) -> None:
    accepted = [JobAccepted(event_id=f"acc-b{i}", job_id=f"b{i}", spec=one_gpu(i)) for i in range(jobs)]
    await solver.owner.commit(*accepted)
    assumed = await solver.scheduler.cycle()
    assert assumed is not None and len(assumed.gangs) == jobs, "one cycle places them all"
    assert await solver.binder.bind(assumed) == jobs  # one commit of `placed`, one reaction


async def test_one_commit_placing_several_jobs_on_a_node_sends_it_one_message(
    nc: Client, servers: Servers, cluster_name: str
) -> None:
    async with solver_on_fresh_bus(nc, servers, cluster_name) as solver:
        await add_nodes(nc, solver, 2)  # 16 GPUs
        await place(solver, 12)
        sent = await commands(nc, 12)
        index = solver.owner.index
        per_node: dict[str, set[str]] = {}
        for job in (f"b{i}" for i in range(12)):
            rec = index.get(job)
            assert rec is not None and rec.allocation is not None
            per_node.setdefault(rec.allocation.nodes[0], set()).add(job)
        assert sorted(node for node, _, _ in sent) == sorted(per_node), "one message per node, not one per job"
        for node, body, headers in sent:
            cmd = NODE_COMMAND_ADAPTER.validate_json(body)
            launches = cmd.launches if isinstance(cmd, LaunchBatch) else [cmd]
            assert {c.job_id for c in launches} == per_node[node]
            assert headers["Nats-Msg-Id"] == cmd.command_id
            for c in launches:
                rec = index.get(c.job_id)
                assert rec is not None and c.node == node and c.token == rec.token
                assert c.command_id == f"launch-{c.job_id}-{rec.token}-{node}"
                if isinstance(cmd, LaunchBatch):
                    assert c.traceparent == rec.traceparent  # each job's own trace, in the body
        assert any(isinstance(NODE_COMMAND_ADAPTER.validate_json(b), LaunchBatch) for _, b, _ in sent)


async def test_a_node_with_one_launch_gets_a_plain_launch_as_before(
    nc: Client, servers: Servers, cluster_name: str
) -> None:
    async with solver_on_fresh_bus(nc, servers, cluster_name) as solver:
        await add_nodes(nc, solver, 1)
        await place(solver, 1)
        ((node, body, _),) = await commands(nc, 1)
        wire = json.loads(body)
        assert node == "n0" and wire["kind"] == "launch" and wire["job_id"] == "b0"
        assert "traceparent" not in wire, "an executor from before batches refuses an unknown field"
        assert isinstance(NODE_COMMAND_ADAPTER.validate_json(body), LaunchRanks)


def test_a_nodes_launches_are_split_only_past_the_message_budget() -> None:
    cmds = []
    for i in range(5):
        alloc = Allocation(ranks=[RankPlacement(rank=0, node="n0", gpus=[i], cpus=1, memory_mb=64)])
        rec = JobRecord(
            job_id=f"c{i}", spec=one_gpu(i), state="PLACED", allocation=alloc, token=1, submitted_ts=0, updated_ts=0
        )
        cmds += launch_commands(rec, alloc, 1)
    assert chunked(cmds) == [cmds]
    size = len(cmds[0].model_dump_json())
    runs = chunked(cmds, max_bytes=2 * size + 10)
    assert [len(r) for r in runs] == [2, 2, 1] and [c for r in runs for c in r] == cmds
    assert [len(r) for r in chunked(cmds, max_bytes=1)] == [1] * 5  # a launch bigger than the budget goes alone
