"""The environment each local rank starts with: its GPUs, the rendezvous, its identity and the NCCL rail hints.

Pure: the same function feeds the container runtime and the simulated one.
"""

from __future__ import annotations

from collections.abc import Iterable

from oneplus_contracts import LaunchRanks, NodeTopology, RankPlacement
from oneplus_contracts.arrays import array_environment
from oneplus_contracts.jobspec import is_isolated_share

from .slurm import allocation_environment as slurm_environment

DEFAULT_CHECKPOINT_MARKER = "/tmp/oneplus-checkpoint"

# Variables the platform owns: a job's own env never overrides them (the gang would not rendezvous).
PLATFORM_KEYS = frozenset(
    {
        "CUDA_VISIBLE_DEVICES",
        "NVIDIA_VISIBLE_DEVICES",
        "MASTER_ADDR",
        "MASTER_PORT",
        "WORLD_SIZE",
        "RANK",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "NODE_RANK",
        "NNODES",
        "ONEPLUS_JOB_ID",
        "ONEPLUS_TOKEN",
        "ONEPLUS_NODE",
        "ONEPLUS_CHECKPOINT_MARKER",
        "ONEPLUS_CHECKPOINT_SIGNAL",
        "ONEPLUS_GPU_MILLI",
        "ONEPLUS_GPU_SHARING",
        "CUDA_MPS_PIPE_DIRECTORY",
        "CUDA_MPS_LOG_DIRECTORY",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
        "ONEPLUS_RESUME",
        "ONEPLUS_RESUME_FROM_CHECKPOINT_TS",
    }
)


# torchrun reads its options from PET_<OPTION> (torch.distributed.run); the training operators set these.
TORCHRUN_KEYS = frozenset({"PET_NNODES", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT"})


def framework_environment(
    framework: str | None, env: dict[str, str], *, rank: int, world_size: int, master_addr: str, master_port: int
) -> dict[str, str]:
    """What the job's framework operator gives each replica, beyond OnePlus's own variables.

    PyTorchJob (Training Operator v1) and TrainJob (Trainer v2 torch plugin): every replica (one OnePlus rank) is
    one torchrun node: PET_NNODES = replicas, PET_NODE_RANK = its index, PET_MASTER_ADDR/PET_MASTER_PORT = the
    rank-0 replica; PET_NPROC_PER_NODE comes from the manifest (default auto). A PyTorchJob's WORLD_SIZE is
    replicas x nprocPerNode when that is a number (the operator's rule), else the replica count. An elastic job
    (its env has PET_RDZV_BACKEND, from elasticPolicy) also gets PET_RDZV_ENDPOINT and its PET_NNODES stays the
    policy's min:max; its world size is the ranks it was placed with this time (OnePlus resizes by a restart).
    """
    if framework == "mpijob":
        return {MPI_ROLE_KEY: "worker"}
    if framework not in ("pytorchjob", "trainjob"):
        return {}
    out = {
        "PET_NNODES": str(world_size),
        "PET_NODE_RANK": str(rank),
        "PET_MASTER_ADDR": master_addr,
        "PET_MASTER_PORT": str(master_port),
        "PET_NPROC_PER_NODE": env.get("PET_NPROC_PER_NODE", "auto"),
    }
    if "PET_RDZV_BACKEND" in env:  # PyTorchJob elasticPolicy, or TrainJob's runtime torch.elasticPolicy
        # elasticPolicy (the operator's elastic.go): torchrun meets at worker 0, here rank 0's node and port;
        # PET_NNODES is the policy's min:max, the other PET_RDZV_*/PET_MAX_RESTARTS are in the job's env.
        out["PET_RDZV_ENDPOINT"] = f"{master_addr}:{master_port}"
        out["PET_NNODES"] = env.get("PET_NNODES", out["PET_NNODES"])
    nproc = out["PET_NPROC_PER_NODE"]
    if framework == "pytorchjob":
        out["PYTHONUNBUFFERED"] = env.get("PYTHONUNBUFFERED", "1")
        if nproc.isascii() and nproc.isdigit():
            out["WORLD_SIZE"] = str(world_size * int(nproc))
    return out


# mpi-operator v2: where the launcher finds its hostfile, and the variables it gives Open MPI (and Intel MPI/MPICH).
MPI_HOSTFILE = "/etc/mpi/hostfile"
MPI_ROLE_KEY = "K_MPI_JOB_ROLE"
MPI_SSH_ARGS = "-o ConnectionAttempts=10"


def mpi_hostfile(cmd: LaunchRanks) -> str:
    """The workers as mpi-operator writes them: `<host> slots=<slotsPerWorker>` per worker (Open MPI), `<host>:<slots>`
    (Intel MPI, MPICH); OnePlus's workers are its ranks, named by their node (ranks that share a node are one line
    with their slots added)."""
    launcher = cmd.spec.launcher
    slots = launcher.slots_per_worker if launcher else 1
    counts = cmd.ranks_per_node or _even_split(cmd.world_size, len(cmd.nodes))
    form = "{node} slots={slots}\n" if launcher is None or launcher.implementation == "OpenMPI" else "{node}:{slots}\n"
    return "".join(form.format(node=node, slots=slots * n) for node, n in zip(cmd.nodes, counts, strict=False) if n > 0)


def _even_split(world: int, nodes: int) -> list[int]:
    if nodes <= 0:
        return []
    base, extra = divmod(world, nodes)
    return [base + (1 if i < extra else 0) for i in range(nodes)]


def launcher_environment(cmd: LaunchRanks) -> dict[str, str]:
    """The launcher's environment: the job's env, the launcher's own, and what mpi-operator v2 sets for mpirun."""
    launcher = cmd.spec.launcher
    slots = str(launcher.slots_per_worker if launcher else 1)
    env = {**cmd.spec.env, **(launcher.env if launcher else {})}
    implementation = launcher.implementation if launcher else "OpenMPI"
    if implementation == "Intel":
        env.update(
            {
                "I_MPI_HYDRA_HOST_FILE": MPI_HOSTFILE,
                "I_MPI_HYDRA_BOOTSTRAP_EXEC_EXTRA_ARGS": MPI_SSH_ARGS,
                "I_MPI_PERHOST": slots,
            }
        )
    elif implementation == "MPICH":
        env.update({"HYDRA_HOST_FILE": MPI_HOSTFILE, "HYDRA_LAUNCH_EXTRA_ARGS": MPI_SSH_ARGS})
    else:
        env.update(
            {
                "OMPI_MCA_orte_keep_fqdn_hostnames": "true",
                "OMPI_MCA_orte_default_hostfile": MPI_HOSTFILE,
                "OMPI_MCA_plm_rsh_args": MPI_SSH_ARGS,
                "OMPI_MCA_orte_set_default_slots": slots,
            }
        )
    env.update(
        {
            MPI_ROLE_KEY: "launcher",
            "NVIDIA_VISIBLE_DEVICES": "void",
            "CUDA_VISIBLE_DEVICES": "",
            "ONEPLUS_JOB_ID": cmd.job_id,
            "ONEPLUS_TOKEN": str(cmd.token),
            "ONEPLUS_NODE": cmd.node,
            "WORLD_SIZE": str(cmd.world_size),
            "NNODES": str(max(len(cmd.nodes), 1)),
        }
    )
    return env


def checkpoint_marker(cmd: LaunchRanks) -> str:
    return cmd.spec.checkpoint.marker_path or DEFAULT_CHECKPOINT_MARKER


def rail_nics(topo: NodeTopology | None, gpus: Iterable[int]) -> list[str]:
    """The NICs on the PCIe rail of any of the given GPUs (PIX/PXB distance), in the topology's order."""
    if topo is None:
        return []
    wanted = set(gpus)
    return [nic.name for nic in topo.nics if wanted & set(nic.near_gpus)]


def nccl_ib_hca(nics: list[str]) -> str | None:
    """NCCL_IB_HCA for these NICs; '=' asks for exact names, else 'mlx5_1' would also match 'mlx5_10'."""
    return "=" + ",".join(nics) if nics else None


def local_ranks(cmd: LaunchRanks) -> list[RankPlacement]:
    """The command's ranks ordered by global rank (LOCAL_RANK is the position in this list)."""
    return sorted(cmd.ranks, key=lambda p: p.rank)


def validate_launch(cmd: LaunchRanks, topo: NodeTopology | None) -> None:
    """Refuse a launch this node cannot honour, naming what is wrong."""
    if not cmd.ranks:
        raise ValueError(f"launch of job {cmd.job_id} on {cmd.node} names no ranks")
    seen: set[int] = set()
    for p in cmd.ranks:
        if p.node != cmd.node:
            raise ValueError(f"rank {p.rank} of job {cmd.job_id} is placed on {p.node}, not on {cmd.node}")
        if p.rank in seen:
            raise ValueError(f"rank {p.rank} of job {cmd.job_id} appears twice in one launch")
        seen.add(p.rank)
        if p.rank >= cmd.world_size:
            raise ValueError(f"rank {p.rank} of job {cmd.job_id} is outside world_size={cmd.world_size}")
        if topo is not None:
            known = {g.index for g in topo.gpus}
            missing = [g for g in p.gpus if g not in known]
            if missing:
                raise ValueError(
                    f"rank {p.rank} of job {cmd.job_id} asks for GPU(s) {missing}, node {topo.node} has {sorted(known)}"
                )
            instances = {m.uuid for g in topo.gpus for m in g.mig_instances}
            unknown = [u for u in p.mig if u not in instances]
            if unknown:
                raise ValueError(
                    f"rank {p.rank} of job {cmd.job_id} asks for MIG instance(s) {unknown} that node {topo.node} "
                    f"does not have ({len(instances)} MIG instances there)"
                )
    if cmd.nodes:
        if not 0 <= cmd.node_rank < len(cmd.nodes):
            raise ValueError(f"node_rank={cmd.node_rank} is outside the job's {len(cmd.nodes)} node(s)")
        if cmd.nodes[cmd.node_rank] != cmd.node:
            raise ValueError(
                f"node_rank={cmd.node_rank} names {cmd.nodes[cmd.node_rank]}, but this launch is for {cmd.node}"
            )


def share_environment(
    p: RankPlacement, gpu_memory_mb: int | None, topo: NodeTopology | None, *, in_container: bool
) -> dict[str, str]:
    """A GPU share's limits under the node's MPS daemon, or the word that it is time-sliced without isolation.

    CUDA_MPS_ACTIVE_THREAD_PERCENTAGE is the share in percent of the GPU's SMs (rounded up: a 0.001 share still gets
    1%); CUDA_MPS_PINNED_DEVICE_MEM_LIMIT caps the memory it may pin on its device (`<device>=<MiB>M`, the device as
    CUDA numbers it where the rank runs)."""
    mps = topo.mps if topo is not None else None
    if mps is None:
        return {"ONEPLUS_GPU_SHARING": "time-slice"}
    env = {
        "ONEPLUS_GPU_SHARING": "mps",
        "CUDA_MPS_PIPE_DIRECTORY": mps.pipe_directory,
        "CUDA_MPS_LOG_DIRECTORY": mps.log_directory,
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(max(1, -(-p.gpu_milli // 10))),
    }
    if gpu_memory_mb is not None:
        devices = range(len(p.gpus)) if in_container else p.gpus
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(f"{d}={gpu_memory_mb}M" for d in devices)
    return env


def visible_devices(p: RankPlacement, *, in_container: bool) -> tuple[str, str]:
    """CUDA_VISIBLE_DEVICES and NVIDIA_VISIBLE_DEVICES of a rank: its GPUs, or its MIG instances by UUID.

    In a container the engine exposes only the rank's devices, which CUDA numbers from 0; outside one, CUDA is told
    the host's indices (or the MIG UUIDs, which CUDA accepts as device names)."""
    if p.mig:
        return ",".join(str(i) for i in range(len(p.mig))) if in_container else ",".join(p.mig), ",".join(p.mig)
    visible = range(len(p.gpus)) if in_container else p.gpus
    # 'void' is the NVIDIA toolkit's word for "no GPU", where an empty value would mean "all".
    return ",".join(str(i) for i in visible), ",".join(str(g) for g in p.gpus) or "void"


def rank_environment(
    cmd: LaunchRanks, topo: NodeTopology | None, *, in_container: bool = False
) -> dict[int, dict[str, str]]:
    """Global rank → the environment of that rank.

    `in_container`: the engine exposes only the reserved GPUs (an NVIDIA device request), so CUDA numbers them
    0..n-1 inside the container; outside one, CUDA_VISIBLE_DEVICES names the host indices.
    """
    validate_launch(cmd, topo)
    ranks = local_ranks(cmd)
    marker = checkpoint_marker(cmd)
    out: dict[int, dict[str, str]] = {}
    for local_rank, p in enumerate(ranks):
        env = dict(cmd.spec.env)
        hca = nccl_ib_hca(rail_nics(topo, p.gpus))
        if hca and "NCCL_IB_HCA" not in env:
            env["NCCL_IB_HCA"] = hca
        devices = visible_devices(p, in_container=in_container)
        env.update(
            {
                "CUDA_VISIBLE_DEVICES": devices[0],
                "NVIDIA_VISIBLE_DEVICES": devices[1],
                "MASTER_ADDR": cmd.master_addr,
                "MASTER_PORT": str(cmd.master_port),
                "WORLD_SIZE": str(cmd.world_size),
                "RANK": str(p.rank),
                "LOCAL_RANK": str(local_rank),
                "LOCAL_WORLD_SIZE": str(len(ranks)),
                "NODE_RANK": str(cmd.node_rank),
                "NNODES": str(max(len(cmd.nodes), 1)),
                "ONEPLUS_JOB_ID": cmd.job_id,
                "ONEPLUS_TOKEN": str(cmd.token),
                "ONEPLUS_NODE": cmd.node,
                "ONEPLUS_CHECKPOINT_MARKER": marker,
                "ONEPLUS_CHECKPOINT_SIGNAL": cmd.spec.checkpoint.signal,
            }
        )
        env.update(
            framework_environment(
                cmd.spec.framework,
                cmd.spec.env,
                rank=p.rank,
                world_size=cmd.world_size,
                master_addr=cmd.master_addr,
                master_port=cmd.master_port,
            )
        )
        if cmd.spec.framework == "sbatch":
            env.update(slurm_environment(cmd, p))  # the Slurm batch job's allocation (runtime/slurm.py)
        if cmd.spec.array_task is not None:
            env.update(array_environment(cmd.spec.array_task))  # a task of a job array: SLURM_ARRAY_*
        if p.gpu_milli:
            env["ONEPLUS_GPU_MILLI"] = str(p.gpu_milli)
            if is_isolated_share(p.gpu_milli):
                pinned = cmd.spec.rank_resources(p.rank).gpu_memory_mb  # a heterogeneous job: its component's
                env.update(share_environment(p, pinned, topo, in_container=in_container))
        if cmd.resume_from_checkpoint_ts is not None:
            env["ONEPLUS_RESUME"] = "1"
            env["ONEPLUS_RESUME_FROM_CHECKPOINT_TS"] = repr(cmd.resume_from_checkpoint_ts)
        out[p.rank] = env
    return out


# The IMEX channel a multi-node NVLink job's containers get. Channels are character devices
# /dev/nvidia-caps-imex-channels/channel<N> that the admin creates (they do not survive a reboot); channel 0 is the
# default one NVIDIA's IMEX guide has every node create ("IMEX Channels": default channel creation).
DEFAULT_IMEX_CHANNEL = 0


def imex_environment(cmd: LaunchRanks, channel: int | None = DEFAULT_IMEX_CHANNEL) -> dict[str, str]:
    """What a rank of a job spanning the trays of one NVLink domain needs to import and export GPU memory across
    them: `NVIDIA_IMEX_CHANNELS`, which the NVIDIA Container Toolkit reads to inject that channel's device into the
    container (toolkit >= 1.17). Empty for a job on one node or outside a multi-node domain, or with no channel."""
    if not cmd.multi_node_nvlink or channel is None:
        return {}
    return {"NVIDIA_IMEX_CHANNELS": str(channel)}
