"""Every input format (Kubeflow, sbatch, CloudEvents, MLflow webhooks) translated into the one JobSpec.

Pure: no I/O besides what the caller passes in. Each translator returns a `Translation` (spec, warnings naming every
input field that was not used, kind) or raises `JobFormatError` naming the file, the field or line, and the problem.
"""

from .cloudevents import Submission, decode_submission, encode_binary, encode_structured
from .errors import JobFormatError, Translation
from .load import load_job_document
from .mlflow import (
    DeliveryLedger,
    MemoryDeliveryLedger,
    MlflowEvent,
    WebhookRejected,
    WebhookTemplates,
    claim_delivery,
    parse_envelope,
    verify_request,
    verify_signature,
)
from .priorities import PRIORITY_NAMES, priority_of
from .sbatch import parse_sbatch
from .summary import dry_run_summary

__all__ = [
    "PRIORITY_NAMES",
    "DeliveryLedger",
    "JobFormatError",
    "MemoryDeliveryLedger",
    "MlflowEvent",
    "Submission",
    "Translation",
    "WebhookRejected",
    "WebhookTemplates",
    "claim_delivery",
    "decode_submission",
    "dry_run_summary",
    "encode_binary",
    "encode_structured",
    "load_job_document",
    "parse_envelope",
    "parse_sbatch",
    "priority_of",
    "verify_request",
    "verify_signature",
]
