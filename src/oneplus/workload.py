"""The demo's mixed workload: gangs of 1 to 16 GPUs, seeded so every run shows the same story."""

from __future__ import annotations

import random

from oneplus_contracts import JobSpec, RankResources, SimulatedRun, TopologyConstraint

# (ranks, GPUs per rank): singles, pairs, a quad, whole nodes and two-node gangs.
DEMO_SHAPES: tuple[tuple[int, int], ...] = (
    (1, 1),
    (1, 1),
    (1, 2),
    (1, 2),
    (1, 4),
    (1, 8),
    (2, 8),
    (1, 1),
    (2, 4),
    (1, 4),
)


def demo_workload(n: int = 20, seed: int = 7, duration_s: tuple[float, float] = (1.0, 4.0)) -> list[JobSpec]:
    rng = random.Random(seed)
    specs: list[JobSpec] = []
    for i in range(n):
        ranks, gpus = DEMO_SHAPES[i % len(DEMO_SHAPES)]
        big = ranks * gpus >= 8
        specs.append(
            JobSpec(
                name=f"demo-{i:02d}-{ranks * gpus}gpu",
                team=rng.choice(["vision", "nlp"]),
                user="demo",
                priority=rng.choice([0, 10, 50]),
                ranks=ranks,
                resources=RankResources(gpus=gpus, cpus=4, memory_mb=8192),
                topology=TopologyConstraint(domain="leaf" if ranks > 1 else "node", mode="preferred"),
                command=["python", "train.py"],
                time_limit_s=600,
                simulate=SimulatedRun(duration_s=round(rng.uniform(*duration_s) * (1.5 if big else 1.0), 2)),
            )
        )
    return specs
