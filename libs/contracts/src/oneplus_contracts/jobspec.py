"""The one job spec every input format is translated into.

A job is one gang of identical ranks; each rank asks for GPUs (whole or a fraction),
CPU and memory. Unknown fields are an error, never silently dropped.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic.config import JsonDict

from .arrays import ArrayTask, JobArray
from .features import parse_constraint

SCHEMA_VERSION = "1"

# A level of the site's topology tree, named bottom-up by the site: `node`, `nvlink`, `leaf`, `spine` and `cluster`
# always mean what they say; others (`block`, `rack`, `zone`, ...) are the site's own. Which names a cluster has is
# checked at submission, against its nodes (`oneplus_placement` refuses a level the cluster does not define).
LEVEL_NAME = r"^[a-z][a-z0-9_-]{0,31}$"
Domain = Annotated[str, Field(pattern=LEVEL_NAME)]
WELL_KNOWN_LEVELS = ("node", "nvlink", "leaf", "spine", "cluster")
ConstraintMode = Literal["required", "preferred"]
RestartPolicy = Literal["Never", "OnFailure", "Always"]
PullPolicy = Literal["Always", "IfNotPresent", "Never"]
# Whose conventions a job's ranks follow: the executor adds that framework's variables (PET_* for torchrun).
Framework = Literal["pytorchjob", "trainjob", "mpijob", "sbatch"]

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_HOST_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")


def host_names(field: str, v: object) -> list[str]:
    """A list of node names, or a Slurm hostlist ('gpu[01-04],cpu1') expanded; a malformed name is refused."""
    if isinstance(v, str):
        from .slurm import expand_hostlist  # here: slurm.py imports events, which imports this module

        try:
            v = expand_hostlist(v)
        except ValueError as exc:
            raise ValueError(f"{field}: {exc}") from None
    if not isinstance(v, list):
        raise ValueError(f"{field} must be a hostlist or a list of node names")
    for name in v:
        if not isinstance(name, str) or not _HOST_RE.match(name):
            raise ValueError(f"{field}: {name!r} is not a node name (letters, digits, '.', '_', '-')")
    return list(dict.fromkeys(v))


# A MIG profile as NVIDIA names it: optional compute-instance part, GPU-instance slices, memory (3g.40gb, 1g.10gb+me).
MIG_PROFILE_RE = re.compile(r"^(\d+c\.)?\d+g\.\d+gb(\+\w+)?$")
# The share CPU-only jobs are given (oneplus_jobformats.gang.CPU_ONLY_GPU_SHARE): not a GPU tenant to isolate.
CPU_ONLY_MILLI = 1


def is_isolated_share(gpu_milli: int) -> bool:
    return gpu_milli > CPU_ONLY_MILLI


_SIGNALS = {"SIGUSR1", "SIGUSR2", "SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGKILL", "SIGCONT"}


class Strict(BaseModel):
    """Base for every contract: unknown fields are rejected by name."""

    model_config = ConfigDict(extra="forbid", frozen=False, populate_by_name=True)


def _gpus_or_mig(schema: JsonDict) -> None:
    # A rank asks `gpus` or `mig` (which implies one unit): the schema says so instead of requiring `gpus`.
    schema.pop("required", None)
    schema["oneOf"] = [{"required": ["gpus"]}, {"required": ["mig"]}]


class RankResources(Strict):
    """What one rank of the gang asks for."""

    model_config = ConfigDict(**Strict.model_config, json_schema_extra=_gpus_or_mig)

    gpus: Annotated[float, Field(gt=0, le=64, description="GPUs per rank; a value below 1 is a share of one GPU")]
    cpus: Annotated[float, Field(gt=0, le=1024, description="CPUs reserved for the rank (a request)")] = 1.0
    memory_mb: Annotated[int, Field(gt=0, le=16 * 1024 * 1024, description="MiB reserved (a request)")] = 1024
    cpu_limit: Annotated[float, Field(gt=0, le=1024)] | None = Field(
        default=None, description="CPUs the rank may use at most (a limit); null: no cap beyond its node's cpuset"
    )
    memory_limit_mb: Annotated[int, Field(gt=0, le=16 * 1024 * 1024)] | None = Field(
        default=None, description="MiB the rank may use at most (a limit); null: no cap"
    )
    gpu_models: list[str] | None = Field(
        default=None,
        description="Allowed GPU models (substring match on the device name), e.g. ['H100']; a gang of several nodes "
        "keeps to one GPU model unless this lists several (or its queue sets mix_gpu_models)",
    )
    gpu_memory_mb: Annotated[int, Field(gt=0, le=4 * 1024 * 1024)] | None = Field(
        default=None,
        description="GPU memory (MiB) a GPU share may pin, as openb pods carry it: its MPS limit "
        "(CUDA_MPS_PINNED_DEVICE_MEM_LIMIT); only with gpus below 1",
    )
    mig: str | None = Field(
        default=None,
        description="One MIG instance of this profile a rank (e.g. 3g.40gb) instead of `gpus`; never with `gpus`",
    )

    @model_validator(mode="before")
    @classmethod
    def _mig_or_gpus(cls, data: object) -> object:
        # A MIG rank holds one instance: counted as one GPU unit, and `gpus` is neither asked nor written back.
        if isinstance(data, dict) and data.get("mig") is not None:
            if "gpus" in data:
                raise ValueError(
                    f"mig={data['mig']!r} together with gpus={data['gpus']!r}: a rank asks one MIG instance or GPUs, "
                    "not both; drop gpus"
                )
            return {**data, "gpus": 1}
        return data

    @model_serializer(mode="wrap")
    # No return annotation: pydantic then keeps one schema for input and output (no JobSpec-Input/-Output split).
    def _without_implied_gpus(self, handler: SerializerFunctionWrapHandler):  # type: ignore[no-untyped-def]
        data = handler(self)
        if isinstance(data, dict):
            if self.mig is not None:
                data.pop("gpus", None)
            # Unset, the newer keys are left out: every stored record stays as small as before them.
            for key in ("mig", "gpu_memory_mb"):
                if data.get(key, 0) is None:
                    data.pop(key)
        return data

    @model_validator(mode="after")
    def _memory_of_a_share(self) -> RankResources:
        if self.gpu_memory_mb is not None and (self.gpus >= 1 or self.mig is not None):
            what = f"mig={self.mig!r}" if self.mig is not None else f"gpus={self.gpus:g}"
            raise ValueError(
                f"gpu_memory_mb={self.gpu_memory_mb} is the memory of a GPU share: it needs gpus below 1, not {what}"
            )
        return self

    @field_validator("mig")
    @classmethod
    def _mig_profile(cls, v: str | None) -> str | None:
        if v is not None and not MIG_PROFILE_RE.match(v):
            raise ValueError(f"mig={v!r} is not a MIG profile name such as 3g.40gb or 1g.10gb")
        return v

    @field_validator("gpus")
    @classmethod
    def _whole_or_share(cls, v: float) -> float:
        if v > 1 and v != int(v):
            raise ValueError(f"gpus={v}: more than one GPU must be a whole number")
        if v < 1 and round(v * 1000) < 1:
            raise ValueError(f"gpus={v}: a GPU share must be at least 0.001")
        return v

    @property
    def whole_gpus(self) -> int:
        return int(self.gpus) if self.gpus >= 1 else 0

    @property
    def gpu_milli(self) -> int:
        """A share in thousandths of one GPU; 0 for whole-GPU ranks."""
        return 0 if self.gpus >= 1 else round(self.gpus * 1000)

    @property
    def isolated_share(self) -> bool:
        """A GPU share that runs under MPS (or in a time-slicing queue): every share above the 0.001 that CPU-only
        jobs are given (they do no GPU work to isolate)."""
        return is_isolated_share(self.gpu_milli)


def _unset(value: object) -> bool:
    """Fields added after a record shape was published are left out of its JSON while unset: every stored record and
    every finished job kept in memory (as its JSON) would otherwise carry their nulls."""
    return value is None or (isinstance(value, list) and not value)


class TopologyConstraint(Strict):
    """Where the gang may be placed.

    `domain` keeps all ranks inside one domain of a level of the site (`node`, `nvlink`, `leaf`, `spine`, or the
    site's own, e.g. `rack`; `required` refuses to place otherwise, `preferred` only scores). `group_gpus` asks that
    each consecutive group of K GPUs (a tensor-parallel group) sits inside one NVLink domain; a group larger than a
    rank spans ranks, and those ranks stay inside one domain of `group_domain` (default `nvlink`: one node's NVLink,
    or a multi-node NVLink domain such as a GB200 NVL72 rack), as Kueue's podset slices and Slurm's --segment do.
    `max_leaves` is Slurm's --switches. `nodes` is Slurm's --nodes: exactly that many distinct nodes, the ranks
    spread evenly over them (ranks / nodes on each; TP groups then stay inside each node's share).
    """

    domain: Domain | None = None
    mode: ConstraintMode = "preferred"
    group_gpus: Annotated[int, Field(gt=0)] | None = None
    group_domain: Domain | None = Field(
        default=None,
        exclude_if=_unset,
        description="The level each group of group_gpus GPUs stays inside when it spans ranks (default nvlink)",
    )
    max_leaves: Annotated[int, Field(gt=0)] | None = None
    exclusive: bool = False
    nodes: Annotated[int, Field(gt=0, le=4096)] | None = Field(
        default=None,
        exclude_if=_unset,
        description="Exactly this many distinct nodes, ranks / nodes ranks on each (Slurm --nodes)",
    )


class CheckpointPolicy(Strict):
    signal: str = "SIGUSR1"
    grace_s: Annotated[int, Field(ge=0, le=24 * 3600)] = 120
    interval_s: Annotated[int, Field(gt=0)] | None = None
    marker_path: str | None = Field(default=None, description="File the job writes when its checkpoint is done")

    @field_validator("signal")
    @classmethod
    def _known_signal(cls, v: str) -> str:
        s = v.upper()
        if not s.startswith("SIG"):
            s = "SIG" + s
        if s not in _SIGNALS:
            raise ValueError(f"unknown checkpoint signal {v!r}; use one of {sorted(_SIGNALS)}")
        return s


class SimulatedRun(Strict):
    """For the simulated runtime (demo, simulator, tests): how the job behaves."""

    duration_s: Annotated[float, Field(ge=0, le=7 * 24 * 3600)] = 1.0
    exit_code: int = 0
    checkpoint_after_s: Annotated[float, Field(ge=0)] | None = Field(
        default=0.2, description="Seconds the job takes to write its checkpoint after the signal; null: never"
    )


class SlurmBatch(Strict):
    """A Slurm batch job (framework "sbatch"): its script runs once, on the node of rank 0, with the Slurm batch
    environment; `srun` in it starts step tasks on the job's nodes. What the batch environment needs:"""

    job_name: str = Field(description="SLURM_JOB_NAME: the name as given to sbatch")
    ntasks: Annotated[int, Field(ge=1)] = Field(description="SLURM_NTASKS: tasks of the allocation")
    ntasks_per_node: Annotated[int, Field(ge=1)] = Field(description="SLURM_NTASKS_PER_NODE; what one step may use")
    cpus_per_task: Annotated[int, Field(ge=1)] | None = Field(default=None, description="SLURM_CPUS_PER_TASK")
    submit_dir: str | None = Field(default=None, description="SLURM_SUBMIT_DIR: where sbatch ran")
    partition: str | None = Field(default=None, description="SLURM_JOB_PARTITION: as given to sbatch")
    account: str | None = Field(default=None, description="SLURM_JOB_ACCOUNT: as given to sbatch")


DependencyType = Literal["after", "afterok", "afterany", "afternotok", "aftercorr"]


class Dependency(Strict):
    """Slurm's `--dependency=TYPE:ID[:ID...]`: start after the named OnePlus jobs started (`after`), succeeded
    (`afterok`), ended (`afterany`) or failed or were cancelled (`afternotok`). An id may name an array (all of its
    tasks) or one task (`j-abc_7`); `aftercorr` (arrays only) waits for the task of the same id of the named array
    to succeed."""

    type: DependencyType
    job_ids: Annotated[list[str], Field(min_length=1)]


MpiImplementation = Literal["OpenMPI", "Intel", "MPICH"]


class MpiLauncher(Strict):
    """An MPIJob's Launcher (mpi-operator v2): one more container on the job's first node, started once every worker
    rank runs, with the workers in /etc/mpi/hostfile; the job ends when it ends (the workers are then stopped)."""

    image: str | None = Field(default=None, description="The launcher's image; null: the job's image")
    entrypoint: list[str] | None = Field(default=None, description="Kubernetes `command` of the launcher")
    command: list[str] = Field(default_factory=list, description="Kubernetes `args` of the launcher")
    env: dict[str, str] = Field(default_factory=dict)
    slots_per_worker: Annotated[int, Field(ge=1, le=4096)] = Field(
        default=1, description="slotsPerWorker: the `slots=` of each worker in the hostfile"
    )
    implementation: MpiImplementation = Field(
        default="OpenMPI", description="mpiImplementation: the hostfile's form and the variables the launcher gets"
    )


class HetSlurm(Strict):
    """A heterogeneous job component's Slurm allocation: what its `_HET_GROUP_<n>` variables and steps need."""

    ntasks: Annotated[int, Field(ge=1)] = Field(description="SLURM_NTASKS_HET_GROUP_<n>: tasks of the component")
    ntasks_per_node: Annotated[int, Field(ge=1)] = Field(description="Tasks per node a step of the component may use")
    cpus_per_task: Annotated[int, Field(ge=1)] | None = Field(default=None, exclude_if=_unset)


class HetComponent(Strict):
    """One component of a heterogeneous job (Slurm `#SBATCH hetjob`, `sbatch a : b`): its ranks, what each asks
    and where they go. The job's gang is its components' ranks in order (component 0's first); all are placed at
    once or none, each component on nodes of its own."""

    ranks: Annotated[int, Field(ge=1, le=4096)]
    resources: RankResources
    topology: TopologyConstraint = Field(default_factory=TopologyConstraint)
    slurm: HetSlurm | None = Field(default=None, exclude_if=_unset)
    nodelist: list[str] = Field(
        default_factory=list, exclude_if=_unset, description="Slurm --nodelist of this component (beside the job's)"
    )
    constraint: str | None = Field(
        default=None, exclude_if=_unset, description="Slurm --constraint of this component (instead of the job's)"
    )

    @field_validator("nodelist", mode="before")
    @classmethod
    def _nodelist(cls, v: object) -> object:
        return host_names("nodelist", v)

    @field_validator("constraint")
    @classmethod
    def _readable_constraint(cls, v: str | None) -> str | None:
        return None if v is None else parse_constraint(v).text


class ElasticRange(Strict):
    """An elastic gang (PyTorchJob elasticPolicy, TrainJob's torch elasticPolicy): it starts with the most ranks
    between min_ranks and max_ranks that fit, grows when GPUs free up and shrinks toward min_ranks instead of being
    preempted whole; each change is a rendezvous restart from its checkpoint (torchrun's PET_NNODES=min:max)."""

    min_ranks: Annotated[int, Field(ge=1, le=4096)]
    max_ranks: Annotated[int, Field(ge=1, le=4096)]

    @model_validator(mode="after")
    def _ordered(self) -> ElasticRange:
        if self.min_ranks > self.max_ranks:
            raise ValueError(f"elastic.min_ranks={self.min_ranks} is more than max_ranks={self.max_ranks}")
        return self


class JobSpec(Strict):
    schema_version: Literal["1"] = "1"
    name: str
    team: str = "default"
    user: str = "unknown"
    queue: str = "default"
    priority: Annotated[int, Field(ge=0, le=1_000_000)] = 0
    priority_class: str | None = None
    preemptible: bool = True
    ranks: Annotated[int, Field(ge=1, le=4096)] = 1
    resources: RankResources
    topology: TopologyConstraint = Field(default_factory=TopologyConstraint)
    checkpoint: CheckpointPolicy = Field(default_factory=CheckpointPolicy)
    image: str = "localhost/busybox:latest"
    entrypoint: list[str] | None = Field(
        default=None,
        description="Replaces the image's ENTRYPOINT (Kubernetes `command`); [] clears it; null keeps the image's",
    )
    command: list[str] = Field(
        default_factory=list, description="The image's CMD replaced (Kubernetes `args`); empty keeps the image's"
    )
    framework: Framework | None = Field(
        default=None, description="Whose rank environment to add (pytorchjob/trainjob: torchrun's PET_* variables)"
    )
    slurm: SlurmBatch | None = Field(
        default=None, description="A Slurm batch job's allocation (framework 'sbatch'): batch environment and srun"
    )
    env: dict[str, str] = Field(default_factory=dict)
    time_limit_s: Annotated[int, Field(gt=0)] | None = None
    min_runtime_s: Annotated[int, Field(ge=0)] = 0
    restart_policy: RestartPolicy = "Never"
    pull_policy: PullPolicy = "IfNotPresent"
    labels: dict[str, str] = Field(default_factory=dict)
    simulate: SimulatedRun | None = None
    dependencies: list[Dependency] = Field(default_factory=list, description="Slurm --dependency, all must hold")
    dependency_any: bool = Field(default=False, description="Slurm's '?' form: any one dependency is enough")
    singleton: bool = Field(default=False, description="Slurm singleton: one running job per (name, user)")
    constraint: str | None = Field(
        default=None, description="Slurm --constraint over node features, e.g. 'h100', 'a100|h100', '[a|b]'"
    )
    launcher: MpiLauncher | None = Field(
        default=None, description="MPIJob: the launcher that runs mpirun once the workers (the ranks) are up"
    )
    array: JobArray | None = Field(
        default=None,
        exclude_if=_unset,
        description="Slurm --array: one job per task id, '0-999%50' or {indices, max_running}; expanded on acceptance",
    )
    array_task: ArrayTask | None = Field(
        default=None,
        exclude_if=_unset,
        description="Set on each task of an array (by its expansion): its id and its array's",
    )
    nodelist: list[str] = Field(
        default_factory=list,
        exclude_if=_unset,
        description="Slurm --nodelist: the only nodes the job may use (names or a hostlist 'gpu[1-4]'); empty: any",
    )
    exclude_nodes: list[str] = Field(
        default_factory=list,
        exclude_if=_unset,
        description="Slurm --exclude: nodes the job must not use (names or a hostlist)",
    )
    begin_at: Annotated[float, Field(ge=0)] | None = Field(
        default=None, exclude_if=_unset, description="Slurm --begin: not placed before this time (Unix seconds)"
    )
    reservation: str | None = Field(
        default=None,
        exclude_if=_unset,
        description="Slurm --reservation: run only inside this advance reservation, while it is active",
    )

    components: list[HetComponent] | None = Field(
        default=None,
        exclude_if=_unset,
        description="A heterogeneous job's components (Slurm hetjob), two or more: `ranks` is their sum, `resources` "
        "and `topology` are component 0's; placed as one gang, all or nothing",
    )
    elastic: ElasticRange | None = Field(
        default=None,
        exclude_if=_unset,
        description="An elastic gang: it runs with any rank count from min_ranks to max_ranks (ranks is the count it "
        "asks or runs with now); null: exactly `ranks`",
    )

    @field_validator("nodelist", mode="before")
    @classmethod
    def _nodelist(cls, v: object) -> object:
        return host_names("nodelist", v)

    @field_validator("exclude_nodes", mode="before")
    @classmethod
    def _exclude(cls, v: object) -> object:
        return host_names("exclude_nodes", v)

    @field_validator("array", mode="before")
    @classmethod
    def _array_text(cls, v: object) -> object:
        if isinstance(v, str | int):
            return JobArray.parse(str(v))  # an ArrayError is a ValueError: refused with its message
        return v

    @field_validator("constraint")
    @classmethod
    def _readable_constraint(cls, v: str | None) -> str | None:
        if v is None:
            return None
        return parse_constraint(v).text  # a ConstraintError is a ValueError: the spec is refused with its message

    @field_validator("name", "team", "queue")
    @classmethod
    def _dns_like(cls, v: str) -> str:
        if not _NAME_RE.match(v):
            raise ValueError(f"{v!r} must be 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit")
        return v

    @model_validator(mode="after")
    def _coherent(self) -> JobSpec:
        if self.components is not None:
            return self._coherent_het()
        if self.resources.mig is not None and self.topology.group_gpus:
            raise ValueError(
                f"group_gpus={self.topology.group_gpus} with mig={self.resources.mig!r}: "
                "MIG instances have no NVLink between them and never form a tensor-parallel group"
            )
        if self.resources.gpus < 1 and self.ranks > 1 and self.topology.group_gpus:
            raise ValueError("group_gpus needs whole-GPU ranks")
        if self.topology.group_gpus and self.resources.gpus >= 1:
            g = self.topology.group_gpus
            per_rank = int(self.resources.gpus)
            if g % per_rank and per_rank % g:
                raise ValueError(f"group_gpus={g} must divide or be a multiple of gpus per rank ({per_rank})")
        nodes = self.topology.nodes
        if nodes is not None and nodes > self.ranks:
            raise ValueError(f"topology.nodes={nodes} is more nodes than ranks ({self.ranks}): each node needs a rank")
        if nodes is not None and self.ranks % nodes:
            raise ValueError(
                f"topology.nodes={nodes} does not divide ranks={self.ranks}: ranks spread evenly over nodes"
            )
        if self.topology.group_domain is not None and not self.topology.group_gpus:
            raise ValueError(f"group_domain={self.topology.group_domain!r} needs group_gpus (the group it keeps whole)")
        if self.topology.group_domain == "cluster":
            raise ValueError("group_domain='cluster' keeps nothing together; name a level such as nvlink or leaf")
        if self.launcher is not None and self.framework != "mpijob":
            raise ValueError("a launcher is an MPIJob's (framework mpijob)")
        if self.array is not None and self.array_task is not None:
            raise ValueError("array (a whole array) and array_task (one of its tasks) cannot both be set")
        if self.array is None and any(d.type == "aftercorr" for d in self.dependencies):
            raise ValueError("aftercorr is for job arrays: each task waits for the task of its id (use --array)")
        if self.slurm is not None and self.framework != "sbatch":
            raise ValueError("slurm (a batch allocation) is an sbatch job's (framework sbatch)")
        both = sorted(set(self.nodelist) & set(self.exclude_nodes))
        if both:
            raise ValueError(f"node {both[0]!r} is both in nodelist and exclude_nodes")
        e = self.elastic
        if e is not None and not e.min_ranks <= self.ranks <= e.max_ranks:
            raise ValueError(f"ranks={self.ranks} is outside elastic {e.min_ranks}..{e.max_ranks}")
        if e is not None and nodes is not None:
            raise ValueError("topology.nodes fixes the node count; an elastic job's count changes (drop one of them)")
        r = self.resources
        if r.cpu_limit is not None and r.cpus > r.cpu_limit:
            raise ValueError(f"cpus={r.cpus:g} (the request) is more than cpu_limit={r.cpu_limit:g}")
        if r.memory_limit_mb is not None and r.memory_mb > r.memory_limit_mb:
            raise ValueError(f"memory_mb={r.memory_mb} (the request) is more than memory_limit_mb={r.memory_limit_mb}")
        return self

    def _coherent_het(self) -> JobSpec:
        """A heterogeneous job: each component is checked as a job of its own; the job's own fields mirror them."""
        parts = self.components or []
        if len(parts) < 2:
            raise ValueError(f"components: a heterogeneous job has two or more components, not {len(parts)}")
        if self.ranks != sum(c.ranks for c in parts):
            raise ValueError(
                f"ranks={self.ranks} is not the components' ranks ({'+'.join(str(c.ranks) for c in parts)})"
            )
        if self.resources != parts[0].resources or self.topology != parts[0].topology:
            raise ValueError("resources and topology of a heterogeneous job are its component 0's")
        if self.nodelist or self.constraint:
            raise ValueError("a heterogeneous job's nodelist and constraint are its components' (components[n])")
        if self.launcher is not None or self.array is not None or self.array_task is not None:
            raise ValueError("a heterogeneous job cannot be an MPIJob or a job array")
        if self.elastic is not None:
            # One rank count per component is what the _HET_GROUP_ variables and the gang's shape are built from.
            raise ValueError("a heterogeneous job cannot be elastic: its components' rank counts are fixed")
        for n, spec in enumerate(self.component_specs()):
            try:
                JobSpec.model_validate(spec.model_dump())
            except ValueError as exc:
                raise ValueError(f"components[{n}]: {_first_error(exc)}") from None
        return self

    def component_specs(self) -> list[JobSpec]:
        """Each component as a job of its own (the job itself when it has none): what placement places."""
        if self.components is None:
            return [self]
        out: list[JobSpec] = []
        for c in self.components:
            slurm = self.slurm
            if slurm is not None and c.slurm is not None:
                own = c.slurm
                slurm = slurm.model_copy(
                    update={
                        "ntasks": own.ntasks,
                        "ntasks_per_node": own.ntasks_per_node,
                        "cpus_per_task": own.cpus_per_task,
                    }
                )
            out.append(
                self.model_copy(
                    update={
                        "ranks": c.ranks,
                        "resources": c.resources,
                        "topology": c.topology,
                        "slurm": slurm,
                        "nodelist": list(c.nodelist),
                        "constraint": c.constraint,
                        "components": None,
                    }
                )
            )
        return out

    def component_offsets(self) -> list[int]:
        """The first rank of each component ([0] for a job of one)."""
        starts = [0]
        for c in (self.components or [])[:-1]:
            starts.append(starts[-1] + c.ranks)
        return starts

    def component_of(self, rank: int) -> int:
        """Which component rank `rank` belongs to (0 for a job of one)."""
        n = 0
        for i, start in enumerate(self.component_offsets()):
            if rank >= start:
                n = i
        return n

    def rank_resources(self, rank: int) -> RankResources:
        """What rank `rank` asks for: its component's resources."""
        if self.components is None:
            return self.resources
        return self.components[self.component_of(rank)].resources

    @property
    def total_gpus(self) -> float:
        if self.components is not None:
            return sum(c.ranks * c.resources.gpus for c in self.components)
        return self.ranks * self.resources.gpus


def _first_error(exc: ValueError) -> str:
    """A pydantic error's first message, without its location header (a component's own check, said once)."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        first = errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        msg = str(first.get("msg", exc)).removeprefix("Value error, ")
        return f"{where}: {msg}" if where else msg
    return str(exc)
