"""The node-executor as a service on a real container engine, inside the whole platform (issue 6).

intake, topology-registry, placement-solver and preemption run as processes against real NATS and Redis; the
executor runs with `--runtime docker` against the engine at ONEPLUS_DOCKER_URL (Podman's Docker API here).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import aiodocker
import nats
import pytest
import redis.asyncio as aioredis
from oneplus_contracts import NODE_COMMAND_ADAPTER, JobRecord, JobSpec, LaunchRanks, NodeHeartbeat, subjects
from oneplus_node_executor.runtime.cpuset import format_cpu_list, parse_cpu_list
from oneplus_reservations import ReservationStore
from oneplus_testing import DEPENDENCY_FAULTS, Servers, wipe_bus
from oneplus_topology.presets import load_preset
from platform_fixture import job_history, wait_terminal
from typer.testing import CliRunner

from oneplus.cli.app import app as cli
from oneplus.client import OnePlusClient
from oneplus.demo import wait_for_platform
from oneplus.devstack import PREEMPT_AT_ONCE, Platform, SimNode, queue_config_env, spawn

pytestmark = [pytest.mark.engine, pytest.mark.e2e, DEPENDENCY_FAULTS]

EngineControl = Callable[[], Coroutine[Any, Any, None]]
PRESET = "h100_sxm_8gpu_nvswitch_nv18"
# A node is lost after 60 s, not 6: the killed executor's restart must land inside that grace to adopt its containers,
# and on a loaded 2-core machine (xdist's other worker beside it) its python took 18 s to start: the node was lost,
# the solver ended the ranks, and the job ran again in new containers. No test here waits for a node to be lost.
ENV = {"ONEPLUS_HEARTBEAT_S": "0.5", "ONEPLUS_NODE_LOST_AFTER_S": "60"}


@dataclass
class Stack:
    platform: Platform
    node: SimNode
    engine_url: str
    nats_url: str


@pytest.fixture(scope="module")
async def stack(
    servers: Servers, engine_url: str, node_tag: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Stack]:
    nc = await nats.connect(servers.nats_url)
    await wipe_bus(nc)
    await nc.close()
    store = ReservationStore(aioredis.Redis.from_url(servers.redis_url))
    await store.wipe()
    await store.close()
    node = SimNode(f"{node_tag}-a", PRESET, "leaf-0", "spine-0")
    workdir = tmp_path_factory.mktemp("executor-service")
    # The preemption test's victim has run for seconds: without the default hour of victim protection it steps aside.
    env = {**ENV, "ONEPLUS_DOCKER_URL": engine_url, **queue_config_env(workdir, PREEMPT_AT_ONCE)}
    p = Platform(servers.nats_url, servers.redis_url, (node,), workdir / "logs", "docker", env).start()
    try:
        async with OnePlusClient.connect(servers.nats_url) as c:
            await wait_for_platform(c, 1, timeout=120)
        yield Stack(p, node, engine_url, servers.nats_url)
    finally:
        p.stop()
        await remove_containers(engine_url, f"{node_tag}-")


# -- engine and platform helpers -----------------------------------------------------------------------------------


async def engine(url: str, fn: Callable[[aiodocker.Docker], Awaitable[Any]]) -> Any:
    docker = aiodocker.Docker(url=url)
    try:
        return await fn(docker)
    finally:
        await docker.close()


async def containers_of(url: str, job_id: str) -> list[dict[str, Any]]:
    """Every container of the job, inspected, in rank order."""

    async def go(docker: aiodocker.Docker) -> list[dict[str, Any]]:
        found = await docker.containers.list(all=True, filters=json.dumps({"label": [f"oneplus.job={job_id}"]}))
        shown = [await c.show() for c in found]
        return sorted(shown, key=lambda i: int(i["Config"]["Labels"]["oneplus.rank"]))

    result: list[dict[str, Any]] = await engine(url, go)
    return result


async def remove_containers(url: str, node_prefix: str) -> None:
    async def go(docker: aiodocker.Docker) -> None:
        for c in await docker.containers.list(all=True, filters=json.dumps({"label": ["oneplus.managed=true"]})):
            if str(c._container.get("Labels", {}).get("oneplus.node", "")).startswith(node_prefix):
                await c.delete(force=True)

    await engine(url, go)


async def submit(c: OnePlusClient, spec: JobSpec) -> str:
    reply = await c.submit(spec, msg_id=f"{spec.name}-{time.time_ns()}")
    assert reply.ok and reply.job_id, reply.error
    return reply.job_id


async def until_state(c: OnePlusClient, job_id: str, *states: str, timeout: float = 60) -> JobRecord:
    deadline = time.monotonic() + timeout
    rec = await c.get_job(job_id)
    while rec.state not in states:
        assert not rec.terminal or rec.state in states, f"{job_id} ended {rec.state}: {rec.reason} {rec.node_reasons}"
        assert time.monotonic() < deadline, f"{job_id} is {rec.state}, not {states}, after {timeout}s"
        await asyncio.sleep(0.2)
        rec = await c.get_job(job_id)
    return rec


async def node_record(c: OnePlusClient, node: str) -> Any:
    return next((n for n in await c.nodes() if n.topology.node == node), None)


def env_of(info: dict[str, Any]) -> dict[str, str]:
    return dict(e.split("=", 1) for e in info["Config"]["Env"])


def shell(script: str) -> list[str]:
    return ["sh", "-c", script]


# -- a) a job through the whole platform runs as containers with its env, labels, cpuset and limits ----------------


async def test_a_job_runs_as_containers_with_its_environment_labels_cpuset_and_limits_and_its_logs_are_served(
    stack: Stack,
) -> None:
    node = stack.node.name
    spec = JobSpec(
        name="svc-env",
        team="vision",
        ranks=2,
        # Requests reserve, limits cap (Kubernetes' rule): the caps asserted below come from the limits.
        resources={"gpus": 1, "cpus": 1.5, "memory_mb": 96, "cpu_limit": 1.5, "memory_limit_mb": 96},  # type: ignore[arg-type]
        topology={"domain": "node", "mode": "required"},  # type: ignore[arg-type]
        env={"GREETING": "hello"},
        labels={"owner": "svc-test"},
        command=shell(
            'echo "rank=$RANK of $WORLD_SIZE local=$LOCAL_RANK cuda=$CUDA_VISIBLE_DEVICES greeting=$GREETING"; sleep 2'
        ),
    )
    async with OnePlusClient.connect(stack.nats_url) as c:
        job = await submit(c, spec)
        rec = await until_state(c, job, "RUNNING", "SUCCEEDED")
        running = await containers_of(stack.engine_url, job)
        done = (await wait_terminal(c, [job], timeout=60, platform=stack.platform))[job]
        assert done.state == "SUCCEEDED", (done.reason, done.node_reasons)

        assert rec.allocation is not None and rec.token is not None
        gpus = {p.rank: p.gpus for p in rec.allocation.ranks}
        assert [int(i["Config"]["Labels"]["oneplus.rank"]) for i in running] == [0, 1]
        ncpu = (await engine(stack.engine_url, lambda d: d.system.info()))["NCPU"]
        affinity = {g.index: parse_cpu_list(g.cpu_affinity or "") for g in load_preset(PRESET, node).gpus}
        for info in running:
            rank = int(info["Config"]["Labels"]["oneplus.rank"])
            labels = info["Config"]["Labels"]
            assert labels["oneplus.job"] == job and labels["oneplus.node"] == node
            assert labels["oneplus.token"] == str(rec.token) and labels["owner"] == "svc-test"
            env = env_of(info)
            assert env["RANK"] == str(rank) and env["LOCAL_RANK"] == str(rank) and env["WORLD_SIZE"] == "2"
            assert env["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, gpus[rank]))  # host numbering: no GPU runtime
            assert env["ONEPLUS_JOB_ID"] == job and env["ONEPLUS_TOKEN"] == str(rec.token)
            assert env["ONEPLUS_CHECKPOINT_SIGNAL"] == "SIGUSR1" and env["GREETING"] == "hello"
            host = info["HostConfig"]
            near = set().union(*(affinity[g] for g in gpus[rank])) & set(range(ncpu))
            assert host["CpusetCpus"] == format_cpu_list(near), "the CPUs of the rank's GPUs' NUMA node"
            assert host["NanoCpus"] == int(min(1.5, ncpu) * 1e9)
            assert host["Memory"] == 96 * 1024 * 1024
            assert host["NetworkMode"] == "none"

        logs = await c.ops(f"{subjects.PREFIX}.ops.node.{node}.logs", {"job_id": job})
        expected = [
            f"[rank {r}] rank={r} of 2 local={r} cuda={','.join(map(str, gpus[r]))} greeting=hello" for r in (0, 1)
        ]
        assert logs["lines"] == expected and logs["running"] is False
        one = await c.ops(f"{subjects.PREFIX}.ops.node.{node}.logs", {"job_id": job, "rank": 1})
        assert one["lines"] == [expected[1].removeprefix("[rank 1] ")]

    out = await asyncio.to_thread(CliRunner().invoke, cli, ["logs", job, "--nats", stack.nats_url])
    assert out.exit_code == 0, out.output
    assert f"{node} {expected[1]}" in out.output


# -- b2) scancel --signal on a batch job: the script and its running srun step's task get it; the job goes on ---------

SIGNALLED_BATCH = """#!/bin/sh
#SBATCH --nodes=1
#SBATCH --ntasks=1
#SBATCH --mem=64M
trap 'echo "batch shell: USR1"' USR1
srun sh -c 'trap "echo task: USR1" USR1; echo ready; while :; do sleep 0.1; done' &
while :; do sleep 0.2; done
"""


async def test_scancel_signal_reaches_the_batch_script_and_a_running_steps_task_without_ending_the_job(
    stack: Stack,
) -> None:
    from oneplus_jobformats.sbatch import parse_sbatch

    spec = parse_sbatch(SIGNALLED_BATCH, filename="signalled.sh", submit_dir="/home/me").spec
    node = stack.node.name
    logs_subject = f"{subjects.PREFIX}.ops.node.{node}.logs"

    async def logged(c: OnePlusClient, job: str, *lines: str, timeout: float = 60) -> list[str]:
        deadline = time.monotonic() + timeout
        while True:
            got = (await c.ops(logs_subject, {"job_id": job, "rank": 0}))["lines"]
            if set(lines) <= set(got):
                return list(got)
            assert time.monotonic() < deadline, f"{lines} never all logged: {got}"
            await asyncio.sleep(0.2)

    async with OnePlusClient.connect(stack.nats_url) as c:
        job = await submit(c, spec)
        await until_state(c, job, "RUNNING")
        await logged(c, job, "ready")  # the step's task runs (its output streams through the batch script's)
        got = await asyncio.to_thread(
            CliRunner().invoke, cli, ["scancel", "--signal=USR1", job, "--nats", stack.nats_url]
        )
        assert got.exit_code == 0 and got.output == "", got.output
        lines = await logged(c, job, "task: USR1", "batch shell: USR1")
        assert lines.count("task: USR1") == 1 and lines.count("batch shell: USR1") == 1, lines
        assert (await c.get_job(job)).state == "RUNNING"  # the signal did not end it
        got = await asyncio.to_thread(CliRunner().invoke, cli, ["scancel", job, "--nats", stack.nats_url])
        assert got.exit_code == 0, got.output
        done = (await wait_terminal(c, [job], timeout=60, platform=stack.platform))[job]
        assert done.state == "CANCELLED", (done.reason, done.node_reasons)


TIMED_BATCH = """#!/bin/sh
#SBATCH --nodes=1
#SBATCH --ntasks=1
#SBATCH --mem=64M
srun sh -c 'trap "echo TERM > /tmp/step-got-term; exit 0" TERM; echo ready; while :; do sleep 0.1; done'
"""


async def test_a_batch_job_past_its_time_limit_ends_and_its_running_steps_task_gets_sigterm_first(
    stack: Stack,
) -> None:
    from oneplus_jobformats.sbatch import parse_sbatch

    spec = parse_sbatch(TIMED_BATCH, filename="timed.sh", submit_dir="/home/me").spec
    spec = spec.model_copy(update={"time_limit_s": 4})  # --time takes minutes at least: the spec's seconds here
    async with OnePlusClient.connect(stack.nats_url) as c:
        job = await submit(c, spec)
        done = (await wait_terminal(c, [job], timeout=90, platform=stack.platform))[job]
    assert done.state == "FAILED", (done.state, done.reason, done.node_reasons)
    assert done.node_reasons[stack.node.name].startswith("time limit reached: stopped after 4 s (--time)")
    (batch,) = await containers_of(stack.engine_url, job)

    async def read(docker: aiodocker.Docker) -> bytes:
        tar = await docker.containers.container(batch["Id"]).get_archive("/tmp/step-got-term")
        member = tar.extractfile(tar.getmembers()[0])
        assert member is not None
        return member.read()

    assert await engine(stack.engine_url, read) == b"TERM\n"  # the step's task trapped SIGTERM before the kill


# -- c) a missing image ----------------------------------------------------------------------------------------------


async def test_a_missing_image_fails_the_job_with_a_reason_naming_the_image(stack: Stack) -> None:
    image = "localhost/oneplus-absent:1"
    async with OnePlusClient.connect(stack.nats_url) as c:
        job = await submit(c, JobSpec(name="svc-noimage", resources={"gpus": 1}, image=image, command=["true"]))  # type: ignore[arg-type]
        rec = (await wait_terminal(c, [job], timeout=60, platform=stack.platform))[job]
    node = stack.node.name
    assert rec.state == "FAILED"
    assert rec.nodes_done == {node: 127}
    assert rec.node_reasons[node].startswith(f"launch failed: image {image} not found on node {node}")
    assert await containers_of(stack.engine_url, job) == [], "nothing of a failed launch is left behind"


# -- e) preemption: SIGUSR1, the checkpoint acknowledgement, stop ---------------------------------------------------

LOW = """
trap 'date +%s > "$ONEPLUS_CHECKPOINT_MARKER"; echo "checkpoint written"' USR1
trap 'echo "stopping"; exit 143' TERM
echo "attempt token=$ONEPLUS_TOKEN resume=${ONEPLUS_RESUME:-0}"
# The first attempt outlives any preemption delay on a loaded CI host; the resumed one ends soon.
if [ "${ONEPLUS_RESUME:-0}" = 0 ]; then s=300; else s=2; fi
sleep "$s" & p=$!
while kill -0 "$p" 2>/dev/null; do wait "$p"; done
echo "finished"
"""


async def test_preemption_signals_the_container_waits_for_its_checkpoint_and_stops_it(stack: Stack) -> None:
    low = JobSpec(
        name="svc-low",
        team="research",
        priority=0,
        preemptible=True,
        resources={"gpus": 8, "cpus": 1, "memory_mb": 64},  # type: ignore[arg-type]
        checkpoint={"signal": "SIGUSR1", "grace_s": 20},  # type: ignore[arg-type]
        command=shell(LOW),
    )
    high = JobSpec(
        name="svc-high",
        team="prod",
        priority=1000,
        preemptible=False,
        resources={"gpus": 8, "cpus": 1, "memory_mb": 64},  # type: ignore[arg-type]
        command=shell("echo urgent; sleep 1"),
    )
    async with OnePlusClient.connect(stack.nats_url) as c:
        victim = await submit(c, low)
        await until_state(c, victim, "RUNNING")
        (first,) = await containers_of(stack.engine_url, victim)
        preemptor = await submit(c, high)
        stopped = await stopped_state(stack.engine_url, first["Id"])
        jobs = await wait_terminal(c, [victim, preemptor], timeout=90, platform=stack.platform)
        assert {j.state for j in jobs.values()} == {"SUCCEEDED"}, {j.job_id: j.reason for j in jobs.values()}
        resumed = await c.ops(f"{subjects.PREFIX}.ops.node.{stack.node.name}.logs", {"job_id": victim})

    assert stopped["State"]["ExitCode"] == 143 and not stopped["State"]["Running"]
    first_logs = stopped["logs"]
    assert first_logs[0].startswith("attempt token=") and first_logs[0].endswith("resume=0")
    assert first_logs[1:] == ["checkpoint written", "stopping"], "SIGUSR1 first, SIGTERM after the acknowledgement"

    async with nats_connection(stack.nats_url) as bus:
        events = await job_history(bus, victim)
    types = [e.type for e in events]
    i = types.index("preempting")
    assert types[i : i + 4] == ["preempting", "checkpointed", "node_finished", "requeued"], types
    ck, ended = events[i + 1], events[i + 2]
    assert ck.acknowledged, "the marker the job wrote is the acknowledgement"
    assert ended.exit_code == 143 and ended.reason.startswith("preempted: ")
    assert jobs[victim].preemptions == 1 and jobs[victim].checkpoint_ts == ck.checkpoint_ts
    assert resumed["lines"][0].endswith("resume=1") and resumed["lines"][-1] == "[rank 0] finished"


async def stopped_state(url: str, container_id: str, timeout: float = 60) -> dict[str, Any]:
    """Poll one container until it has stopped; its inspect and its output then (before a relaunch removes it)."""

    async def go(docker: aiodocker.Docker) -> dict[str, Any]:
        container = docker.containers.container(container_id)
        deadline = time.monotonic() + timeout
        while True:
            info: dict[str, Any] = await container.show()
            if not info["State"]["Running"]:
                info["logs"] = "".join(await container.log(stdout=True, stderr=True)).splitlines()
                return info
            assert time.monotonic() < deadline, "the victim's container was never stopped"
            await asyncio.sleep(0.1)

    result: dict[str, Any] = await engine(url, go)
    return result


@contextlib.asynccontextmanager
async def nats_connection(url: str) -> AsyncIterator[nats.aio.client.Client]:
    nc = await nats.connect(url)
    try:
        yield nc
    finally:
        await nc.close()


# -- b) SIGKILL of the executor mid-job ------------------------------------------------------------------------------


async def test_an_executor_killed_mid_job_adopts_its_containers_on_restart_and_never_starts_a_second_copy(
    stack: Stack,
) -> None:
    p, node = stack.platform, stack.node
    spec = JobSpec(
        name="svc-crash",
        ranks=2,
        resources={"gpus": 1, "cpus": 0.5, "memory_mb": 64},  # type: ignore[arg-type]
        topology={"domain": "node", "mode": "required"},  # type: ignore[arg-type]
        command=shell('echo "up $RANK"; sleep 15; echo "done $RANK"'),
    )
    async with OnePlusClient.connect(stack.nats_url) as c, nats_connection(stack.nats_url) as bus:
        job = await submit(c, spec)
        await until_state(c, job, "RUNNING")
        before = [i["Id"] for i in await containers_of(stack.engine_url, job)]
        assert len(before) == 2

        p.kill(f"executor-{node.name}")  # SIGKILL: no cleanup of any kind runs
        beats = await bus.subscribe(subjects.node_heartbeat(node.name))
        p.start_executor(node)
        await adopted(beats, job, timeout=60)
        await beats.unsubscribe()

        # The launch command comes again (a redelivery after the crash): nothing new may start.
        launch = await launch_command(bus, job, node.name)
        await bus.jetstream().publish(
            subjects.node_command(node.name, "launch"),
            launch.model_dump_json().encode(),
            headers={"Nats-Msg-Id": f"again-{job}"},
            stream=subjects.COMMANDS_STREAM,
        )
        rec = (await wait_terminal(c, [job], timeout=60, platform=p))[job]
        events = await job_history(bus, job)

    assert rec.state == "SUCCEEDED", (rec.reason, rec.node_reasons)
    after = await containers_of(stack.engine_url, job)
    assert [i["Id"] for i in after] == before, "the same two containers, adopted: no second copy"
    assert all(i["State"]["ExitCode"] == 0 for i in after)
    assert [e.type for e in events].count("starting") == 1
    assert f"adopting {job}" in p.logs(f"executor-{node.name}")


async def adopted(beats: Any, job_id: str, timeout: float) -> None:
    """Until the restarted executor's heartbeat lists the job among the ranks it runs."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            msg = await beats.next_msg(timeout=1.0)
        except (TimeoutError, nats.errors.TimeoutError):
            continue
        if job_id in NodeHeartbeat.model_validate_json(msg.data).running:
            return
    raise AssertionError(f"no heartbeat of the restarted executor listed {job_id} within {timeout}s")


async def launch_command(bus: nats.aio.client.Client, job_id: str, node: str) -> LaunchRanks:
    sub = await bus.jetstream().subscribe(subjects.node_command(node, "launch"), ordered_consumer=True)
    try:
        while True:
            msg = await sub.next_msg(timeout=5)
            cmd = NODE_COMMAND_ADAPTER.validate_json(msg.data)
            if isinstance(cmd, LaunchRanks) and cmd.job_id == job_id:
                return cmd
    finally:
        await sub.unsubscribe()


# -- d) the engine goes away and comes back ------------------------------------------------------------------------


async def test_a_stopped_engine_makes_the_node_unhealthy_until_it_returns(
    stack: Stack, private_engine: tuple[str, EngineControl, EngineControl], node_tag: str
) -> None:
    url, stop_engine, start_engine = private_engine
    node = SimNode(f"{node_tag}-d", "l40s_8gpu_pcie_node_sys", "leaf-1", "spine-0")
    env = {**stack.platform.env(), "ONEPLUS_DOCKER_URL": url}
    proc = spawn(executor_argv(node), stack.platform.logdir / f"executor-{node.name}.log", env)
    try:
        async with OnePlusClient.connect(stack.nats_url) as c:
            await until_node(c, node.name, lambda n: n.status == "ready", "ready", 90)
            await stop_engine()
            down = await until_node(c, node.name, lambda n: n.status == "unhealthy", "unhealthy", 30)
            assert not down.engine_ok
            assert down.reason.startswith(f"container engine at {url} is unreachable")
            await start_engine()
            up = await until_node(c, node.name, lambda n: n.status == "ready", "ready again", 30)
            assert up.engine_ok and up.reason is None
    finally:
        proc.terminate()
        proc.wait(15)


def executor_argv(node: SimNode) -> list[str]:
    argv = [sys.executable, "-m", "oneplus_node_executor", "--node", node.name, "--topology", node.topology]
    return [*argv, "--runtime", "docker", "--leaf", node.leaf or "", "--spine", node.spine or ""]


async def until_node(c: OnePlusClient, node: str, ok: Callable[[Any], bool], what: str, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    rec = None
    while time.monotonic() < deadline:
        rec = await node_record(c, node)
        if rec is not None and ok(rec):
            return rec
        await asyncio.sleep(0.2)
    seen = (rec.status, rec.reason) if rec is not None else "not registered"
    raise AssertionError(f"node {node} not {what} within {timeout}s (last seen: {seen})")
