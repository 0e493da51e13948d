"""MLflow webhooks (MLflow >= 3.3): signature check, replay window, delivery dedupe and the event envelope.

Signature: `X-MLflow-Signature: v1,<base64 HMAC-SHA256(secret, f"{delivery_id}.{timestamp}.{raw_body}")>`,
timestamp in Unix seconds (`X-MLflow-Timestamp`), one `X-MLflow-Delivery-Id` per delivery (mlflow/webhooks/delivery.py).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from .text import LoneSurrogate, loads_unicode
from .webhook_templates import EVENT_FIELDS, WebhookTemplates

__all__ = [
    "DELIVERY_ID_HEADER",
    "EVENT_FIELDS",
    "SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "DeliveryLedger",
    "MemoryDeliveryLedger",
    "MlflowEvent",
    "WebhookRejected",
    "WebhookTemplates",
    "claim_delivery",
    "parse_envelope",
    "sign",
    "verify_request",
    "verify_signature",
]

SIGNATURE_HEADER = "X-MLflow-Signature"
TIMESTAMP_HEADER = "X-MLflow-Timestamp"
DELIVERY_ID_HEADER = "X-MLflow-Delivery-Id"
MAX_BODY_BYTES = 1024 * 1024
_EVENT_NAME = re.compile(r"[a-z][a-z_]{0,63}")


class WebhookRejected(ValueError):
    """A webhook delivery refused, with a stable `code` for metrics and the HTTP status to answer."""

    def __init__(self, code: str, reason: str, *, http_status: int = 400) -> None:
        self.code = code
        self.reason = reason
        self.http_status = http_status
        super().__init__(f"{code}: {reason}")


def sign(secret: str, delivery_id: str, timestamp: str, raw_body: bytes) -> str:
    """The header value MLflow sends: `v1,` + base64 of the HMAC-SHA256 of `delivery_id.timestamp.body`."""
    signed = f"{delivery_id}.{timestamp}.".encode("utf-8", "surrogatepass") + raw_body
    digest = hmac.new(secret.encode("utf-8", "surrogatepass"), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode("ascii")


def verify_signature(
    secret: str,
    delivery_id: str,
    timestamp: str,
    raw_body: bytes,
    signature_header: str,
    *,
    now: float,
    tolerance_s: int = 300,
) -> None:
    """Raise WebhookRejected unless the delivery is signed with `secret` and its timestamp is within tolerance."""
    if not secret:
        raise WebhookRejected("no_secret", "no webhook secret is configured for this endpoint", http_status=500)
    if not delivery_id:
        raise WebhookRejected("missing_delivery_id", f"header {DELIVERY_ID_HEADER} is missing")
    if not timestamp:
        raise WebhookRejected("missing_timestamp", f"header {TIMESTAMP_HEADER} is missing")
    if not signature_header:
        raise WebhookRejected("missing_signature", f"header {SIGNATURE_HEADER} is missing", http_status=401)
    if not re.fullmatch(r"[0-9]{1,12}", timestamp.strip()):
        raise WebhookRejected(
            "bad_timestamp", f"header {TIMESTAMP_HEADER} must be Unix seconds, got {timestamp[:40]!r}"
        )
    age = now - int(timestamp)
    if abs(age) > tolerance_s:
        said = f"{int(age)} s old" if age > 0 else f"{int(-age)} s in the future"
        raise WebhookRejected(
            "stale_timestamp", f"timestamp {timestamp} is {said}; the replay window is {tolerance_s} s", http_status=401
        )
    candidates = _signatures(signature_header)
    expected = base64.b64decode(sign(secret, delivery_id, timestamp, raw_body)[3:])
    if not any(hmac.compare_digest(expected, c) for c in candidates):
        raise WebhookRejected("signature_mismatch", "the signature does not match the body and secret", http_status=401)


def _signatures(header: str) -> list[bytes]:
    """Every `v1,<base64>` entry of the header (Standard Webhooks allows several, space-separated)."""
    out: list[bytes] = []
    for entry in header.split():
        version, comma, b64 = entry.partition(",")
        if version != "v1" or not comma:
            raise WebhookRejected("bad_signature_format", f"signature {entry[:40]!r} is not of the form v1,<base64>")
        try:
            out.append(base64.b64decode(b64, validate=True))
        except (binascii.Error, ValueError):
            raise WebhookRejected("bad_signature_format", f"signature {entry[:40]!r} is not valid base64") from None
    if not out:
        raise WebhookRejected("bad_signature_format", "the signature header is empty")
    return out


def verify_request(
    secret: str, headers: Mapping[str, str], raw_body: bytes, *, now: float | None = None, tolerance_s: int = 300
) -> str:
    """verify_signature with the three headers read case-insensitively; returns the delivery id."""
    lower = {k.lower(): v for k, v in headers.items()}
    delivery_id = lower.get(DELIVERY_ID_HEADER.lower(), "")
    verify_signature(
        secret,
        delivery_id,
        lower.get(TIMESTAMP_HEADER.lower(), ""),
        raw_body,
        lower.get(SIGNATURE_HEADER.lower(), ""),
        now=time.time() if now is None else now,
        tolerance_s=tolerance_s,
    )
    return delivery_id


@dataclass
class MlflowEvent:
    """One webhook envelope: `{"entity", "action", "timestamp", "data", ["workspace"]}`."""

    entity: str
    action: str
    timestamp: str
    data: dict[str, Any]
    workspace: str | None = None

    @property
    def event(self) -> str:
        return f"{self.entity}.{self.action}"


def parse_envelope(raw_body: bytes) -> MlflowEvent:
    """The envelope of a delivery; a known event type must carry the data fields MLflow documents for it."""
    if len(raw_body) > MAX_BODY_BYTES:
        raise WebhookRejected("bad_body", f"body is larger than {MAX_BODY_BYTES} bytes", http_status=413)
    try:
        envelope = loads_unicode(raw_body.decode("utf-8"))
    except UnicodeDecodeError:
        raise WebhookRejected("bad_body", "body is not UTF-8") from None
    except LoneSurrogate as exc:
        raise WebhookRejected("bad_body", str(exc)) from None
    except json.JSONDecodeError as exc:
        raise WebhookRejected("bad_body", f"body is not JSON: {exc.msg} at line {exc.lineno}") from None
    except RecursionError:
        raise WebhookRejected("bad_body", "body is nested too deeply") from None
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        raise WebhookRejected("bad_body", f"unreadable value: {str(exc).split(';')[0]}") from None
    if not isinstance(envelope, dict):
        raise WebhookRejected("bad_body", f"body must be a JSON object, got {type(envelope).__name__}")
    for key in ("entity", "action", "data"):
        if key not in envelope:
            raise WebhookRejected("bad_body", f"envelope has no {key!r}")
    entity, action, data = envelope["entity"], envelope["action"], envelope["data"]
    for key, value in (("entity", entity), ("action", action)):
        if not isinstance(value, str) or not _EVENT_NAME.fullmatch(value):
            raise WebhookRejected("bad_body", f"envelope {key} must be a lower-case word, got {value!r}")
    if not isinstance(data, dict):
        raise WebhookRejected("bad_body", f"envelope data must be an object, got {type(data).__name__}")
    stamp = envelope.get("timestamp", "")
    workspace = envelope.get("workspace")
    if not isinstance(stamp, str) or (workspace is not None and not isinstance(workspace, str)):
        raise WebhookRejected("bad_body", "envelope timestamp and workspace must be strings")
    event = MlflowEvent(entity=entity, action=action, timestamp=stamp, data=data, workspace=workspace)
    _check_fields(event)
    return event


def _check_fields(event: MlflowEvent) -> None:
    known = EVENT_FIELDS.get(event.event)
    if known is None:
        return  # a newer MLflow's event: no template can name it, so it maps to no job
    required, _optional = known
    for name in required:
        if name not in event.data:
            raise WebhookRejected("bad_body", f"{event.event} data has no {name!r}")
        value = event.data[name]
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise WebhookRejected("bad_body", f"{event.event} data {name!r} must be a string, got {value!r}")


class DeliveryLedger(Protocol):
    """Remembers delivery ids; the intake service backs it with a NATS KV bucket (create = claim)."""

    async def claim(self, delivery_id: str) -> bool:
        """True the first time an id is claimed, False for a repeat within the ledger's retention."""
        ...


@dataclass
class MemoryDeliveryLedger:
    """An in-process ledger for tests and a single intake; ids are forgotten after `retention_s`."""

    retention_s: float = 3600.0
    clock: Callable[[], float] = time.time
    _seen: dict[str, float] = field(default_factory=dict)

    async def claim(self, delivery_id: str) -> bool:
        now = self.clock()
        expired = [k for k, t in self._seen.items() if now - t > self.retention_s]
        for k in expired:
            del self._seen[k]
        if delivery_id in self._seen:
            return False
        self._seen[delivery_id] = now
        return True


async def claim_delivery(ledger: DeliveryLedger, delivery_id: str) -> None:
    """Raise WebhookRejected for a delivery id that was already processed."""
    if not await ledger.claim(delivery_id):
        raise WebhookRejected("duplicate_delivery", f"delivery {delivery_id!r} was already processed", http_status=409)
