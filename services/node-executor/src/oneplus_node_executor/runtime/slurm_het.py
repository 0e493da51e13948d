"""A heterogeneous batch job's components on the executor: their nodes, tasks and `_HET_GROUP_<n>` variables.

Placement gives each component nodes of its own and numbers the ranks in component order (oneplus_placement.hetjob),
so the launch command alone says which nodes are a component's: walking the job's nodes in order, a node belongs to
the component of the first rank it runs. `srun --het-group=N` runs its step on component N; without it, on
component 0, as Slurm does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from oneplus_contracts import LaunchRanks, RankResources


class HetGroupError(ValueError):
    """srun's --het-group names no component of the job; the message is srun's stderr line."""


@dataclass(frozen=True)
class HetGroup:
    """One component of a batch job (the whole job when it has one): where its tasks run and what each holds."""

    index: int
    nodes: list[str]
    ntasks: int
    ntasks_per_node: int
    cpus_per_task: int | None
    resources: RankResources


def het_groups(cmd: LaunchRanks) -> list[HetGroup]:
    """The job's components in order; a job of one component is one group over all of its nodes."""
    spec = cmd.spec
    nodes = list(cmd.nodes or [cmd.node])
    parts = spec.component_specs()
    owner: list[int] = [0] * len(nodes)
    if spec.components is not None and len(cmd.ranks_per_node) == len(nodes):
        first = 0
        for i, count in enumerate(cmd.ranks_per_node):
            owner[i] = spec.component_of(first)
            first += count
    out: list[HetGroup] = []
    for n, part in enumerate(parts):
        mine = [node for node, o in zip(nodes, owner, strict=True) if o == n]
        slurm = part.slurm
        out.append(
            HetGroup(
                index=n,
                nodes=mine,
                ntasks=slurm.ntasks if slurm is not None else (part.ranks if spec.components else cmd.world_size),
                ntasks_per_node=slurm.ntasks_per_node if slurm is not None else 1,
                cpus_per_task=slurm.cpus_per_task if slurm is not None else None,
                resources=part.resources,
            )
        )
    return out


def het_environment(job_id: str, groups: Sequence[HetGroup], text: Callable[[Sequence[int]], str]) -> dict[str, str]:
    """SLURM_HET_SIZE and each component's `<NAME>_HET_GROUP_<n>` variables (sbatch(1), OUTPUT ENVIRONMENT
    VARIABLES). One job, one id: every component's SLURM_JOB_ID_HET_GROUP_<n> is the job's. `text` writes tasks per
    node as Slurm does (slurm.tasks_per_node_text: slurm.py imports this module)."""
    env = {"SLURM_HET_SIZE": str(len(groups))}
    for g in groups:
        n = g.index
        nodelist = ",".join(g.nodes)
        env.update(
            {
                f"SLURM_JOB_ID_HET_GROUP_{n}": job_id,
                f"SLURM_JOB_NODELIST_HET_GROUP_{n}": nodelist,
                f"SLURM_NODELIST_HET_GROUP_{n}": nodelist,
                f"SLURM_JOB_NUM_NODES_HET_GROUP_{n}": str(len(g.nodes)),
                f"SLURM_NNODES_HET_GROUP_{n}": str(len(g.nodes)),
                f"SLURM_NTASKS_HET_GROUP_{n}": str(g.ntasks),
                f"SLURM_NPROCS_HET_GROUP_{n}": str(g.ntasks),
                f"SLURM_NTASKS_PER_NODE_HET_GROUP_{n}": str(g.ntasks_per_node),
                f"SLURM_TASKS_PER_NODE_HET_GROUP_{n}": text([g.ntasks_per_node] * len(g.nodes)),
            }
        )
        if g.cpus_per_task:
            env[f"SLURM_CPUS_PER_TASK_HET_GROUP_{n}"] = str(g.cpus_per_task)
    return env


def parse_het_group(option: str, text: str) -> tuple[int, ...]:
    """srun's --het-group=N, N,M or N-M (sorted, each once); the job's components are checked by the server."""
    out: set[int] = set()
    for item in text.split(","):
        low, dash, high = item.partition("-")
        if not (low.isascii() and low.isdigit()) or (dash and not (high.isascii() and high.isdigit())):
            raise HetGroupError(f"srun: error: {option}: expected a component number, a list or a range (0, 0,1, 0-2)")
        first, last = int(low), int(high) if dash else int(low)
        if last < first:
            raise HetGroupError(f"srun: error: {option}: the range {item} runs backwards")
        out.update(range(first, last + 1))
    return tuple(sorted(out))


def check_het_groups(option: str, asked: tuple[int, ...], job_id: str | None, components: int) -> None:
    """A component the job does not have is refused, naming the ones it has."""
    missing = [n for n in asked if n >= components]
    if missing:
        job = f"job {job_id}" if job_id else "this batch job"
        raise HetGroupError(
            f"srun: error: {option}: {job} has no component {missing[0]} (its components are 0-{components - 1}, "
            "one per #SBATCH hetjob part)"
        )
