"""Which trace jobs are elastic gangs (`oneplus sim run --elastic RULE`): traces have no such column, so a rule says.

The rule is applied to the jobs every policy replays, so the fixed run (`oneplus`) and the elastic run
(`oneplus-elastic`) see the very same gangs: the fixed one always asks and runs the maximum, the elastic one may
start smaller, grow and shrink. Assumptions, printed in the report: work scales linearly with the ranks (a gang at
half its ranks progresses at half speed), and a resize checkpoints at the signal (no work lost) and restarts after
the checkpoint grace.
"""

from __future__ import annotations

from collections.abc import Sequence

from .trace import SimJob

ELASTIC_RULES: dict[str, str] = {
    "half": (
        "every job of 2 or more whole GPUs is elastic: a job of several ranks keeps them (max) with min = half of "
        "them, rounded up; a one-rank job of N GPUs becomes 2 ranks of N/2 GPUs (N odd: N ranks of 1) with min = "
        "half, rounded up, its ranks kept on one node (domain node, required); work scales linearly with the "
        "ranks; a resize checkpoints at the signal and restarts after the checkpoint grace. The fixed run "
        "(`oneplus`) runs the same ranks at max."
    ),
}


class ElasticRuleError(ValueError):
    """An --elastic rule the simulator does not know."""


def make_elastic(jobs: Sequence[SimJob], rule: str) -> int:
    """Mark the jobs the rule makes elastic (in place, after TraceRules.apply); how many it marked."""
    if rule not in ELASTIC_RULES:
        raise ElasticRuleError(f"--elastic: unknown rule {rule!r}; choose from {', '.join(ELASTIC_RULES)}")
    marked = 0
    for job in jobs:
        if job.gpu_milli or job.whole_gpus < 2:
            continue
        if job.ranks == 1:
            n = job.whole_gpus
            job.ranks, job.gpus_per_rank = (2, n // 2) if n % 2 == 0 else (n, 1)
            job.one_node = True  # it fitted one node: its ranks keep to one node (domain node, required)
        job.elastic_max = job.ranks
        job.elastic_min = (job.ranks + 1) // 2
        marked += 1
    return marked


def fixed_at_max(jobs: Sequence[SimJob]) -> None:
    """The same gangs without elasticity: each asks and runs its maximum (the baseline of the comparison)."""
    for job in jobs:
        job.elastic_min = job.elastic_max = 0
