"""Checks a job must pass before it is accepted, beyond its schema: queue, and whether it can ever fit."""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass

from oneplus_contracts import JobSpec, NodeRecord
from oneplus_contracts.slurm import compress_hostlist
from oneplus_placement.explain import explain_pending
from oneplus_placement.mig import cluster_profiles
from oneplus_placement.snapshot import ClusterSnapshot, ClusterState
from oneplus_queueing.config import QueueConfig, QueueConfigError
from oneplus_queueing.dependencies import MAX_CYCLE_WALK, dependency_cycle

VERDICTS_KEPT = 4096  # distinct job shapes remembered per cluster shape


class Inadmissible(ValueError):
    """The job can never run as asked; the message says why in terms the submitter can act on."""


NodeKey = tuple[
    bool,
    str,
    int,
    str,
    str | None,
    str | None,
    tuple[str, ...],
    str | None,
    tuple[tuple[str, str], ...],
    tuple[str, ...],
]


def admission_key(n: NodeRecord) -> NodeKey:
    """What admission reads of a node: lost or not, and its static shape (heartbeats change none of it), its levels
    included (a job naming a level the cluster lacks is refused)."""
    t = n.topology
    mig = tuple(m.uuid for g in t.gpus for m in g.mig_instances)
    features = (*t.features, *(["mps"] if t.mps else []))
    return (
        n.status == "lost",
        t.node,
        len(t.gpus),
        t.gpu_model,
        t.leaf,
        t.spine,
        features,
        t.nvlink_domain,
        tuple(t.levels.items()),
        mig,
    )


@dataclass(frozen=True)
class ClusterFacts:
    """What admission needs of the nodes, computed once per change of their shape, not once per submission."""

    live: tuple[NodeRecord, ...]
    total: int
    largest: int
    names: frozenset[str]  # GPU models and GPU names
    shape: tuple[NodeKey, ...]  # the live nodes' static shape, sorted: the empty cluster's identity
    mig_profiles: Counter[str]  # MIG instances of each profile on the live nodes
    mps_nodes: int  # live nodes that run MPS (isolated GPU shares)
    hosts: frozenset[str] = frozenset()  # every known node's name, lost ones too (--nodelist may name them)

    @classmethod
    def of(cls, nodes: Iterable[NodeRecord]) -> ClusterFacts:
        nodes = tuple(nodes)
        live = tuple(n for n in nodes if n.status != "lost")
        return cls(
            live,
            sum(len(n.topology.gpus) for n in live),
            max((len(n.topology.gpus) for n in live), default=0),
            frozenset({n.topology.gpu_model for n in live} | {g.name for n in live for g in n.topology.gpus}),
            tuple(sorted(admission_key(n) for n in live)),
            cluster_profiles(n.topology for n in live),
            sum(1 for n in live if n.topology.mps is not None),
            frozenset(n.topology.node for n in nodes),
        )


class EmptyCluster:
    """The live nodes as if every job had ended and every GPU were healthy: what a gang could ever get.

    Rebuilt only when the nodes' shape changes; verdicts are kept per job shape, so a burst of alike submissions
    costs one placement attempt, not one each."""

    def __init__(self) -> None:
        self._key: tuple[NodeKey, ...] | None = None
        self._state: ClusterState | None = None
        self._verdicts: dict[str, str | None] = {}

    def never_fits(
        self, spec: JobSpec, live: Sequence[NodeRecord] | ClusterFacts, *, mix_gpu_models: bool = False
    ) -> str | None:
        """Why `spec` could not be placed even on the empty cluster, or None when it could (`mix_gpu_models`: its
        queue lets a gang span GPU models)."""
        facts = live if isinstance(live, ClusterFacts) else ClusterFacts.of(live)
        key = facts.shape
        live = facts.live
        if key != self._key:
            healthy = [
                n.model_copy(
                    update={
                        "status": "ready",
                        "cordoned": False,
                        "draining": False,
                        "unhealthy_gpus": [],
                        "engine_ok": True,
                    }
                )
                for n in live
            ]
            self._state = ClusterSnapshot.from_records("empty", healthy).thaw()
            self._key, self._verdicts = key, {}
        what = {"ranks", "resources", "topology", "constraint", "nodelist", "exclude_nodes", "components"}
        shape = spec.model_dump_json(include=what) + str(mix_gpu_models)
        if shape not in self._verdicts:
            assert self._state is not None
            why = explain_pending(self._state.mutable_copy(), spec, mix_gpu_models=mix_gpu_models)
            verdict = None if why.constraint in ("none", "queue") else why.message
            if len(self._verdicts) >= VERDICTS_KEPT:
                self._verdicts.clear()
            self._verdicts[shape] = verdict
        return self._verdicts[shape]


def admit(
    spec: JobSpec,
    queues: QueueConfig,
    nodes: Sequence[NodeRecord] | ClusterFacts,
    empty: EmptyCluster | None = None,
) -> None:
    try:
        queues.validate_job(spec)
    except QueueConfigError as exc:
        raise Inadmissible(str(exc)) from exc
    if spec.elastic is not None:  # an elastic gang can run when its smallest size can; it grows as far as it fits
        spec = spec.model_copy(update={"ranks": spec.elastic.min_ranks})
    facts = nodes if isinstance(nodes, ClusterFacts) else ClusterFacts.of(nodes)
    live = facts.live
    if not live:
        return  # no node has reported yet: the job waits, `jobs explain` says why
    for field, hosts in (("--nodelist", spec.nodelist), ("--exclude", spec.exclude_nodes)):
        unknown = [n for n in hosts if n not in facts.hosts]
        if unknown:
            raise Inadmissible(
                f"{field} names node {unknown[0]!r}, which this cluster does not have (it has "
                f"{compress_hostlist(facts.hosts)})"
            )
    if spec.components is not None:
        _admit_het(spec, queues, facts, empty)
        return
    if spec.resources.mig is not None:
        _admit_mig(spec, facts)
        return
    if spec.resources.isolated_share and not facts.mps_nodes and spec.queue not in queues.timeslice_queues:
        raise Inadmissible(
            f"gpus={spec.resources.gpus:g} is a GPU share, which runs isolated under MPS, and no node runs MPS; "
            f"ask whole GPUs, or use a queue with sharing: time-slice (queue {spec.queue!r} has sharing: mps)"
        )
    total = facts.total
    if spec.total_gpus > total:
        raise Inadmissible(
            f"gang of {spec.total_gpus:g} GPUs ({spec.ranks} ranks x {spec.resources.gpus:g}) is larger than the "
            f"cluster ({total} GPUs on {len(live)} nodes)"
        )
    largest = facts.largest
    if spec.resources.gpus > largest:
        raise Inadmissible(
            f"a rank asks for {spec.resources.gpus:g} GPUs but the largest node has {largest}; "
            f"split the job into more ranks"
        )
    models = spec.resources.gpu_models
    if models:
        names = facts.names
        if not any(m.lower() in name.lower() for m in models for name in names):
            raise Inadmissible(f"no node has a GPU model matching {models}; the cluster has {sorted(names)}")
    if empty is not None:
        why = empty.never_fits(spec, facts, mix_gpu_models=spec.queue in queues.mixing_queues)
        if why is not None:
            # What `jobs explain` would say of it on an idle cluster: waiting could never help.
            raise Inadmissible(f"can never run on this cluster, even with every GPU free: {why}")


def _admit_het(spec: JobSpec, queues: QueueConfig, facts: ClusterFacts, empty: EmptyCluster | None) -> None:
    """A heterogeneous job: each component admitted as a job of its own, then the whole gang on an idle cluster."""
    for n, part in enumerate(spec.component_specs()):
        try:
            admit(part, queues, facts)
        except Inadmissible as exc:
            raise Inadmissible(f"component {n}: {exc}") from exc
    if spec.total_gpus > facts.total:
        raise Inadmissible(
            f"its components ask {spec.total_gpus:g} GPUs in all, more than the cluster has ({facts.total} GPUs)"
        )
    if empty is not None:
        why = empty.never_fits(spec, facts, mix_gpu_models=spec.queue in queues.mixing_queues)
        if why is not None:
            raise Inadmissible(f"can never run on this cluster, even with every GPU free: {why}")


def _admit_mig(spec: JobSpec, facts: ClusterFacts) -> None:
    """A MIG profile no node offers, or more ranks than the cluster has instances of it, can never run."""
    profile = spec.resources.mig or ""
    have = facts.mig_profiles
    if not have[profile]:
        offered = ", ".join(f"{p} x{n}" for p, n in sorted(have.items())) or "none (no GPU is in MIG mode)"
        raise Inadmissible(f"mig={profile!r}: no node offers MIG instances of that profile; the cluster has {offered}")
    if spec.ranks > have[profile]:
        raise Inadmissible(
            f"{spec.ranks} ranks of mig={profile!r} need {spec.ranks} instances; the cluster has {have[profile]}"
        )


async def refuse_dependency_cycle(
    job_id: str, spec: JobSpec, depends_on: Callable[[str], Awaitable[Iterable[str] | None]]
) -> None:
    """Inadmissible when the job's dependencies lead back to itself (a chain that would wait for ever).

    `depends_on(id)`: the ids an existing job's dependencies name (None: no such job), read once per job."""
    if not spec.dependencies:
        return
    known: dict[str, list[str] | None] = {}
    frontier = [j for d in spec.dependencies for j in d.job_ids]
    while frontier and len(known) < MAX_CYCLE_WALK:
        wanted = [j for j in dict.fromkeys(frontier) if j not in known and j != job_id]
        frontier = []
        for j in wanted:
            found = await depends_on(j)
            known[j] = None if found is None else list(found)
            frontier.extend(known[j] or [])
    cycle = dependency_cycle(job_id, spec, lambda j: known.get(j))
    if cycle is not None:
        raise Inadmissible(f"--dependency makes a cycle ({' -> '.join(cycle)}): the job would wait for itself for ever")
