"""A job spec reduced to the numbers placement works with: a gang of units of GPUs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from oneplus_contracts import JobSpec
from oneplus_contracts.features import FeatureConstraint, parse_constraint

from .hosts import HostFilter

# The levels of a cluster that names no others (the default when a caller has no layout to ask).
DOMAINS: tuple[str, ...] = ("node", "leaf", "spine", "cluster")


def _allows_mixing(spec: JobSpec) -> bool:
    """The job itself names alternatives per node: several GPU models, or a plain OR of features (Slurm `a|b`; the
    matching OR `[a|b]` keeps one)."""
    if spec.resources.gpu_models and len(spec.resources.gpu_models) > 1:
        return True
    if spec.constraint:
        features = parse_constraint(spec.constraint)
        return not features.matching and len(features.any_of) > 1
    return False


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
    domain: str | None
    required: bool
    max_leaves: int | None
    exclusive: bool
    features: FeatureConstraint | None = None  # Slurm --constraint: the node features every node must satisfy
    # A gang that gains nothing from a fast board (one GPU, or a ring the network bounds) takes the weakest kind.
    keep_strong_boards: bool = True
    # Slurm --nodes: each unit (ranks / nodes ranks) on a node of its own, so the gang takes exactly `units` nodes.
    spread: bool = False
    # One GPU model (a node's exact model name) for every node of the gang; None: not chosen yet.
    kind: str | None = None
    # A synchronous gang runs at its slowest rank: its nodes share one GPU model unless the job or queue allows mixing.
    one_kind: bool = True
    # The level a tensor-parallel group that spans ranks stays inside (None: the default, nvlink).
    group_domain: str | None = None
    # Set by `on_layout` when such a group may span nodes: each `segment` consecutive units (ranks) stay inside one
    # domain of `segment_level`; a node alone in its domain hosts whole groups of `tp` GPUs, as without segments.
    segment: int = 1
    segment_level: str | None = None
    tp: int = 1
    # Slurm --nodelist/--exclude: the nodes the gang may use; None: any node.
    hosts: HostFilter | None = None
    # GPU memory (MiB) each share pins on its GPU: a share fits only where the GPU's memory left holds it.
    gpu_memory_mb: int | None = None

    @classmethod
    def of(cls, spec: JobSpec) -> GangRequest:
        if spec.components is not None:
            # A heterogeneous job is placed component by component (hetjob.py); as one request (counting, eligibility,
            # preemption's levels) it is its largest component: never more than the job needs.
            return cls.of(max(spec.component_specs(), key=lambda part: (part.total_gpus, part.ranks)))
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
        nodes = spec.topology.nodes
        if nodes is not None:
            per_node = spec.ranks // nodes
            if per_node % per_unit:
                raise InvalidRequest(
                    f"topology.nodes={nodes} puts {per_node} ranks on each node, which do not make whole "
                    f"tensor-parallel groups of {per_unit} ranks"
                )
            per_unit = per_node
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
            spread=nodes is not None,
            one_kind=not _allows_mixing(spec),
            group_domain=spec.topology.group_domain,
            hosts=HostFilter.of(spec),
            gpu_memory_mb=res.gpu_memory_mb if res.gpu_milli else None,
        )

    def on_layout(self, level_names: Sequence[str], multi_node: bool) -> GangRequest:
        """This request as a cluster with these levels places it: a tensor-parallel group that spans ranks becomes a
        segment of ranks inside one domain of its group level (`nvlink` by default) when that level's domains may
        span nodes (`multi_node`: some domain of it holds several nodes); otherwise it stays one unit on one node.
        A spread gang (--nodes) keeps its units as they are: each is one node's whole share, TP groups inside it."""
        if self.ranks_per_unit == 1 or self.segment > 1 or self.spread:
            return self
        level = self.group_domain or "nvlink"
        if level == "node" or level not in level_names or not multi_node:
            return self
        return replace(
            self,
            ranks_per_unit=1,
            group=self.gpus_per_rank,
            segment=self.ranks_per_unit,
            segment_level=level,
            tp=self.group,
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
            self.kind,
            self.features,
            self.hosts,
            self.unit_gpus,
            self.group,
            self.milli,
            self.gpu_memory_mb,
            self.unit_cpus,
            self.unit_memory_mb,
            self.exclusive,
            self.spread,
            self.segment,
            self.segment_level,
            self.tp,
        )

    @property
    def segment_gpus(self) -> int:
        """GPUs of one tensor-parallel group that must stay inside one domain (0 without segments)."""
        return self.segment * self.gpus_per_rank if self.segment > 1 else 0

    def levels(self, names: Sequence[str] = DOMAINS) -> tuple[str, ...]:
        """The levels to try, tightest first, of a cluster whose levels are `names`; a required domain is the widest
        allowed (a level the cluster lacks is refused before this is asked: `diagnosis.static_reason`)."""
        names = tuple(names)
        if self.domain is not None and self.required and self.domain in names:
            return names[: names.index(self.domain) + 1]
        return names

    @property
    def must_choose_kind(self) -> bool:
        """Whether the gang must keep to one GPU model but has not been given one yet (it may span nodes)."""
        return self.one_kind and self.kind is None and self.units > 1

    def describe(self) -> str:
        if self.shared:
            what = f"{self.ranks} x {self.milli / 1000:g} GPU share" if self.ranks > 1 else f"{self.milli / 1000:g} GPU"
        elif self.ranks == 1:
            what = f"{self.gpus_per_rank} GPU{'s' if self.gpus_per_rank > 1 else ''}"
        else:
            what = f"{self.ranks * self.gpus_per_rank} GPUs ({self.ranks} ranks x {self.gpus_per_rank})"
        if self.spread and self.units > 1:
            what += f" on {self.units} distinct nodes"
        return what
