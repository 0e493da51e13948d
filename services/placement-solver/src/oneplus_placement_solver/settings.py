"""The placement-solver's settings: built once at bootstrap from the environment, one clear error for a bad value."""

from __future__ import annotations

import socket

from oneplus_bus.config import ReadableFile, ServiceSettings
from pydantic import Field, field_validator

from .outcome import INFRA_RETRIES


class SolverSettings(ServiceSettings):
    """`ONEPLUS_<FIELD>` sets each field (docs/configuration.md); the two with aliases read the names shown."""

    schedule_interval_s: float = Field(1.0, gt=0)  # a cycle at least this often (fair share accrues), sooner when woken
    reconcile_interval_s: float = Field(3.0, gt=0)
    lost_reservation_grace_s: float = Field(5.0, ge=0)
    relaunch_after_s: float = Field(10.0, gt=0)  # a node silent this long after its placement gets its launch again
    min_job_age_s: float = Field(300.0, ge=0)  # Slurm's MinJobAge: how long a finished job stays in the hot view
    expire_interval_s: float = Field(1.0, gt=0)  # small passes: a pass's archive writes and purges delay commits
    nic_gbps_per_gpu: float = Field(400.0, gt=0)
    oversubscription: float = Field(1.0, gt=0)
    infra_retries: int = Field(INFRA_RETRIES, ge=0)  # requeues after platform faults (node, executor, lost hold)
    # This replica's name: stable across its restarts, so a restarted lone solver takes its own lease back at once.
    replica: str = Field(default_factory=socket.gethostname, alias="ONEPLUS_SOLVER_REPLICA")
    # A dead owner's lease is taken over this long after its last renewal.
    lease_ttl_s: float = Field(10.0, ge=2.0, le=300.0, alias="ONEPLUS_SOLVER_LEASE_S")
    beat_s: float = Field(1.0, gt=0)  # lease renewal and liveness beat
    # The share of the solver's time that back-to-back cycles may take (Slurm's sched_min_interval, made relative):
    # under a burst the owner still folds the facts that free capacity, and each cycle places what piled up.
    schedule_duty: float = Field(0.5, ge=0.05, le=1.0)
    # Cycles whose bindings (reserve, record, launch) may be in flight at once: the next cycle decides while the
    # last one's round trips are out, and waits for room beyond this (kube-scheduler's asynchronous binding).
    bind_depth: int = Field(2, ge=1)
    # The queue tree when the `queues` bucket holds none (oneplus_stores.clusterview.queue_config_from).
    queues_file: ReadableFile | None = None

    @field_validator("replica")
    @classmethod
    def _kv_key(cls, value: str) -> str:
        if not value.replace("-", "").replace("_", "").isalnum():
            raise ValueError("letters, digits, '-' and '_' only (a KV key)")
        return value

    @classmethod
    def from_env(cls) -> SolverSettings:
        return cls.load()
