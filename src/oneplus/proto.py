"""Writes `proto/`: a JSON Schema per contract model, the AsyncAPI 3.0 document of every subject and the intake's
OpenAPI 3.1 document (oneplus_intake.openapi).

Generated from `oneplus_contracts` (`task proto`); a test fails when the checked-in files are stale.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from oneplus_contracts import (
    JOB_EVENT_ADAPTER,
    NODE_COMMAND_ADAPTER,
    SCHEMA_VERSION,
    FactOutcome,
    JobRecord,
    JobSpec,
    NodeHeartbeat,
    NodeLease,
    NodeRecord,
    NodeReportRequest,
    NodeTopology,
    PreemptionRequest,
    ReservationAudit,
    SubmitReply,
    subjects,
)
from oneplus_contracts.advance import AdvanceReservation, AdvanceReservationRequest
from oneplus_intake.openapi import render as render_openapi
from pydantic import BaseModel, TypeAdapter

MODELS: dict[str, type[BaseModel] | TypeAdapter[Any]] = {
    "JobSpec": JobSpec,
    "JobEvent": JOB_EVENT_ADAPTER,
    "JobRecord": JobRecord,
    "NodeCommand": NODE_COMMAND_ADAPTER,
    "PreemptionRequest": PreemptionRequest,
    "SubmitReply": SubmitReply,
    "NodeTopology": NodeTopology,
    "NodeHeartbeat": NodeHeartbeat,
    "NodeLease": NodeLease,
    "NodeReportRequest": NodeReportRequest,
    "ReservationAudit": ReservationAudit,
    "NodeRecord": NodeRecord,
    "FactOutcome": FactOutcome,
    "AdvanceReservation": AdvanceReservation,
    "AdvanceReservationRequest": AdvanceReservationRequest,
}

# channel id → (address, message schema, description, who sends, who receives)
CHANNELS: dict[str, tuple[str, str, str, str, str]] = {
    "jobSubmit": (
        subjects.SUBMIT,
        "JobSpec",
        "Submit a job (request/reply; a JobSpec or a CloudEvent)",
        "client",
        "intake",
    ),
    "jobEvents": (
        "oneplus.job.{job_id}.{event}",
        "JobEvent",
        "Every lifecycle event of a job as folded by its owner, in stream ONEPLUS_JOBS (`rejected`: the intake)",
        "placement-solver (the job owner); intake for `rejected`",
        "preemption, operators (`nats sub`)",
    ),
    "jobFacts": (
        "oneplus.fact.job.{job_id}.{event}",
        "JobEvent",
        "A fact about a job for its owner to fold or refuse, in stream ONEPLUS_FACTS",
        "intake (`cancel_requested`; `accepted` of arrays, or when no owner answers), preemption; node-executor with"
        " ONEPLUS_EXECUTOR_FACTS=stream",
        "placement-solver",
    ),
    "jobReports": (
        "oneplus.report.job.{job_id}.{event}",
        "JobEvent",
        "A fact sent straight to the job owner (core NATS request, no stream): the reply, a FactOutcome, comes once its"
        " event is in ONEPLUS_JOBS or it was refused; a reply with the Oneplus-Retry header asks for it again later",
        "node-executor (from its durable outbox, resent until answered); intake (`accepted`, before answering a"
        " submission; into jobFacts when no owner answers)",
        "placement-solver (the job owner)",
    ),
    "factOutcomes": (
        "oneplus.outcome.job.{job_id}.{event}",
        "FactOutcome",
        "Whether the owner folded a fact reported with the Oneplus-Await-Fold header, sent once the record is in the"
        " hot view (core NATS)",
        "placement-solver",
        "intake (a submission or cancel answered once a read sees it)",
    ),
    "jobArchive": (
        "oneplus.archive.{job_id}.{state}.{team}.{user}",
        "JobRecord",
        "A finished job's last record, once it left the hot view; stream ONEPLUS_ARCHIVE (30 days)",
        "placement-solver",
        "intake (jobs show/list)",
    ),
    "reservationAudit": (
        subjects.RESERVATION_AUDIT,
        "ReservationAudit",
        "Every reservation taken, put back after a store reset, or freed; stream ONEPLUS_AUDIT (30 days)",
        "placement-solver",
        "auditors (`oneplus audit reservations`)",
    ),
    "nodeCommands": (
        "oneplus.cmd.node.{node}.{kind}",
        "NodeCommand",
        "Launch, preempt, cancel or signal (scancel --signal) one node's ranks (fencing token checked), stream"
        " ONEPLUS_COMMANDS; the launches one commit placed on a node travel as one launch_batch (kind launch_batch,"
        " on the node's `launch` subject), each checked on its own",
        "placement-solver, preemption, intake (signal)",
        "node-executor",
    ),
    "preemptionRequests": (
        subjects.PREEMPTION_REQUEST,
        "PreemptionRequest",
        "A high-priority gang cannot be placed",
        "placement-solver",
        "preemption",
    ),
    "nodeTopology": (
        "oneplus.node.{node}.topology",
        "NodeTopology",
        "A node's topology report",
        "node-executor",
        "topology-registry",
    ),
    "nodeHeartbeat": (
        "oneplus.node.{node}.heartbeat",
        "NodeHeartbeat",
        "The node's full report (per-GPU and engine health, its ranks): when it changes, and at least every "
        "ONEPLUS_REPORT_EVERY_S (core NATS)",
        "node-executor",
        "topology-registry, placement-solver",
    ),
    "nodeLease": (
        "oneplus.node.{node}.lease",
        "NodeLease",
        "Alive, and the last full report still holds: every heartbeat that would repeat it (core NATS)",
        "node-executor",
        "topology-registry",
    ),
    "nodeReportRequest": (
        subjects.NODE_REPORT_REQUEST,
        "NodeReportRequest",
        "The nodes named (or all) send their full report with their next heartbeat (core NATS)",
        "placement-solver (at its start), topology-registry (a lost node's lease)",
        "node-executor",
    ),
}


def schemas() -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name, model in MODELS.items():
        schema = model.model_json_schema() if isinstance(model, type) else model.json_schema()
        schema["$id"] = f"https://oneplus.dev/schemas/v{SCHEMA_VERSION}/{name}.json"
        schema.setdefault("title", name)
        out[name] = schema
    return out


def asyncapi() -> dict[str, Any]:
    channels: dict[str, Any] = {}
    operations: dict[str, Any] = {}
    for cid, (address, msg, desc, senders, receivers) in CHANNELS.items():
        params = {p.strip("{}"): {"description": p.strip("{}")} for p in address.split(".") if p.startswith("{")}
        channels[cid] = {
            "address": address,
            "description": desc,
            "messages": {msg: {"$ref": f"#/components/messages/{msg}"}},
            **({"parameters": params} if params else {}),
        }
        operations[f"{cid}Send"] = {
            "action": "send",
            "channel": {"$ref": f"#/channels/{cid}"},
            "summary": f"sent by {senders}",
        }
        operations[f"{cid}Receive"] = {
            "action": "receive",
            "channel": {"$ref": f"#/channels/{cid}"},
            "summary": f"received by {receivers}",
        }
    messages = {
        name: {"name": name, "contentType": "application/json", "payload": {"$ref": f"schemas/{name}.json"}}
        for name in MODELS
    }
    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "OnePlus platform",
            "version": f"{SCHEMA_VERSION}.0.0",
            "description": "Subjects of the OnePlus GPU orchestration platform on NATS JetStream.",
        },
        "defaultContentType": "application/json",
        "servers": {"embedded": {"host": "127.0.0.1:4222", "protocol": "nats"}},
        "channels": channels,
        "operations": operations,
        "components": {"messages": messages},
    }


def render() -> dict[str, str]:
    """Relative path → file text, exactly as written to proto/."""
    files = {f"schemas/{n}.json": json.dumps(s, indent=2, sort_keys=True) + "\n" for n, s in schemas().items()}
    files["asyncapi.json"] = json.dumps(asyncapi(), indent=2) + "\n"
    files["openapi.json"] = render_openapi()
    return files


def write(out: Path) -> list[Path]:
    written = []
    for rel, text in render().items():
        path = out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, default=Path("proto"))
    args = ap.parse_args()
    for p in write(args.out):
        print(p)


if __name__ == "__main__":
    main()
