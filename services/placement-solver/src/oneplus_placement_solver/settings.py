"""The placement-solver's settings: built once at bootstrap from the environment, one clear error for a bad value."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

from .outcome import INFRA_RETRIES


@dataclass(frozen=True)
class SolverSettings:
    schedule_interval_s: float = 1.0  # a cycle at least this often (fair share accrues), sooner when woken
    reconcile_interval_s: float = 3.0
    lost_reservation_grace_s: float = 5.0
    relaunch_after_s: float = 10.0  # a node silent this long after its gang was placed gets its launch command again
    min_job_age_s: float = 300.0  # Slurm's MinJobAge: how long a finished job stays in the hot view
    expire_interval_s: float = 1.0  # small passes: a pass's burst of archive writes and purges delays commits
    preemption_request_every_s: float = 10.0
    nic_gbps_per_gpu: float = 400.0
    oversubscription: float = 1.0
    infra_retries: int = INFRA_RETRIES  # requeues after platform faults (node, executor, reservation lost) per job
    # This replica's name: stable across its restarts, so a restarted lone solver takes its own lease back at once.
    replica: str = field(default_factory=socket.gethostname)
    lease_ttl_s: float = 10.0  # a dead owner's lease is taken over this long after its last renewal
    beat_s: float = 1.0  # lease renewal and liveness beat
    # The share of the solver's time that back-to-back cycles may take (Slurm's sched_min_interval, made relative):
    # under a burst the owner still folds the facts that free capacity, and each cycle places what piled up.
    schedule_duty: float = 0.5
    # Cycles whose bindings (reserve, record, launch) may be in flight at once: the next cycle decides while the
    # last one's round trips are out, and waits for room beyond this (kube-scheduler's asynchronous binding).
    bind_depth: int = 2

    @classmethod
    def from_env(cls) -> SolverSettings:
        retries = os.environ.get("ONEPLUS_INFRA_RETRIES", str(INFRA_RETRIES))
        if not retries.strip().isdigit():
            raise ValueError(f"ONEPLUS_INFRA_RETRIES={retries!r}: a whole number of retries (0 or more)")
        replica = os.environ.get("ONEPLUS_SOLVER_REPLICA", "").strip() or socket.gethostname()
        if not replica.replace("-", "").replace("_", "").isalnum():
            raise ValueError(f"ONEPLUS_SOLVER_REPLICA={replica!r}: letters, digits, '-' and '_' only (a KV key)")
        ttl = float(os.environ.get("ONEPLUS_SOLVER_LEASE_S", "10"))
        if not 2.0 <= ttl <= 300.0:
            raise ValueError(f"ONEPLUS_SOLVER_LEASE_S={ttl}: between 2 and 300 seconds")
        raw_duty = os.environ.get("ONEPLUS_SCHEDULE_DUTY", "0.5")
        try:
            duty = float(raw_duty)
        except ValueError:
            duty = -1.0
        if not 0.05 <= duty <= 1.0:
            raise ValueError(f"ONEPLUS_SCHEDULE_DUTY={raw_duty!r}: a share of the solver's time, between 0.05 and 1")
        return cls(
            replica=replica,
            lease_ttl_s=ttl,
            schedule_duty=duty,
            infra_retries=int(retries),
            min_job_age_s=float(os.environ.get("ONEPLUS_MIN_JOB_AGE_S", "300")),
            nic_gbps_per_gpu=float(os.environ.get("ONEPLUS_NIC_GBPS_PER_GPU", "400")),
            oversubscription=float(os.environ.get("ONEPLUS_OVERSUBSCRIPTION", "1.0")),
        )
