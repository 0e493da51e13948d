"""The container runtime: each local rank is one container, driven through the Docker Engine API.

Works against Docker or Podman's Docker-compatible service. The engine is the only state: every container carries
labels (job, rank, fencing token, node), so a restarted executor finds, adopts or removes what it left behind.
"""

from __future__ import annotations

import asyncio
import io
import json
import math
import tarfile
import time
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiodocker
import aiohttp
from oneplus_contracts import LaunchRanks, NodeTopology, RankPlacement

from . import slurm
from .base import EngineUnavailable, LaunchFailed, RanksExit, RunningRanks, StaleToken
from .container_spec import (
    LABEL_JOB,
    LABEL_MANAGED,
    LABEL_NODE,
    RankIdentity,
    container_body,
    container_env,
    container_name,
    identity_from_labels,
    launcher_body,
    launcher_name,
)
from .cpuset import numa_cpuset
from .docker_engine import engine_errors, ensure_image, unreachable
from .docker_logs import merge_lines, split_lines
from .environment import (
    DEFAULT_IMEX_CHANNEL,
    MPI_HOSTFILE,
    local_ranks,
    mpi_hostfile,
    rank_environment,
    validate_launch,
)
from .exits import RankEnd, describe_end, rank_end, should_restart, summarize
from .slurm_tasks import NodeTasks

# Engine states in which a container still counts as a live rank ("configured" is Podman's "created").
LIVE_STATES = frozenset({"created", "configured", "running", "paused", "restarting"})
NOT_STARTED = frozenset({"created", "configured"})

CpusetFor = Callable[[RankPlacement], str | None]


# How long one wait call may block before the container's state is inspected again.
WAIT_POLL_S = 5.0
LAUNCHER_POLL_S = 0.5  # how often the launcher's node looks for the launcher until it exists
LAUNCHER_STOP_GRACE_S = 5.0  # SIGTERM → SIGKILL for the workers once their launcher has ended
# How long a batch node's end waits for its step server to have ended the steps still running (their ends are in
# the reason): the steps' kill wait, and their signals' round trips.
STEPS_END_WAIT_S = slurm.STEP_KILL_WAIT_S + 10.0


# Podman before 4.4 (Debian 12 ships 4.3) fails a whole listing with 500 "read /proc/<pid>/cgroup: no such process"
# when a container's process exits while it is listed (containers/podman#16383, fixed by #16504): a race, not an
# engine fault, that CI met once in a rank's restart test. The listing is asked again; Docker never answers so.
LIST_RACE_TRIES = 3
LIST_RACE_PAUSE_S = 0.05


def listing_raced_an_exit(e: aiodocker.DockerError) -> bool:
    return e.status == 500 and "no such process" in str(e.message)


@dataclass(frozen=True)
class RankContainer:
    """One of our containers, as the engine lists it."""

    id: str
    name: str
    state: str
    identity: RankIdentity


class DockerRuntime:
    name = "docker"

    def __init__(
        self,
        url: str,
        *,
        node_topology: NodeTopology | None = None,
        node: str | None = None,
        gpu_node: bool = False,
        cpuset_for: CpusetFor | None = None,
        network_mode: str | None = None,
        host_cpus: Iterable[int] | None = None,
        cpu_limit: bool = True,
        max_restarts: int = 3,
        pull_timeout_s: float = 600.0,
        ping_timeout_s: float = 3.0,
        slurm_spool_root: Path | None = None,
        imex_channel: int | None = DEFAULT_IMEX_CHANNEL,
    ) -> None:
        self.url = url
        # The IMEX channel a multi-node NVLink job's containers get (None: this node gives none).
        self.imex_channel = imex_channel
        self.topology = node_topology
        self.node = node or (node_topology.node if node_topology else None)
        self.gpu_node = gpu_node
        # Multi-node NCCL needs the host's network (and its RDMA NICs); a CPU-only container needs none.
        self.network_mode = network_mode or ("host" if gpu_node else "none")
        self.cpu_limit = cpu_limit
        self.max_restarts = max_restarts
        self.pull_timeout_s = pull_timeout_s
        self.ping_timeout_s = ping_timeout_s
        self._cpuset_for = cpuset_for
        self._host_cpus = frozenset(host_cpus) if host_cpus is not None else None
        self._docker: aiodocker.Docker | None = None
        self.slurm_spool_root = slurm_spool_root or slurm.spool_root(self.node)  # srun's requests (Slurm batch jobs)
        self.slurm_tasks = NodeTasks(self)  # the srun step tasks running here (and, on a batch node, steps' ends)
        self._restarts: dict[str, int] = {}  # container id → restarts done by this runtime
        self._stopping: dict[str, str] = {}  # job id → why the executor stopped it
        self._marker_baseline: dict[str, float | None] = {}  # container id → marker mtime when signalled

    # -- engine access ---------------------------------------------------------------------------------------------

    def _client(self) -> aiodocker.Docker:
        if self._docker is None:
            self._docker = aiodocker.Docker(url=self.url)
        return self._docker

    @asynccontextmanager
    async def _engine(self, doing: str) -> AsyncIterator[aiodocker.Docker]:
        async with engine_errors(self.url, doing):
            yield self._client()

    async def healthy(self) -> tuple[bool, str | None]:
        # One retry: the first request after an engine restart may land on a pooled connection that is gone.
        reason: str | None = None
        for _ in range(2):
            try:
                async with self._engine("ping") as docker:
                    await asyncio.wait_for(docker.version(), self.ping_timeout_s)
                return True, None
            except EngineUnavailable as e:
                reason = str(e)
            except aiodocker.DockerError as e:
                reason = f"container engine at {self.url} answered with an error: {e.message}"
        return False, reason

    async def close(self) -> None:
        if self._docker is not None:
            await self._docker.close()
            self._docker = None

    async def _find(self, job_id: str | None = None) -> list[RankContainer]:
        """Our containers on this node (every state), optionally of one job."""
        labels = [f"{LABEL_MANAGED}=true"]
        if job_id is not None:
            labels.append(f"{LABEL_JOB}={job_id}")
        if self.node is not None:
            labels.append(f"{LABEL_NODE}={self.node}")
        filters = json.dumps({"label": labels})
        for attempt in range(LIST_RACE_TRIES):
            try:
                async with self._engine("listing containers") as docker:
                    found = await docker.containers.list(all=True, filters=filters)
                break
            except aiodocker.DockerError as e:
                if not listing_raced_an_exit(e) or attempt == LIST_RACE_TRIES - 1:
                    raise
                await asyncio.sleep(LIST_RACE_PAUSE_S)  # the container's exit is done: the next listing reads it
        out: list[RankContainer] = []
        for c in found:
            info: dict[str, Any] = c._container
            ident = identity_from_labels(info.get("Labels"))
            if ident is None or (job_id is not None and ident.job_id != job_id):
                continue
            names = info.get("Names") or [""]
            out.append(RankContainer(c.id, str(names[0]).lstrip("/"), str(info.get("State", "")).lower(), ident))
        return sorted(out, key=lambda c: (c.identity.token, c.identity.rank))

    async def _current(self, job_id: str, rank: int | None = None) -> list[RankContainer]:
        """The job's containers of its newest token on this node (older tokens are fenced off)."""
        found = await self._find(job_id)
        if not found:
            raise LookupError(f"job {job_id} has no containers on node {self.node or '(this node)'}")
        newest = max(c.identity.token for c in found)
        mine = [c for c in found if c.identity.token == newest]
        if rank is None:
            return mine
        picked = [c for c in mine if c.identity.rank == rank]
        if not picked:
            have = sorted(c.identity.rank for c in mine)
            where = self.node or "(this node)"
            raise LookupError(f"job {job_id} has no rank {rank} on node {where} (ranks here: {have})")
        return picked

    # -- launch ----------------------------------------------------------------------------------------------------

    async def launch(self, cmd: LaunchRanks, env_per_rank: dict[int, dict[str, str]]) -> None:
        try:
            validate_launch(cmd, self.topology)
        except ValueError as e:
            raise LaunchFailed(str(e)) from e
        existing = await self._find(cmd.job_id)
        newer = sorted({c.identity.token for c in existing if c.identity.token > cmd.token})
        if newer:
            raise StaleToken(
                f"launch of job {cmd.job_id} with token {cmd.token} refused: node {cmd.node} holds it with token "
                f"{newer[-1]}"
            )
        await self._remove([c for c in existing if c.identity.token < cmd.token])
        mine = {c.identity.rank: c for c in existing if c.identity.token == cmd.token}
        ranks = local_ranks(cmd)
        if all(p.rank in mine and mine[p.rank].state not in NOT_STARTED for p in ranks):
            return  # a redelivered launch: every rank already exists
        await ensure_image(
            self._client(),
            self.url,
            cmd.spec.image,
            cmd.spec.pull_policy,
            node=self.node,
            pull_timeout_s=self.pull_timeout_s,
        )
        computed = rank_environment(cmd, self.topology, in_container=self.gpu_node)
        try:
            for local_rank, p in enumerate(ranks):
                have = mine.get(p.rank)
                if have is not None and have.state not in NOT_STARTED:
                    continue
                env = container_env(computed[p.rank], env_per_rank.get(p.rank), gpu_node=self.gpu_node)
                cid = have.id if have is not None else await self._create(cmd, p, local_rank, env)
                await self._start(cmd, p, cid)
        except LaunchFailed:
            # Half a gang cannot make progress and would hold its GPUs: remove what exists of this token.
            await self._remove([c for c in await self._find(cmd.job_id) if c.identity.token == cmd.token])
            raise

    async def launch_launcher(self, cmd: LaunchRanks, env: dict[str, str]) -> None:
        """Start an MPIJob's launcher beside this node's ranks, with the workers' hostfile at /etc/mpi/hostfile.
        Idempotent: a launcher of this token that exists already is left as it is."""
        launcher = cmd.spec.launcher
        if launcher is None:
            return
        existing = [c for c in await self._find(cmd.job_id) if c.identity.is_launcher and c.identity.token == cmd.token]
        if existing and existing[0].state not in NOT_STARTED:
            return
        image = launcher.image or cmd.spec.image
        await ensure_image(
            self._client(), self.url, image, cmd.spec.pull_policy, node=self.node, pull_timeout_s=self.pull_timeout_s
        )
        body = launcher_body(cmd, env, network_mode=self.network_mode)
        try:
            async with self._engine("creating the launcher") as docker:
                if existing:
                    container = docker.containers.container(existing[0].id)
                else:
                    container = await docker.containers.create(body, name=launcher_name(cmd.job_id, cmd.token))
                await container.put_archive("/", _hostfile_tar(mpi_hostfile(cmd)))  # type: ignore[no-untyped-call]
                await container.start()
        except aiodocker.DockerError as e:
            raise LaunchFailed(f"starting the launcher of job {cmd.job_id} failed: {e.message}") from e

    async def _host_cpu_set(self) -> frozenset[int]:
        if self._host_cpus is None:
            async with self._engine("reading engine info") as docker:
                info = await docker.system.info()
            self._host_cpus = frozenset(range(int(info.get("NCPU") or 1)))
        return self._host_cpus

    async def _create(self, cmd: LaunchRanks, p: RankPlacement, local_rank: int, env: dict[str, str]) -> str:
        host_cpus = await self._host_cpu_set()
        cpuset = self._cpuset_for(p) if self._cpuset_for else numa_cpuset(self.topology, p.gpus, host_cpus)
        # A CPU limit caps (NanoCpus); the request only reserves: no limit, no cap beyond the rank's cpuset.
        cap = cmd.spec.rank_resources(p.rank).cpu_limit  # a heterogeneous job: its component's
        nano = int(min(cap, len(host_cpus)) * 1e9) if self.cpu_limit and cap is not None else None
        body = container_body(
            cmd,
            p,
            env,
            local_rank=local_rank,
            gpu_node=self.gpu_node,
            network_mode=self.network_mode,
            cpuset=cpuset,
            nano_cpus=nano,
            imex_channel=self.imex_channel,
            mps=self.topology.mps if self.topology is not None else None,
        )
        if slurm.is_batch_job(cmd.spec):  # the batch script on rank 0, holders elsewhere, srun mounted in all
            spool = slurm.prepare_spool(self.slurm_spool_root, cmd.job_id, cmd.token) if p.rank == 0 else None
            slurm.adjust_body(body, cmd, p, spool)
        name = container_name(cmd.job_id, p.rank, cmd.token)
        try:
            async with self._engine("creating a container") as docker:
                return (await docker.containers.create(body, name=name)).id
        except aiodocker.DockerError as e:
            msg = str(e.message)
            if e.status == 409 or "already in use" in msg:  # a concurrent delivery of the same launch won the race
                async with self._engine("looking up a container") as docker:
                    return (await docker.containers.get(name)).id
            if e.status == 404:
                raise LaunchFailed(f"image {cmd.spec.image} not found on node {cmd.node}: {msg}") from e
            raise LaunchFailed(f"creating the container of rank {p.rank} of job {cmd.job_id} failed: {msg}") from e

    async def _start(self, cmd: LaunchRanks, p: RankPlacement, cid: str) -> None:
        try:
            async with self._engine("starting a container") as docker:
                await docker.containers.container(cid).start()
        except aiodocker.DockerError as e:
            raise LaunchFailed(f"starting rank {p.rank} of job {cmd.job_id} failed: {e.message}") from e

    # -- lifecycle -------------------------------------------------------------------------------------------------

    async def wait(self, job_id: str) -> RanksExit:
        ranks = await self._current(job_id)
        if any(c.identity.is_launcher or c.identity.launcher_here for c in ranks):
            return await self._wait_with_launcher(job_id, ranks)
        ends = await asyncio.gather(*(self._wait_rank(c) for c in ranks))
        return await self._ranks_exit(job_id, list(ends))

    async def _ranks_exit(self, job_id: str, ends: list[RankEnd], reason: str | None = None) -> RanksExit:
        code, said = summarize(ends, stopped_reason=self._stopping.get(job_id))
        if job_id in self.slurm_tasks.served:  # a batch job's batch node: how each of its srun steps ended
            await self.slurm_tasks.steps_served(job_id, STEPS_END_WAIT_S)
            steps = self.slurm_tasks.summary(job_id)
            if steps:
                said = f"{said}; {steps}"
        ack = await self.checkpoint_acknowledged(job_id)
        return RanksExit(
            exit_code=code,
            reason=said if reason is None or job_id in self._stopping else reason,
            per_rank={e.rank: e.exit_code for e in ends},
            checkpointed=ack is not None,
            checkpoint_ts=ack,
        )

    async def _wait_with_launcher(self, job_id: str, ranks: list[RankContainer]) -> RanksExit:
        """An MPIJob on its launcher's node: the job's end here is the launcher's (mpi-operator v2). Until the launcher
        exists, a worker that ends by itself ends the wait; once it has ended, the workers here are stopped."""
        workers = [c for c in ranks if not c.identity.is_launcher]
        token = max(c.identity.token for c in ranks)
        workers_done = asyncio.ensure_future(asyncio.gather(*(self._wait_rank(c) for c in workers)))
        # A launcher still being created (not started) has not ended: the engine's wait would return at once.
        started = [c for c in ranks if c.identity.is_launcher and c.state not in NOT_STARTED]
        try:
            launcher = started[0] if started else None
            while launcher is None:
                done, _ = await asyncio.wait({workers_done}, timeout=LAUNCHER_POLL_S)
                if done:
                    return await self._ranks_exit(job_id, list(workers_done.result()))
                found = await self._find(job_id)
                launcher = next(
                    (
                        c
                        for c in found
                        if c.identity.is_launcher and c.identity.token == token and c.state not in NOT_STARTED
                    ),
                    None,
                )
            end = await self._wait_rank(launcher)
        finally:
            if not workers_done.done():
                workers_done.cancel()
        # The workers (sshd, typically) never end by themselves: stop the ones here; their exit is not the job's.
        live = [c for c in await self._find(job_id) if c.state in LIVE_STATES and not c.identity.is_launcher]
        await asyncio.gather(*(self._stop_one(c, LAUNCHER_STOP_GRACE_S) for c in live))
        said = describe_end(end).replace(f"rank {end.rank}", "the launcher", 1)
        return await self._ranks_exit(job_id, [end], reason=f"{said} (the job ends with its launcher)")

    async def _wait_rank(self, c: RankContainer) -> RankEnd:
        """Wait for one rank; restart it while its policy says so and the executor is not stopping the job."""
        while True:
            try:
                async with self._engine("waiting for a container") as docker:
                    container = docker.containers.container(c.id)
                    try:
                        # Bounded: an engine can miss an exit that lands as the wait begins; inspect decides.
                        await asyncio.wait_for(container.wait(), timeout=WAIT_POLL_S)
                    except TimeoutError:
                        pass
                    except aiodocker.DockerError as e:
                        # Podman may answer "container not running" when the rank ended as the wait began:
                        # the inspect below decides.
                        if e.status == 404:
                            raise
                    info = await container.show()
            except aiodocker.DockerError as e:
                if e.status == 404:
                    return RankEnd(c.identity.rank, 137, error="its container was removed before it ended")
                raise
            if info.get("State", {}).get("Running"):
                await asyncio.sleep(0.1)  # still running: wait again, not in a spin
                continue
            restarts = self._restarts.get(c.id, 0)
            memory = int(info.get("HostConfig", {}).get("Memory") or 0) // (1024 * 1024) or None
            end = rank_end(c.identity.rank, info.get("State", {}), memory_mb=memory, restarts=restarts)
            stopping = c.identity.job_id in self._stopping
            if stopping or not should_restart(c.identity.restart_policy, end, restarts, self.max_restarts):
                return end
            self._restarts[c.id] = restarts + 1
            async with self._engine("restarting a container") as docker:
                await docker.containers.container(c.id).start()

    async def signal(self, job_id: str, signal: str) -> None:
        """Signal the job's ranks (a batch job's batch shell and holders), and the tasks of its srun steps here."""
        await self._signal_containers(job_id, signal)
        await self.slurm_tasks.signal(job_id, signal)

    async def _signal_containers(self, job_id: str, signal: str) -> None:
        for c in await self._current(job_id):
            self._marker_baseline[c.id] = await self._marker_mtime(c)
            if c.state != "running":
                continue
            try:
                async with self._engine("signalling a container") as docker:
                    await docker.containers.container(c.id).kill(signal=signal)
            except aiodocker.DockerError as e:
                if e.status not in (404, 409):  # it ended between the listing and the signal
                    raise

    async def _marker_mtime(self, c: RankContainer) -> float | None:
        """When the rank last wrote its checkpoint marker (read through the archive API: works on exited ranks)."""
        if not c.identity.marker_path:
            return None
        for attempt in range(3):
            try:
                async with self._engine("reading a checkpoint marker") as docker:
                    tar = await docker.containers.container(c.id).get_archive(c.identity.marker_path)
            except aiodocker.DockerError as e:
                if e.status in (404, 500):  # no such file (Podman answers 500 for some paths), or no container
                    return None
                raise
            except tarfile.ReadError:
                # Podman answers an empty body while the rank is exiting; the next read sees the file.
                await asyncio.sleep(0.05 * (attempt + 1))
                continue
            members = tar.getmembers()
            return float(members[0].mtime) if members else None
        return None

    async def checkpoint_acknowledged(self, job_id: str) -> float | None:
        """The newest marker write after the last signal, from any local rank (rank 0 typically writes it)."""
        seen: list[float] = []
        for c in await self._current(job_id):
            mtime = await self._marker_mtime(c)
            base = self._marker_baseline.get(c.id)
            if mtime is not None and (base is None or mtime > base):
                seen.append(mtime)
        return max(seen) if seen else None

    async def stop(self, job_id: str, grace_s: float, reason: str = "stop requested") -> None:
        """SIGTERM every live rank of the job (any token), let the engine kill it after grace_s, confirm it ended."""
        self._stopping[job_id] = reason
        # A batch job's srun tasks here first (SIGTERM, their share of the grace), as Slurm ends a job's steps.
        await self.slurm_tasks.end(job_id, grace_s)
        live = [c for c in await self._find(job_id) if c.state in LIVE_STATES]
        await asyncio.gather(*(self._stop_one(c, grace_s) for c in live))

    async def _stop_one(self, c: RankContainer, grace_s: float) -> None:
        try:
            async with self._engine("stopping a container") as docker:
                container = docker.containers.container(c.id)
                await container.stop(t=math.ceil(grace_s), timeout=grace_s + 30.0)
                state = (await container.show()).get("State", {})
                if state.get("Running"):
                    await container.kill(signal="SIGKILL")
        except aiodocker.DockerError as e:
            if e.status not in (304, 404, 409):  # already stopped or gone
                raise

    async def remove(self, job_id: str, token: int | None = None) -> int:
        """Delete the job's containers on this node (of one token, or all), killing live ones; returns how many."""
        found = [c for c in await self._find(job_id) if token is None or c.identity.token == token]
        await self._remove(found)
        if token is None:
            self._stopping.pop(job_id, None)
            self.slurm_tasks.forget(job_id)
        slurm.remove_spools(self.slurm_spool_root, job_id, token)
        return len(found)

    async def _remove(self, containers: list[RankContainer]) -> None:
        for c in containers:
            try:
                async with self._engine("removing a container") as docker:
                    await docker.containers.container(c.id).delete(force=True)
            except aiodocker.DockerError as e:
                if e.status != 404:
                    raise
            self._restarts.pop(c.id, None)
            self._marker_baseline.pop(c.id, None)

    async def list_managed(self) -> list[RunningRanks]:
        """Every (job, token) with containers on this node, live or exited-but-not-removed."""
        groups: dict[tuple[str, int], list[RankContainer]] = {}
        for c in await self._find():
            groups.setdefault((c.identity.job_id, c.identity.token), []).append(c)
        return [
            RunningRanks(
                job_id=job,
                token=token,
                ranks=tuple(c.identity.rank for c in cs),
                handles=tuple(c.id for c in cs),
                exited=all(c.state not in LIVE_STATES for c in cs),
            )
            for (job, token), cs in sorted(groups.items())
        ]

    async def list_running(self) -> list[RunningRanks]:
        return [r for r in await self.list_managed() if not r.exited]

    # -- logs ------------------------------------------------------------------------------------------------------

    async def logs(self, job_id: str, rank: int | None, follow: bool) -> list[str]:
        """The job's output, one entry per line; with rank=None every line is prefixed '[rank N] '."""
        if follow:
            return [line async for line in self.stream_logs(job_id, rank)]
        ranks = await self._current(job_id, rank)
        out: list[str] = []
        for c in ranks:
            async with self._engine("reading logs") as docker:
                chunks = await docker.containers.container(c.id).log(stdout=True, stderr=True)
            prefix = _log_prefix(c) if rank is None else ""
            out.extend(prefix + line for line in "".join(chunks).splitlines())
        return out

    async def stream_logs(self, job_id: str, rank: int | None = None) -> AsyncIterator[str]:
        """Follow the job's output until its ranks end (`oneplus logs JOB -f`); lines of ranks interleave as written."""
        ranks = await self._current(job_id, rank)
        docker = self._client()

        def follow(c: RankContainer) -> AsyncIterator[str]:
            chunks: AsyncIterator[str] = docker.containers.container(c.id).log(stdout=True, stderr=True, follow=True)
            prefix = _log_prefix(c) if rank is None else ""
            return split_lines(chunks, prefix)

        try:
            async for line in merge_lines([follow(c) for c in ranks]):
                yield line
        except (aiohttp.ClientError, OSError) as e:
            raise unreachable(self.url, "following logs", str(e) or type(e).__name__) from e


def _log_prefix(c: RankContainer) -> str:
    return "[launcher] " if c.identity.is_launcher else f"[rank {c.identity.rank}] "


def _hostfile_tar(text: str) -> bytes:
    """A tar of the MPI hostfile, for the engine's archive upload into the launcher before it starts."""
    data = text.encode()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for d in ("etc", "etc/mpi"):
            info = tarfile.TarInfo(d)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, int(time.time())
            tar.addfile(info)
        info = tarfile.TarInfo(MPI_HOSTFILE.lstrip("/"))
        info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
        tar.addfile(info, io.BytesIO(data))
    # Up to the end-of-archive blocks, without tarfile's padding to a 10 KiB record: Podman's copier stops reading at
    # the end-of-archive blocks, and padding still being sent then fails the upload (500 "passing bulk input to
    # subprocess: write |1: broken pipe", containers/buildah#6573; seen once in CI).
    return buf.getvalue()[: tar.offset]
