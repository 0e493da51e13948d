"""A job spec reduced to the numbers placement works with: a gang of units of GPUs."""

from __future__ import annotations

from dataclasses import dataclass

from oneplus_contracts import Domain, JobSpec
from oneplus_contracts.features import FeatureConstraint, parse_constraint

DOMAINS: tuple[Domain, ...] = ("node", "leaf", "spine", "cluster")


class InvalidRequest(ValueError):
    """The spec cannot be placed on any cluster as written (e.g. ranks that do not fill whole TP groups)."""


@dataclass(frozen=True)
class GangRequest:
    """`ranks` ranks of `gpus_per_rank` whole GPUs (or one `milli` share each); ranks move in units.

    A unit is one rank, or, when a tensor-parallel group spans ranks, the `ranks_per_unit` ranks of one group:
    a unit's GPUs always land on one node and, with `group` > 1, split into NVLink-domain groups of `group` GPUs.
    """

    ranks: int
    gpus_per_rank: int
    milli: int
    cpus: float
    memory_mb: int
    models: tuple[str, ...] | None
    group: int
    ranks_per_unit: int
    domain: Domain | None
    required: bool
    max_leaves: int | None
    exclusive: bool
    features: FeatureConstraint | None = None  # Slurm --constraint: the node features every node must satisfy
    # A gang that gains nothing from a fast board (one GPU, or a ring the network bounds) takes the weakest kind.
    keep_strong_boards: bool = True

    @classmethod
    def of(cls, spec: JobSpec) -> GangRequest:
        res = spec.resources
        k = res.whole_gpus
        group = spec.topology.group_gpus or 1
        per_unit = 1
        if k and group > k:
            per_unit = group // k
            if spec.ranks % per_unit:
                raise InvalidRequest(
                    f"group_gpus={group} spans {per_unit} ranks of {k} GPUs, but {spec.ranks} ranks do not make "
                    f"whole groups; use a multiple of {per_unit} ranks"
                )
        return cls(
            ranks=spec.ranks,
            gpus_per_rank=k,
            milli=res.gpu_milli,
            cpus=res.cpus,
            memory_mb=res.memory_mb,
            models=tuple(res.gpu_models) if res.gpu_models else None,
            group=group if k else 1,
            ranks_per_unit=per_unit,
            domain=spec.topology.domain,
            required=spec.topology.mode == "required",
            max_leaves=spec.topology.max_leaves,
            exclusive=spec.topology.exclusive,
            features=parse_constraint(spec.constraint) if spec.constraint else None,
        )

    @property
    def shared(self) -> bool:
        return self.milli > 0

    @property
    def unit_gpus(self) -> int:
        return self.gpus_per_rank * self.ranks_per_unit

    @property
    def units(self) -> int:
        return self.ranks // self.ranks_per_unit

    @property
    def unit_cpus(self) -> float:
        return self.cpus * self.ranks_per_unit

    @property
    def unit_memory_mb(self) -> int:
        return self.memory_mb * self.ranks_per_unit

    @property
    def total_gpus(self) -> float:
        return self.ranks * (self.gpus_per_rank or self.milli / 1000)

    @property
    def capacity_key(self) -> tuple[object, ...]:
        """Requests with equal keys see the same per-node capacity (a batch shares the work between them)."""
        return (
            self.models,
            self.features,
            self.unit_gpus,
            self.group,
            self.milli,
            self.unit_cpus,
            self.unit_memory_mb,
            self.exclusive,
        )

    def levels(self) -> tuple[Domain, ...]:
        """The domains to try, tightest first; a required domain is the widest allowed."""
        if self.domain is not None and self.required:
            return DOMAINS[: DOMAINS.index(self.domain) + 1]
        return DOMAINS

    def describe(self) -> str:
        if self.shared:
            what = f"{self.ranks} x {self.milli / 1000:g} GPU share" if self.ranks > 1 else f"{self.milli / 1000:g} GPU"
        elif self.ranks == 1:
            what = f"{self.gpus_per_rank} GPU{'s' if self.gpus_per_rank > 1 else ''}"
        else:
            what = f"{self.ranks * self.gpus_per_rank} GPUs ({self.ranks} ranks x {self.gpus_per_rank})"
        return what
