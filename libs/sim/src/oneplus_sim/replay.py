"""One trace replay: load, apply the trace rules, run every policy on its own copy, assemble the report."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from oneplus_queueing.config import QueueConfig

from .cluster import SimCluster, load_cluster
from .comm import TP_SHARE
from .elastic import ELASTIC_RULES, fixed_at_max, make_elastic
from .engine import SimResult, Simulation
from .estimates import assign_time_limits
from .metrics import figures
from .policies import ELASTIC_POLICY, make_policy
from .trace import SimJob, TraceError, TraceRules, cut, load_trace


@dataclass
class ReplaySpec:
    cluster: Path | str | SimCluster
    trace: Path | str | Sequence[SimJob]
    policies: Sequence[str]
    window: tuple[int, int] | None = None
    max_jobs: int | None = None
    seed: int = 0
    load: float = 1.0
    preempt_grace_s: float = 30.0
    rules: TraceRules | None = None
    oneplus_config: QueueConfig | None = None  # None: sim_queue_config()
    time_limits: str = "user"  # `user`: the seeded model of oneplus_sim.estimates; `oracle`: the run time
    tp_groups: bool = False  # TraceRules.tp_groups: jobs of >= 8 GPUs get tensor-parallel groups
    elastic: str | None = None  # an oneplus_sim.elastic rule: `oneplus-elastic` runs beside `oneplus` (fixed at max)


@dataclass
class Replay:
    report: dict[str, object]
    results: dict[str, SimResult] = field(default_factory=dict)
    cluster: SimCluster | None = None


def prepare_jobs(spec: ReplaySpec, cluster: SimCluster) -> tuple[list[SimJob], dict[str, object], TraceRules]:
    """Cut the trace, apply the rules and the time-limit model once: every policy replays copies of these jobs."""
    if isinstance(spec.trace, (str, Path)):
        trace = load_trace(spec.trace)
        raw, source, dropped = trace.jobs, str(spec.trace), trace.dropped
    else:
        raw, source, dropped = list(spec.trace), "in-memory", {}
    jobs = cut(raw, spec.window, spec.max_jobs, spec.load)
    rules = spec.rules or TraceRules(seed=spec.seed, tp_groups=spec.tp_groups)
    rules.apply(jobs, cluster.max_node_gpus)
    fit: list[SimJob] = []
    rejected: list[SimJob] = []
    for j in jobs:
        (fit if _can_ever_fit(cluster, j) else rejected).append(j)
    if not fit:
        raise TraceError("no job of the selection fits on this cluster")
    limits = assign_time_limits(fit, spec.time_limits, spec.seed)
    elastic_jobs = make_elastic(fit, spec.elastic) if spec.elastic is not None else 0
    info: dict[str, object] = {
        "source": source,
        "jobs_selected": len(jobs),
        "jobs_rejected_too_big": len(rejected),
        "dropped_at_load": dropped,
        "window": list(spec.window) if spec.window else None,
        "max_jobs": spec.max_jobs,
        "load": spec.load,
        "time_limits": limits,
    }
    if spec.elastic is not None:
        info["elastic"] = {"rule": spec.elastic, "jobs": elastic_jobs, "description": ELASTIC_RULES[spec.elastic]}
    return fit, info, rules


def _can_ever_fit(cluster: SimCluster, job: SimJob) -> bool:
    """Enough nodes that could host a rank, of one GPU model unless the job lists several (placement keeps a gang
    to one model, so a larger gang would wait for ever)."""
    by_model: dict[str, int] = {}
    for n in cluster.nodes:
        k = n.kind
        if job.gpu_models and k.gpu_model not in job.gpu_models:
            continue
        if k.cpus < job.cpus or k.memory_mb < job.memory_mb:
            continue
        if k.n_gpus >= (1 if job.gpu_milli else job.gpus_per_rank):
            by_model[k.gpu_model] = by_model.get(k.gpu_model, 0) + 1
    if job.gpu_models and len(job.gpu_models) > 1:
        return sum(by_model.values()) >= job.ranks
    return max(by_model.values(), default=0) >= job.ranks


def run_replay(spec: ReplaySpec, on_progress: Callable[[str, int, int], None] | None = None) -> Replay:
    cluster = spec.cluster if isinstance(spec.cluster, SimCluster) else load_cluster(spec.cluster)
    jobs, trace_info, rules = prepare_jobs(spec, cluster)
    report: dict[str, object] = {
        "cluster": cluster.describe(),
        "trace": trace_info,
        "seed": spec.seed,
        "rules": rules.describe(),
        "time_limits": trace_info["time_limits"],  # which model ran, its seed and its overestimate
        "preempt_grace_s": spec.preempt_grace_s,
        "policies": {},
    }
    if rules.tp_groups:
        report["tp_comm_share"] = TP_SHARE  # share of a TP job's communication in its groups (oneplus_sim.comm)
    names = list(spec.policies)
    if spec.elastic is not None and "oneplus" in names and ELASTIC_POLICY not in names:
        names.insert(names.index("oneplus") + 1, ELASTIC_POLICY)  # with and without elasticity, in one run
    if "oneplus" in names or ELASTIC_POLICY in names:
        from .policies.oneplus import sim_queue_config

        config = spec.oneplus_config or sim_queue_config()
        report["oneplus_queue_config"] = config.model_dump(mode="json")  # the knobs behind its figures
    results: dict[str, SimResult] = {}
    policies: dict[str, object] = {}
    total = len(jobs)
    for name in names:
        policy = make_policy(name, spec.seed, spec.oneplus_config)
        run_jobs = copy.deepcopy(jobs)
        if name != ELASTIC_POLICY:
            fixed_at_max(run_jobs)  # the same gangs, always at their maximum
        cb = (lambda done, _n=name: on_progress(_n, done, total)) if on_progress else None
        t0 = time.perf_counter()
        res = Simulation(cluster, run_jobs, policy, preempt_grace_s=spec.preempt_grace_s, on_progress=cb).run()
        figs = figures(res)
        figs["wall_s"] = round(time.perf_counter() - t0, 2)
        policies[name] = figs
        results[name] = res
    report["policies"] = policies
    return Replay(report, results, cluster)
