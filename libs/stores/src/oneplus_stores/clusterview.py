"""What the solver's ops answers and the services' config share: why a job is pending, and the live queue config."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue
from oneplus_contracts import ACTIVE_STATES, JobRecord
from oneplus_placement.explain import explain_pending
from oneplus_placement.snapshot import ClusterState
from oneplus_queueing.config import QueueConfig, default_config, load_queue_config

log = logging.getLogger("oneplus.solver")


def pending_order(pending: Sequence[JobRecord]) -> list[JobRecord]:
    """Higher priority first, then first come first served."""
    return sorted(pending, key=lambda r: (-r.spec.priority, r.submitted_ts, r.job_id))


def explain_job(
    state: ClusterState, rec: JobRecord, jobs: Sequence[JobRecord], *, mix_gpu_models: bool = False
) -> dict[str, Any]:
    """Why `rec` is pending on `state`: the blocking constraint and level, who is ahead, whose preemption makes room
    (`mix_gpu_models`: its queue lets a gang span GPU models)."""
    ahead = [
        j.job_id
        for j in pending_order([j for j in jobs if j.state == "ACCEPTED"])
        if (j.spec.priority, -j.submitted_ts) > (rec.spec.priority, -rec.submitted_ts)
    ]
    preemptible = [
        (j.job_id, j.allocation, j.spec.priority)
        for j in jobs
        if j.state in ACTIVE_STATES and j.allocation is not None and j.spec.preemptible
    ]
    why = explain_pending(state, rec.spec, ahead=ahead, preemptible=preemptible, mix_gpu_models=mix_gpu_models)
    return why.to_dict()


# Clauses that say where a gang stops fitting; the cycle's reason already has its own.
_PLACEMENT_DETAIL = ("best ", "the best ", "the cluster has ", "no node has room")


def merge_reason(code: str, reason: str, explained: str) -> str:
    """The cycle's reason (`code: reason`) followed by what the explanation adds, each clause once: a clause of the
    explanation already in the reason is not repeated, nor its own `needs ...` (and where-it-stops) clauses when the
    reason already says what the job needs."""
    have = reason.split("; ")
    says_needs = any(c.startswith("needs ") for c in have)
    out = list(have)
    after_needs = False
    for clause in explained.split("; "):
        if clause in out:
            after_needs = False
            continue
        if says_needs and clause.startswith("needs "):
            after_needs = True
            continue
        if after_needs and clause.startswith(_PLACEMENT_DETAIL):
            continue
        after_needs = False
        out.append(clause)
    return f"{code}: " + "; ".join(out)


QUEUES_KEY = "config"


def queue_config_from(stored: bytes | None, queues_file: str | None = None) -> QueueConfig:
    """The one queue-config rule every service follows: the tree operators stored in the `queues` bucket, else
    ONEPLUS_QUEUES_FILE (`queues_file`; None reads the environment), else one `default` queue.
    A bad stored tree or file raises `QueueConfigError` naming the key."""
    if stored:
        return load_queue_config(stored.decode())
    path = os.environ.get("ONEPLUS_QUEUES_FILE") if queues_file is None else queues_file
    if path:
        with open(path, encoding="utf-8") as f:
            return load_queue_config(f.read())
    return default_config()


async def live_queue_config(queues_kv: KeyValue, queues_file: str | None = None) -> QueueConfig:
    """The queue config in force now (`queue_config_from` on the bucket's current entry)."""
    try:
        entry = await queues_kv.get(QUEUES_KEY)
    except KeyNotFoundError:
        entry = None
    return queue_config_from(entry.value if entry is not None else None, queues_file)
