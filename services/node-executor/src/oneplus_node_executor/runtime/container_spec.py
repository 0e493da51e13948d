"""What the executor asks the container engine for: names, labels and the create body of one rank's container.

Pure, so the GPU-node body (device request) is tested on a machine without GPUs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from oneplus_contracts import LaunchRanks, MpsDaemon, RankPlacement
from oneplus_contracts.jobspec import is_isolated_share

from .environment import DEFAULT_IMEX_CHANNEL, checkpoint_marker, imex_environment
from .synthetic import synthetic_command

LABEL_MANAGED = "oneplus.managed"
LABEL_JOB = "oneplus.job"
LABEL_RANK = "oneplus.rank"
LABEL_LOCAL_RANK = "oneplus.local_rank"
LABEL_TOKEN = "oneplus.token"
LABEL_NODE = "oneplus.node"
LABEL_MARKER = "oneplus.checkpoint_marker"
LABEL_RESTART = "oneplus.restart_policy"
LABEL_ROLE = "oneplus.role"  # "launcher": an MPIJob's launcher (its rank label is one past the last worker)
LABEL_LAUNCHER_HERE = "oneplus.launcher_here"  # on the ranks of the node where their job's launcher runs
ROLE_LAUNCHER = "launcher"

_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def launcher_name(job_id: str, token: int) -> str:
    return f"oneplus-{_NAME_UNSAFE.sub('_', job_id)}-launcher-t{token}"


def container_name(job_id: str, rank: int, token: int) -> str:
    """`oneplus-<job>-r<rank>-t<token>`: the engine refuses a second container of that name, so launch is idempotent."""
    return f"oneplus-{_NAME_UNSAFE.sub('_', job_id)}-r{rank}-t{token}"


@dataclass(frozen=True)
class RankIdentity:
    """Who a container is, read back from its labels (after an executor restart, from the engine alone)."""

    job_id: str
    rank: int
    token: int
    node: str | None
    local_rank: int
    marker_path: str
    restart_policy: str
    role: str = "rank"
    launcher_here: bool = False

    @property
    def is_launcher(self) -> bool:
        return self.role == ROLE_LAUNCHER


def rank_labels(cmd: LaunchRanks, placement: RankPlacement, local_rank: int) -> dict[str, str]:
    labels = {k: v for k, v in cmd.spec.labels.items() if not k.startswith("oneplus.")}
    labels.update(
        {
            LABEL_MANAGED: "true",
            LABEL_JOB: cmd.job_id,
            LABEL_RANK: str(placement.rank),
            LABEL_LOCAL_RANK: str(local_rank),
            LABEL_TOKEN: str(cmd.token),
            LABEL_NODE: cmd.node,
            LABEL_MARKER: checkpoint_marker(cmd),
            LABEL_RESTART: cmd.spec.restart_policy,
        }
    )
    if cmd.spec.launcher is not None and cmd.node_rank == 0:
        labels[LABEL_LAUNCHER_HERE] = "true"
    return labels


def identity_from_labels(labels: dict[str, str] | None) -> RankIdentity | None:
    """The rank a container runs, or None when it is not one of ours (or its labels were tampered with)."""
    if not labels or labels.get(LABEL_MANAGED) != "true":
        return None
    try:
        return RankIdentity(
            job_id=labels[LABEL_JOB],
            rank=int(labels[LABEL_RANK]),
            token=int(labels[LABEL_TOKEN]),
            node=labels.get(LABEL_NODE),
            local_rank=int(labels.get(LABEL_LOCAL_RANK, "0")),
            marker_path=labels.get(LABEL_MARKER, ""),
            restart_policy=labels.get(LABEL_RESTART, "Never"),
            role=labels.get(LABEL_ROLE, "rank"),
            launcher_here=labels.get(LABEL_LAUNCHER_HERE) == "true",
        )
    except (KeyError, ValueError):
        return None


def container_env(computed: dict[str, str], given: dict[str, str] | None, *, gpu_node: bool) -> dict[str, str]:
    """What the executor passed for a rank, over what `rank_environment(..., in_container=gpu_node)` computed.

    On a GPU node the device request exposes only the reserved GPUs, numbered from 0, so the computed
    CUDA_VISIBLE_DEVICES wins over a host-numbered one the executor may have passed.
    """
    env = {**computed, **(given or {})}
    if gpu_node:
        env["CUDA_VISIBLE_DEVICES"] = computed["CUDA_VISIBLE_DEVICES"]
    return env


def gpu_device_request(gpus: list[int] | list[str]) -> dict[str, Any]:
    """The Docker API form of `--gpus device=...`: the NVIDIA toolkit mounts exactly these GPUs (host indices) or
    MIG instances (their MIG-... UUIDs)."""
    return {"Driver": "nvidia", "DeviceIDs": [str(g) for g in gpus], "Capabilities": [["gpu"]]}


def container_body(
    cmd: LaunchRanks,
    placement: RankPlacement,
    env: dict[str, str],
    *,
    local_rank: int,
    gpu_node: bool,
    network_mode: str,
    cpuset: str | None,
    nano_cpus: int | None,
    imex_channel: int | None = DEFAULT_IMEX_CHANNEL,
    mps: MpsDaemon | None = None,
) -> dict[str, Any]:
    """The body of `POST /containers/create` for one rank. On a GPU node, a job whose ranks span the trays of one
    multi-node NVLink domain also gets the IMEX channel `imex_channel` (None: the node has none to give); `mps`: the
    node's MPS daemon, mounted for a GPU share."""
    host: dict[str, Any] = {
        "NetworkMode": network_mode,
        # Restarts are decided by the runtime (it must not restart a rank it stopped on purpose).
        "RestartPolicy": {"Name": "no"},
    }
    limit = cmd.spec.rank_resources(placement.rank).memory_limit_mb  # a heterogeneous job: its component's
    if limit is not None:
        # A limit caps; the request (placement.memory_mb) only reserves: no limit, no cap (as Kubernetes).
        host["Memory"] = limit * 1024 * 1024
    if cpuset:
        host["CpusetCpus"] = cpuset
    if nano_cpus:
        host["NanoCpus"] = nano_cpus
    if cmd.hosts:
        host["ExtraHosts"] = extra_hosts(cmd)
    if mps is not None and is_isolated_share(placement.gpu_milli):
        # The share's CUDA client reaches the node's MPS control daemon through its pipe and log directories.
        host["Binds"] = [f"{d}:{d}" for d in (mps.pipe_directory, mps.log_directory)]
    if gpu_node and (placement.gpus or placement.mig):
        if placement.gpus:
            env = {**env, **imex_environment(cmd, imex_channel)}
        host["DeviceRequests"] = [gpu_device_request(placement.mig or placement.gpus)]
        # NCCL over InfiniBand pins memory; the default memlock limit makes registration fail.
        host["Ulimits"] = [{"Name": "memlock", "Soft": -1, "Hard": -1}]
        host["IpcMode"] = "host"
    body: dict[str, Any] = {
        "Image": cmd.spec.image,
        "Env": [f"{k}={v}" for k, v in sorted(env.items())],
        "Labels": rank_labels(cmd, placement, local_rank),
        "StopSignal": "SIGTERM",
        "HostConfig": host,
    }
    if cmd.spec.simulate is not None:
        # A synthetic job (demo, tests): its command is only shown.
        body["Cmd"] = synthetic_command(cmd.spec, cmd.resume_progress_s)
    else:
        if cmd.spec.entrypoint is not None:
            # Kubernetes `command`: replaces the image's ENTRYPOINT, and its CMD unless `args` are given.
            # [""] is the engine's way to clear an ENTRYPOINT.
            body["Entrypoint"] = list(cmd.spec.entrypoint) or [""]
        if cmd.spec.command:
            body["Cmd"] = list(cmd.spec.command)
    return body


def extra_hosts(cmd: LaunchRanks) -> list[str]:
    """`/etc/hosts` entries (`name:address`) of the job's nodes whose address is known: MASTER_ADDR and an MPI
    hostfile name nodes, and these make the names resolve inside the containers."""
    return [f"{name}:{addr}" for name, addr in sorted(cmd.hosts.items())]


def launcher_body(cmd: LaunchRanks, env: dict[str, str], *, network_mode: str) -> dict[str, Any]:
    """The body of an MPIJob launcher's container: no GPU, the launcher's image and command, labelled as the job's
    launcher (rank label one past the last worker, so that it is listed, stopped and removed with the ranks)."""
    launcher = cmd.spec.launcher
    assert launcher is not None, "only an MPIJob with a launcher has a launcher container"
    labels = {k: v for k, v in cmd.spec.labels.items() if not k.startswith("oneplus.")}
    labels.update(
        {
            LABEL_MANAGED: "true",
            LABEL_JOB: cmd.job_id,
            LABEL_RANK: str(cmd.world_size),
            LABEL_LOCAL_RANK: "0",
            LABEL_TOKEN: str(cmd.token),
            LABEL_NODE: cmd.node,
            LABEL_MARKER: checkpoint_marker(cmd),
            LABEL_RESTART: "Never",
            LABEL_ROLE: ROLE_LAUNCHER,
        }
    )
    host: dict[str, Any] = {"NetworkMode": network_mode, "RestartPolicy": {"Name": "no"}}
    if cmd.hosts:
        host["ExtraHosts"] = extra_hosts(cmd)
    body: dict[str, Any] = {
        "Image": launcher.image or cmd.spec.image,
        "Env": [f"{k}={v}" for k, v in sorted(env.items())],
        "Labels": labels,
        "StopSignal": "SIGTERM",
        "HostConfig": host,
    }
    if launcher.entrypoint is not None:
        body["Entrypoint"] = list(launcher.entrypoint) or [""]
    if launcher.command:
        body["Cmd"] = list(launcher.command)
    return body
