"""JetStream streams and KV buckets, declared idempotently at every service start."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass

from nats.js import JetStreamContext
from nats.js.api import StorageType, StreamConfig
from nats.js.errors import APIError, BadRequestError, NotFoundError
from nats.js.kv import KeyValue
from oneplus_contracts import subjects

# Dedupe window for Nats-Msg-Id: a retried submission within it is not a second job.
DUPLICATE_WINDOW_S = 600.0

DAY_S = 86400.0
ARCHIVE_RETENTION_S = 30 * DAY_S  # ONEPLUS_ARCHIVE_RETENTION_S: how long a finished job stays findable
ARCHIVE_MAX_BYTES = 10 * 1024**3  # ONEPLUS_ARCHIVE_MAX_BYTES: the archive's disk budget; the oldest go first
AUDIT_MAX_BYTES = 2 * 1024**3  # the reservation audit's disk budget
JOBS_STREAM_MAX_MSGS = 10_000_000  # ONEPLUS_JOBS_STREAM_MAX_MSGS: job events kept, whatever their age
MAX_REPLICAS = 5  # JetStream keeps at most five copies of a stream
# Streams read by key on a hot path: a direct get is one request to the stream (any replica may answer) instead of
# a JSON API call with a base64 body and an advisory. The archive is read once per submission (a retry's lookup).
DIRECT_GET_STREAMS = frozenset({subjects.ARCHIVE_STREAM})


class StreamSetupError(RuntimeError):
    """The server refused a stream or bucket as configured (e.g. replicas on a server that is not clustered)."""


def stream_replicas(env: Mapping[str, str] | None = None) -> int:
    """ONEPLUS_STREAM_REPLICAS: copies of every stream and KV bucket (1: one server; 3: a three-server cluster)."""
    env = os.environ if env is None else env
    raw = env.get("ONEPLUS_STREAM_REPLICAS", "").strip()
    if not raw:
        return 1
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"ONEPLUS_STREAM_REPLICAS={raw!r} is not a whole number (1, or 3 on a cluster)") from None
    if not 1 <= value <= MAX_REPLICAS:
        raise ValueError(f"ONEPLUS_STREAM_REPLICAS={raw!r} must be between 1 and {MAX_REPLICAS}")
    return value


@dataclass(frozen=True)
class StreamLimits:
    """What a stream keeps (NATS' own units; 0 or -1: no limit). The oldest messages go first (DiscardPolicy.OLD)."""

    max_age: float = 0.0  # seconds
    max_bytes: int = -1
    max_msgs: int = -1
    max_msgs_per_subject: int = -1


def stream_limits(name: str, env: Mapping[str, str] | None = None) -> StreamLimits:
    """The limits of one of `subjects.STREAMS`, from the environment's knobs; every stream is bounded."""
    env = os.environ if env is None else env
    retention = _knob(env, "ONEPLUS_ARCHIVE_RETENTION_S", ARCHIVE_RETENTION_S)
    limits = {
        # The event log is kept as long as the archive unless told otherwise: a job's history outlives its record no
        # longer. A shorter log bounds the broker's memory, which holds an index entry for each of a job's subjects.
        subjects.JOBS_STREAM: StreamLimits(
            max_age=_knob(env, "ONEPLUS_JOB_EVENTS_RETENTION_S", retention),
            max_msgs=int(_knob(env, "ONEPLUS_JOBS_STREAM_MAX_MSGS", JOBS_STREAM_MAX_MSGS)),
        ),
        # A node's reports and losses are only news while fresh: keep a short tail per node, not a history.
        subjects.NODES_STREAM: StreamLimits(max_msgs_per_subject=50),
        subjects.COMMANDS_STREAM: StreamLimits(max_age=DAY_S),
        subjects.FACTS_STREAM: StreamLimits(max_age=DAY_S),
        subjects.DEAD_LETTER_STREAM: StreamLimits(max_age=7 * DAY_S),
        # One message per archived job (its subject names the job), kept for the retention, within a disk budget.
        subjects.ARCHIVE_STREAM: StreamLimits(
            max_age=retention,
            max_bytes=int(_knob(env, "ONEPLUS_ARCHIVE_MAX_BYTES", ARCHIVE_MAX_BYTES)),
            max_msgs_per_subject=1,
        ),
    }
    # The reservation audit is kept as long as job history: double use is looked for over the same span.
    limits[subjects.AUDIT_STREAM] = StreamLimits(max_age=retention, max_bytes=AUDIT_MAX_BYTES)
    return limits.get(name, StreamLimits())


def _knob(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number") from None
    if value <= 0:
        raise ValueError(f"{name}={raw!r} must be positive")
    return value


def _limits_of(cfg: StreamConfig) -> list[int]:
    """Comparable limits of a stream's config: ages in whole nanoseconds, any unlimited value as -1."""
    values = [round((cfg.max_age or 0) * 1e9), cfg.max_bytes, cfg.max_msgs, cfg.max_msgs_per_subject]
    return [v if v is not None and v > 0 else -1 for v in values]


KV_HISTORY = {
    subjects.JOBS_KV: 5,
    subjects.TOPOLOGY_KV: 5,
    subjects.HEARTBEATS_KV: 1,
    subjects.QUEUES_KV: 5,
    subjects.ADVANCE_RESERVATIONS_KV: 5,
    subjects.SOLVER_STATE_KV: 1,
    subjects.WEBHOOK_DELIVERIES_KV: 1,
}
# Buckets whose entries expire (seconds); the webhook ledger must outlive MLflow's replay window.
KV_TTL = {subjects.WEBHOOK_DELIVERIES_KV: subjects.WEBHOOK_DELIVERIES_TTL_S}


async def ensure_streams(js: JetStreamContext, replicas: int | None = None) -> None:
    """Every stream of `subjects.STREAMS`, with its limits and `replicas` copies (default ONEPLUS_STREAM_REPLICAS).

    A stream that exists with other subjects, limits or replica count is updated to these.
    """
    replicas = stream_replicas() if replicas is None else replicas
    for name, subs in subjects.STREAMS.items():
        limits = stream_limits(name)
        cfg = StreamConfig(
            name=name,
            subjects=subs,
            storage=StorageType.FILE,
            num_replicas=replicas,
            # NATS refuses a dedupe window longer than the stream keeps messages.
            duplicate_window=min(DUPLICATE_WINDOW_S, limits.max_age or DUPLICATE_WINDOW_S),
            max_age=limits.max_age,
            max_bytes=limits.max_bytes,
            max_msgs=limits.max_msgs,
            max_msgs_per_subject=limits.max_msgs_per_subject,
            allow_direct=True if name in DIRECT_GET_STREAMS else None,
        )
        try:
            info = await js.stream_info(name)
        except NotFoundError:
            try:
                await js.add_stream(cfg)
            except APIError as exc:
                try:
                    # Another service declared it between our look and our add.
                    await js.stream_info(name)
                except NotFoundError:
                    raise _refused("stream", name, replicas, exc) from None
            continue
        # A stream made before its limits were set, or under other knobs, takes the current ones.
        if (
            sorted(info.config.subjects or []) != sorted(subs)
            or _limits_of(info.config) != _limits_of(cfg)
            or (info.config.num_replicas or 1) != replicas
            or bool(info.config.allow_direct) != bool(cfg.allow_direct)
        ):
            try:
                await js.update_stream(cfg)
            except APIError as exc:
                raise _refused("stream", name, replicas, exc) from None


def _refused(kind: str, name: str, replicas: int, exc: APIError) -> StreamSetupError:
    hint = " (more than one replica needs a JetStream cluster)" if replicas > 1 else ""
    return StreamSetupError(
        f"NATS refused {kind} {name} with {replicas} replica(s){hint}: {exc.description or exc}; "
        "set ONEPLUS_STREAM_REPLICAS to the copies this NATS can keep"
    )


async def ensure_kv(js: JetStreamContext, replicas: int | None = None) -> dict[str, KeyValue]:
    """Every KV bucket, with `replicas` copies (default ONEPLUS_STREAM_REPLICAS); an existing one is re-replicated."""
    replicas = stream_replicas() if replicas is None else replicas
    buckets: dict[str, KeyValue] = {}
    for bucket, history in KV_HISTORY.items():
        try:
            buckets[bucket] = await js.key_value(bucket)
        except (NotFoundError, BadRequestError):
            try:
                buckets[bucket] = await js.create_key_value(
                    bucket=bucket, history=history, ttl=KV_TTL.get(bucket), replicas=replicas
                )
            except APIError as exc:
                try:
                    buckets[bucket] = await js.key_value(bucket)
                except (NotFoundError, BadRequestError):
                    raise _refused("KV bucket", bucket, replicas, exc) from None
            continue
        # A bucket's data is the stream KV_<bucket>: one made under another replica count takes this one.
        info = await js.stream_info(f"KV_{bucket}")
        if (info.config.num_replicas or 1) != replicas:
            try:
                await js.update_stream(dataclasses.replace(info.config, num_replicas=replicas))
            except APIError as exc:
                raise _refused("KV bucket", bucket, replicas, exc) from None
    return buckets
