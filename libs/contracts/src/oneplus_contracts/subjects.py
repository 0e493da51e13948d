"""The one catalogue of subjects, streams and KV buckets.

Job events are `oneplus.job.<job_id>.<type>` so one job's history is one filter away.
"""

from __future__ import annotations

PREFIX = "oneplus"

# Request/reply into intake (core NATS; intake publishes into JetStream).
SUBMIT = f"{PREFIX}.jobs.submit"

# Streams: name → subjects.
JOBS_STREAM = "ONEPLUS_JOBS"
NODES_STREAM = "ONEPLUS_NODES"
COMMANDS_STREAM = "ONEPLUS_COMMANDS"
DEAD_LETTER_STREAM = "ONEPLUS_DLQ"
# Facts about a job reported by services that do not own job state (intake, executors, preemption); the job owner
# (the placement-solver) folds them in order and publishes the resulting job event, or refuses them.
FACTS_STREAM = "ONEPLUS_FACTS"
# Finished jobs after they leave the hot view (`jobs` KV), kept for ONEPLUS_ARCHIVE_RETENTION_S (sacct's database).
ARCHIVE_STREAM = "ONEPLUS_ARCHIVE"
# Every reservation taken, put back and freed, as the solver did it: the audit a reset of Redis cannot erase.
AUDIT_STREAM = "ONEPLUS_AUDIT"
RESERVATION_AUDIT = "oneplus.audit.reservation"

JOB_EVENTS_ALL = f"{PREFIX}.job.>"
NODE_EVENTS_ALL = f"{PREFIX}.node.>"
COMMANDS_ALL = f"{PREFIX}.cmd.>"
DEAD_LETTER_ALL = f"{PREFIX}.dlq.>"
JOB_FACTS_ALL = f"{PREFIX}.fact.job.>"
ARCHIVE_ALL = f"{PREFIX}.archive.>"
AUDIT_ALL = f"{PREFIX}.audit.>"
TOPOLOGY_CHANGED = f"{PREFIX}.topology.changed"

STREAMS: dict[str, list[str]] = {
    JOBS_STREAM: [JOB_EVENTS_ALL],
    # Not heartbeats nor leases: they are core NATS, news only until the next one.
    NODES_STREAM: [f"{PREFIX}.node.*.topology", f"{PREFIX}.node.*.lost", TOPOLOGY_CHANGED],
    COMMANDS_STREAM: [COMMANDS_ALL],
    DEAD_LETTER_STREAM: [DEAD_LETTER_ALL],
    FACTS_STREAM: [JOB_FACTS_ALL],
    ARCHIVE_STREAM: [ARCHIVE_ALL],
    AUDIT_STREAM: [AUDIT_ALL],
}

# KV buckets.
JOBS_KV = "jobs"
TOPOLOGY_KV = "topology"
# Each node's newest heartbeat time, persisted by the registry at most every ONEPLUS_REGISTRY_PERSIST_HEARTBEAT_S: kept
# apart from TOPOLOGY_KV so that a heartbeat's time alone wakes none of the services that watch the topology.
HEARTBEATS_KV = "node_heartbeats"
QUEUES_KV = "queues"
ADVANCE_RESERVATIONS_KV = "advance_reservations"  # one AdvanceReservation (JSON) per key, its name
SOLVER_STATE_KV = "solver_state"  # fair-share usage and nominations: what a restarted solver must not forget
SOLVER_OWNER_LEASE_KEY = "owner.lease"  # in SOLVER_STATE_KV: which solver replica writes job records now
WEBHOOK_DELIVERIES_KV = "webhook_deliveries"  # MLflow delivery ids seen, kept for WEBHOOK_DELIVERIES_TTL_S
WEBHOOK_DELIVERIES_TTL_S = 3600.0

# Ops requests (core NATS request/reply, answered by the owning service).
OPS_QUEUE_LIST = f"{PREFIX}.ops.queue.list"
OPS_JOB_SHOW = f"{PREFIX}.ops.job.show"
OPS_JOB_EXPLAIN = f"{PREFIX}.ops.job.explain"


def ops_solver_reasons(replica: str) -> str:
    """One solver replica's last cycle: why the pending jobs of its shard wait, and their serving order."""
    return f"{PREFIX}.ops.solver.{replica}.reasons"


OPS_JOB_CANCEL = f"{PREFIX}.ops.job.cancel"
OPS_JOB_SIGNAL = f"{PREFIX}.ops.job.signal"  # scancel --signal: the intake sends SignalRanks to the job's nodes
# Advance reservations, created and deleted through the intake (its checks are the server's, for CLI and HTTP alike).
OPS_RESERVATION_CREATE = f"{PREFIX}.ops.reservation.create"
OPS_RESERVATION_LIST = f"{PREFIX}.ops.reservation.list"
OPS_RESERVATION_DELETE = f"{PREFIX}.ops.reservation.delete"
OPS_NODE_LIST = f"{PREFIX}.ops.node.list"
OPS_NODE_DRAIN = f"{PREFIX}.ops.node.drain"
OPS_NODE_CORDON = f"{PREFIX}.ops.node.cordon"
OPS_NODE_UNCORDON = f"{PREFIX}.ops.node.uncordon"


def job_event(job_id: str, event_type: str) -> str:
    return f"{PREFIX}.job.{job_id}.{event_type}"


def job_fact(job_id: str, event_type: str) -> str:
    """Where a non-owner reports a fact about a job (`JobLedger.report`); only the owner publishes `job_event`."""
    return f"{PREFIX}.fact.job.{job_id}.{event_type}"


# Facts sent straight to the job owner (core NATS request/reply, in no stream): the reporter keeps the fact in its own
# durable outbox until the owner answers, which it does once the fact's event is committed or refused (a `FactOutcome`).
JOB_REPORTS_ALL = f"{PREFIX}.report.job.>"
JOB_REPORTS_QUEUE = "job-owner"  # the queue group: one replica answers each request
# A header on a reply to a direct report: the owner cannot fold it now (not the owner, catching up); send it again.
RETRY_HEADER = "Oneplus-Retry"


def job_report(job_id: str, event_type: str) -> str:
    """Where a reporter with a durable outbox (the node-executor) sends a fact to the job owner without a JetStream
    append (`JobLedger.deliver`); the reply comes once the fact's event is in the job stream, or it was refused."""
    return f"{PREFIX}.report.job.{job_id}.{event_type}"


# A header on a reported fact: its reporter waits for the owner's `fact_outcome` (the owner publishes none otherwise).
AWAIT_FOLD_HEADER = "Oneplus-Await-Fold"


def fact_outcome(job_id: str, event_type: str) -> str:
    """Where the owner says what it made of a fact reported with AWAIT_FOLD_HEADER (a `FactOutcome`, core NATS, no
    stream), once the record it folded into is written to the hot view: a read after it sees the fact."""
    return f"{PREFIX}.outcome.job.{job_id}.{event_type}"


def job_events_of(job_id: str) -> str:
    return f"{PREFIX}.job.{job_id}.*"


def all_job_events(event_type: str) -> str:
    return f"{PREFIX}.job.*.{event_type}"


def node_topology(node: str) -> str:
    return f"{PREFIX}.node.{node}.topology"


def node_heartbeat(node: str) -> str:
    return f"{PREFIX}.node.{node}.heartbeat"


def node_lease(node: str) -> str:
    """Core NATS, every heartbeat whose report would repeat the last one (`NodeLease`); read by the registry."""
    return f"{PREFIX}.node.{node}.lease"


# Core NATS, a `NodeReportRequest`: the nodes named (or all) send their full report with their next heartbeat. From a
# solver replica that starts, and from the registry for a lost node that comes back; a node otherwise repeats an
# unchanged report only every ONEPLUS_REPORT_EVERY_S.
NODE_REPORT_REQUEST = f"{PREFIX}.nodes.report"


def node_lost(node: str) -> str:
    return f"{PREFIX}.node.{node}.lost"


def node_command(node: str, kind: str) -> str:
    return f"{PREFIX}.cmd.node.{node}.{kind}"


def node_commands_of(node: str) -> str:
    return f"{PREFIX}.cmd.node.{node}.*"


def slurm_step(node: str) -> str:
    """Core NATS request to a node's executor: run its tasks of a Slurm job step (srun in a batch script)."""
    return f"{PREFIX}.ops.node.{node}.slurm-step"


def slurm_release(node: str) -> str:
    """Core NATS request to a node's executor: the batch script ended, release the job's holders there."""
    return f"{PREFIX}.ops.node.{node}.slurm-release"


PREEMPTION_REQUEST = f"{PREFIX}.cmd.preemption.request"


def dead_letter(subject: str) -> str:
    return f"{PREFIX}.dlq.{subject}"
