"""Queueing and preemption policy: quotas, fair share, backfill, victim choice.

Pure decision code: the placement-solver and preemption services and the simulator call the same functions.
"""

from .config import (
    QueueConfig,
    QueueConfigError,
    QueueSpec,
    UnknownPriorityClass,
    UnknownQueue,
    default_config,
    load_queue_config,
)
from .cycle import schedule_cycle
from .fairshare import UsageHistory, fair_tree, fairshare_factors
from .model import (
    CycleCarry,
    CycleDecision,
    PendingJob,
    PendingReason,
    ReasonCode,
    Reservation,
    RunningJob,
    VictimChoice,
)
from .report import QUEUE_HEADER, QUEUES_HEADER, QueueRow, QueuesRow, queue_rows, queues_rows, split_records
from .victims import choose_victims

__all__ = [
    "QUEUES_HEADER",
    "QUEUE_HEADER",
    "CycleCarry",
    "CycleDecision",
    "PendingJob",
    "PendingReason",
    "QueueConfig",
    "QueueConfigError",
    "QueueRow",
    "QueueSpec",
    "QueuesRow",
    "ReasonCode",
    "Reservation",
    "RunningJob",
    "UnknownPriorityClass",
    "UnknownQueue",
    "UsageHistory",
    "VictimChoice",
    "choose_victims",
    "default_config",
    "fair_tree",
    "fairshare_factors",
    "load_queue_config",
    "queue_rows",
    "queues_rows",
    "schedule_cycle",
    "split_records",
]
