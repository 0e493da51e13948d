"""Time limits for trace jobs: what a user would have asked for (`user`), or the exact run time (`oracle`).

Traces give a job's run time, not the time limit its user requested. A replay that uses the run time as the limit
("oracle") flatters every policy that trusts limits: backfill knows exactly when a running job ends and which
waiting job fits before a reservation, and a job-size factor sorts by true GPU-hours. Real limits are loose.
Tsafrir, Etsion and Feitelson ("Modeling user runtime estimates", JSSPP 2005) find in the Parallel Workloads
Archive logs that

- users pick from a few round values: about 20 values cover 90% of requests, 1 h, 24 h and the site maximum among
  the most popular, the values between hours and days (2 h, 4 h, 8 h, 12 h, 48 h, 72 h) next;
- the maximum the queue allows is often the single most popular request (the users who do not bother);
- estimates are several times the run time: the accuracy (run time / estimate) is spread over (0, 1], with many
  short jobs asking far more than they use.

`UserEstimates` is a seeded model with those three traits, one draw per job from `Random(f"{seed}/limit/{job}")`,
so the same job gets the same limit whatever the window and whichever policy replays it:

1. With probability `max_share` the user asks the site maximum (`max_limit_s`, 7 days).
2. Otherwise the user's guess is `run time / a`, with the accuracy `a ~ Uniform(min_accuracy, 1)`; the request is a
   round value at or above the guess: among the first `choices` values of `ROUND_LIMITS_S` that are >= the guess
   (the maximum included), one is drawn with probability proportional to its popularity weight, so a guess of 5 h
   becomes 8 h, 12 h or 24 h (24 h the likeliest).
3. A job that ran longer than the maximum had its limit raised by the site: its limit is its run time rounded up to
   whole days. (Few Philly jobs: 0.3% run longer than 7 days.)

Every limit is >= the run time, so no job is killed at its limit by the model (the simulator kills none anyway); a
job slowed by its placement may outrun its limit, as with the oracle. On the Philly trace the median ratio limit /
run time is 11.3 over the whole trace and 15.1 over its first 2,000 jobs (seed 0; half the Philly jobs run under 20
minutes and ask at least 15 min, often 1 h or the maximum); every report prints it under `time_limits`.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from .trace import SimJob, TraceError

HOUR = 3600.0
DAY = 24 * HOUR

# The round values users ask for, with their popularity weights (Tsafrir et al. 2005, Fig. 2: a few values carry most
# requests; 1 h and 1 day lead). The site maximum (UserEstimates.max_limit_s) is the last value.
ROUND_LIMITS_S: tuple[tuple[float, float], ...] = (
    (15 * 60.0, 2.0),
    (30 * 60.0, 3.0),
    (1 * HOUR, 6.0),
    (2 * HOUR, 4.0),
    (4 * HOUR, 4.0),
    (8 * HOUR, 3.0),
    (12 * HOUR, 3.0),
    (24 * HOUR, 6.0),
    (48 * HOUR, 3.0),
    (72 * HOUR, 3.0),
)

TIME_LIMIT_MODELS = ("user", "oracle")


@dataclass(frozen=True)
class UserEstimates:
    """The seeded model of user-requested time limits (module docstring). Every field is printed in the report."""

    seed: int = 0
    max_limit_s: float = 7 * DAY
    max_share: float = 0.15
    min_accuracy: float = 0.1
    choices: int = 3

    def __post_init__(self) -> None:
        if self.max_limit_s < ROUND_LIMITS_S[-1][0]:
            raise ValueError(f"max_limit_s {self.max_limit_s} is below the largest round value {ROUND_LIMITS_S[-1][0]}")
        if not 0 <= self.max_share <= 1 or not 0 < self.min_accuracy <= 1 or self.choices < 1:
            raise ValueError("need 0 <= max_share <= 1, 0 < min_accuracy <= 1, choices >= 1")

    @property
    def values(self) -> tuple[tuple[float, float], ...]:
        """The round values with their weights, the site maximum last (weighted as the most popular value)."""
        top = max(w for _, w in ROUND_LIMITS_S)
        return (*ROUND_LIMITS_S, (self.max_limit_s, top))

    def limit(self, job_id: str, duration_s: float) -> float:
        """The time limit the user of `job_id` asked for; always >= `duration_s`."""
        if duration_s > self.max_limit_s:
            return math.ceil(duration_s / DAY) * DAY
        rng = random.Random(f"{self.seed}/limit/{job_id}")
        if rng.random() < self.max_share:
            return self.max_limit_s
        guess = duration_s / rng.uniform(self.min_accuracy, 1.0)
        above = [(v, w) for v, w in self.values if v >= guess][: self.choices] or [(self.max_limit_s, 1.0)]
        value, _ = rng.choices(above, weights=[w for _, w in above])[0]
        return max(value, duration_s)

    def apply(self, jobs: Sequence[SimJob]) -> None:
        for job in jobs:
            job.time_limit_s = self.limit(job.job_id, job.duration_s)

    def describe(self) -> dict[str, str]:
        vals = ", ".join(f"{_fmt(v)}:{w:g}" for v, w in self.values)
        return {
            "model": "user",
            "seed": str(self.seed),
            "rule": (
                f"Tsafrir/Etsion/Feitelson-style user estimates, Random(seed/limit/job): with probability "
                f"{self.max_share} the site maximum {_fmt(self.max_limit_s)}; otherwise guess = run time / a, "
                f"a ~ Uniform({self.min_accuracy}, 1), and the limit is one of the first {self.choices} round values "
                f">= guess, drawn by popularity weight (value:weight {vals}); a job longer than the maximum gets its "
                f"run time rounded up to whole days. Every limit >= the run time"
            ),
        }


def _fmt(seconds: float) -> str:
    if seconds < HOUR:
        return f"{seconds / 60:g}m"
    if seconds < DAY or seconds % DAY:
        return f"{seconds / HOUR:g}h"
    return f"{seconds / DAY:g}d"


def describe_oracle() -> dict[str, str]:
    return {"model": "oracle", "rule": "each job's time limit is its exact trace run time"}


def assign_time_limits(jobs: Sequence[SimJob], model: str, seed: int) -> dict[str, object]:
    """Set `time_limit_s` on every job by `model` (`user` or `oracle`); the report's `time_limits` section."""
    if model == "oracle":
        for job in jobs:
            job.time_limit_s = job.duration_s
        info: dict[str, object] = dict(describe_oracle())
    elif model == "user":
        est = UserEstimates(seed=seed)
        est.apply(jobs)
        info = dict(est.describe())
    else:
        raise TraceError(f"--time-limits {model!r}: choose from {', '.join(TIME_LIMIT_MODELS)}")
    summary = overestimate_summary(jobs)
    if model == "oracle":
        summary.pop("round_value_share", None)  # run times are not requests: the share says nothing there
    info.update(summary)
    return info


def overestimate_summary(jobs: Sequence[SimJob]) -> dict[str, float]:
    """Median and 10th percentile of limit / run time over the jobs, and the share of limits that are round values
    (a listed value or whole days)."""
    ratios = [j.limit_s / j.duration_s for j in jobs if j.duration_s > 0]
    if not ratios:
        return {}
    rounds = {v for v, _ in ROUND_LIMITS_S}
    round_share = sum(1 for j in jobs if j.limit_s in rounds or j.limit_s % DAY == 0) / len(jobs)
    ratios.sort()
    return {
        "median_limit_over_runtime": round(statistics.median(ratios), 3),
        "p10_limit_over_runtime": round(ratios[len(ratios) // 10], 3),
        "round_value_share": round(round_share, 4),
    }
