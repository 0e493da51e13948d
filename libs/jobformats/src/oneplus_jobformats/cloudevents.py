"""CloudEvents over NATS (cloudevents/spec NATS protocol binding): headers and body to a job submission.

Structured mode: `Content-Type: application/cloudevents+json` and the event as JSON. Binary mode: every attribute
in a `ce-<attr>` header (percent-encoded), the body is the data. A body with neither is a plain job document.
The event's `data` is any job document `load_job_document` reads (a JobSpec, a Kubeflow manifest, an sbatch script).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, unquote_to_bytes

from cloudevents.core.exceptions import BaseCloudEventException
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent
from oneplus_contracts import JobSpec

from .errors import JobFormatError, Translation
from .load import load_job_document, parse_mapping, translate_mapping
from .text import LoneSurrogate, loads_unicode

STRUCTURED_CONTENT_TYPE = JSONFormat.CONTENT_TYPE
SUBMIT_EVENT_TYPE = "io.oneplus.job.submit"
MAX_BODY_BYTES = 1024 * 1024
_CE_PREFIX = "ce-"
# Binding: percent-encode space, '"', '%' and anything outside printable ASCII.
_SAFE = "".join(c for c in map(chr, range(0x21, 0x7F)) if c not in ' "%')
_ATTR_NAME = re.compile(r"[a-z0-9]{1,20}")
_JSON_TYPE = re.compile(r"(application|text)/([a-zA-Z0-9.\-]+\+)?json(;.*)?", re.DOTALL)
_WHERE = "<cloudevent>"


@dataclass
class Submission:
    """A job submission read off the bus: the event's identity (None for a plain body) and the spec."""

    event_id: str | None
    source: str | None
    type: str | None
    spec: JobSpec
    warnings: list[str] = field(default_factory=list)
    mode: str = "plain"
    attributes: dict[str, str] = field(default_factory=dict)
    kind: str = "JobSpec"


def _fail(problem: str, where: str | None = None) -> JobFormatError:
    return JobFormatError(problem, filename=_WHERE, where=where)


def _lower_headers(headers: Mapping[str, str] | None) -> dict[str, str]:
    if not headers:
        return {}
    out: dict[str, str] = {}
    for k, v in headers.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise _fail(f"header {k!r} must have a string name and value")
        out[k.lower()] = v
    return out


def decode_header_value(name: str, raw: str) -> str:
    """A binary-mode header value: unquote an RFC 7230 quoted string, then one round of percent-decoding."""
    value = raw.strip()
    if len(value) >= 2 and value[0] == '"' and value[-1] == '"':
        value = re.sub(r"\\(.)", r"\1", value[1:-1])
    if re.search(r"%(?![0-9A-Fa-f]{2})", value):
        raise _fail(f"header {name!r}: malformed percent-encoding in {raw!r}")
    try:
        return unquote_to_bytes(value).decode("utf-8")
    except UnicodeDecodeError:
        raise _fail(f"header {name!r}: percent-encoded bytes are not valid UTF-8 ({raw!r})") from None


def encode_header_value(value: str) -> str:
    return quote(value, safe=_SAFE)


def decode_submission(headers: Mapping[str, str] | None, body: bytes) -> Submission:
    """Structured, binary or plain: the mode is chosen by the headers, as the NATS binding says."""
    if len(body) > MAX_BODY_BYTES:
        raise _fail(f"message body is larger than {MAX_BODY_BYTES} bytes")
    hdrs = _lower_headers(headers)
    content_type = hdrs.get("content-type", "").strip().lower()
    if content_type.startswith("application/cloudevents"):
        if content_type.startswith("application/cloudevents-batch"):
            raise _fail("batched CloudEvents are not supported; send one event per message")
        return _structured(body)
    if any(k.startswith(_CE_PREFIX) for k in hdrs):
        return _binary(hdrs, body)
    return _plain(body)


def _text(body: bytes) -> str:
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _fail(f"body is not UTF-8 (byte {exc.start})") from None


def _plain(body: bytes) -> Submission:
    # Not this process's directory: the submitter's is not known here.
    translation = load_job_document(_text(body), filename="<message>", submit_dir="")
    return Submission(None, None, None, translation.spec, translation.warnings, "plain", {}, translation.kind)


def _structured(body: bytes) -> Submission:
    text = _text(body)
    try:
        event = loads_unicode(text)
    except json.JSONDecodeError as exc:
        raise _fail(f"structured event is not JSON: {exc.msg}", f"line {exc.lineno}") from None
    except LoneSurrogate as exc:
        raise _fail(str(exc)) from None
    except RecursionError:
        raise _fail("structured event is nested too deeply") from None
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        raise _fail(f"structured event has an unreadable value: {str(exc).split(';')[0]}") from None
    if not isinstance(event, dict):
        raise _fail(f"structured event must be a JSON object, got {type(event).__name__}")
    data: Any = event.pop("data", None)
    data_b64 = event.pop("data_base64", None)
    if data is not None and data_b64 is not None:
        raise _fail("event has both data and data_base64")
    if data_b64 is not None:
        if not isinstance(data_b64, str):
            raise _fail("data_base64 must be a string")
        try:
            data = base64.b64decode(data_b64, validate=True)
        except (binascii.Error, ValueError):
            raise _fail("data_base64 is not valid base64") from None
    return _submission(dict(event), data, "structured")


def _binary(hdrs: dict[str, str], body: bytes) -> Submission:
    attributes: dict[str, Any] = {}
    for key, raw in hdrs.items():
        if not key.startswith(_CE_PREFIX):
            continue
        attributes[key[len(_CE_PREFIX) :]] = decode_header_value(key, raw)
    if "datacontenttype" not in attributes and "content-type" in hdrs:
        attributes["datacontenttype"] = hdrs["content-type"]  # the HTTP binding's mapping, accepted for leniency
    return _submission(attributes, body if body else None, "binary")


def _check_attributes(attributes: dict[str, Any]) -> dict[str, Any]:
    for name in ("specversion", "id", "source", "type"):
        if name not in attributes or attributes[name] in (None, ""):
            raise _fail(f"required attribute {name!r} is missing")
    if attributes["specversion"] != "1.0":
        raise _fail(f"specversion {attributes['specversion']!r} is not supported; use 1.0")
    for name, value in attributes.items():
        if not _ATTR_NAME.fullmatch(name):
            raise _fail(f"attribute name {name!r} must be 1-20 lower-case letters or digits")
        if not isinstance(value, (str, int)):  # CloudEvents types: string, integer, boolean (and URI/time as text)
            raise _fail(f"attribute {name!r} must be a string, integer or boolean, got {type(value).__name__}")
    if "time" in attributes:
        try:
            when = datetime.fromisoformat(str(attributes["time"]).replace("Z", "+00:00"))
        except ValueError:
            raise _fail(f"attribute 'time' {attributes['time']!r} is not an RFC 3339 timestamp") from None
        attributes = {**attributes, "time": when if when.tzinfo else when.replace(tzinfo=UTC)}
    return attributes


def _submission(attributes: dict[str, Any], data: Any, mode: str) -> Submission:
    attributes = _check_attributes(attributes)
    try:
        event = CloudEvent(dict(attributes), data)
    except (BaseCloudEventException, ValueError, TypeError) as exc:
        raise _fail(f"invalid CloudEvent: {exc}") from None
    content_type = str(attributes.get("datacontenttype") or "application/json")
    translation = _data_to_job(event.get_data(), content_type)
    flat = {k: v.isoformat() if isinstance(v, datetime) else str(v) for k, v in event.get_attributes().items()}
    return Submission(
        event_id=event.get_id(),
        source=event.get_source(),
        type=event.get_type(),
        spec=translation.spec,
        warnings=translation.warnings,
        mode=mode,
        attributes=flat,
        kind=translation.kind,
    )


def _data_to_job(data: Any, content_type: str) -> Translation:
    where = "<cloudevent data>"
    if data is None:
        raise _fail("the event has no data; it must carry the job (a JobSpec, a Kubeflow manifest or an sbatch script)")
    if isinstance(data, dict):
        return translate_mapping(data, filename=where)
    if isinstance(data, (bytes, bytearray)):
        try:
            data = bytes(data).decode("utf-8")
        except UnicodeDecodeError:
            raise _fail("the event data is not UTF-8 text") from None
    if isinstance(data, str):
        if _JSON_TYPE.fullmatch(content_type.strip().lower()):
            return translate_mapping(parse_mapping(data, filename=where), filename=where)
        return load_job_document(data, filename=where, submit_dir="")
    raise _fail(f"the event data must be an object or text, got {type(data).__name__}")


def _event(spec: JobSpec, source: str, id: str | None, type: str, time: datetime | None) -> CloudEvent:
    attributes: dict[str, Any] = {"source": source, "type": type, "datacontenttype": "application/json"}
    if id is not None:
        attributes["id"] = id
    if time is not None:
        attributes["time"] = time
    return CloudEvent(attributes, spec.model_dump(mode="json", exclude_defaults=True))


def encode_structured(
    spec: JobSpec, source: str, id: str | None = None, *, type: str = SUBMIT_EVENT_TYPE, time: datetime | None = None
) -> tuple[dict[str, str], bytes]:
    """Headers and body of a structured-mode event carrying `spec` (id: a fresh UUID when None)."""
    event = _event(spec, source, id, type, time)
    return {"content-type": STRUCTURED_CONTENT_TYPE}, JSONFormat().write(event)


def encode_binary(
    spec: JobSpec, source: str, id: str | None = None, *, type: str = SUBMIT_EVENT_TYPE, time: datetime | None = None
) -> tuple[dict[str, str], bytes]:
    """Headers (`ce-*`, percent-encoded per the binding) and body (the spec's JSON) of a binary-mode event."""
    event = _event(spec, source, id, type, time)
    headers: dict[str, str] = {}
    for name, value in event.get_attributes().items():
        text = value.isoformat().replace("+00:00", "Z") if isinstance(value, datetime) else str(value)
        headers[_CE_PREFIX + name] = encode_header_value(text)
    body = json.dumps(event.get_data(), separators=(",", ":")).encode("utf-8")
    return headers, body
