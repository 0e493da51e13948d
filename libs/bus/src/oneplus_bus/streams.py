"""JetStream streams and KV buckets, declared idempotently at every service start."""

from __future__ import annotations

from nats.js import JetStreamContext
from nats.js.api import StorageType, StreamConfig
from nats.js.errors import BadRequestError, NotFoundError
from nats.js.kv import KeyValue
from oneplus_contracts import subjects

# Dedupe window for Nats-Msg-Id: a retried submission within it is not a second job.
DUPLICATE_WINDOW_S = 600.0

KV_HISTORY = {
    subjects.JOBS_KV: 5,
    subjects.TOPOLOGY_KV: 5,
    subjects.QUEUES_KV: 5,
    subjects.SOLVER_STATE_KV: 1,
    subjects.WEBHOOK_DELIVERIES_KV: 1,
}
# Buckets whose entries expire (seconds); the webhook ledger must outlive MLflow's replay window.
KV_TTL = {subjects.WEBHOOK_DELIVERIES_KV: subjects.WEBHOOK_DELIVERIES_TTL_S}


async def ensure_streams(js: JetStreamContext) -> None:
    for name, subs in subjects.STREAMS.items():
        cfg = StreamConfig(
            name=name,
            subjects=subs,
            storage=StorageType.FILE,
            duplicate_window=DUPLICATE_WINDOW_S,
            # Heartbeats are only news while fresh: keep a short tail per node, not a history.
            max_msgs_per_subject=50 if name == subjects.NODES_STREAM else -1,
        )
        try:
            info = await js.stream_info(name)
        except NotFoundError:
            try:
                await js.add_stream(cfg)
            except BadRequestError:
                # Another service declared it between our look and our add.
                await js.stream_info(name)
            continue
        if sorted(info.config.subjects or []) != sorted(subs):
            await js.update_stream(cfg)


async def ensure_kv(js: JetStreamContext) -> dict[str, KeyValue]:
    buckets: dict[str, KeyValue] = {}
    for bucket, history in KV_HISTORY.items():
        try:
            buckets[bucket] = await js.key_value(bucket)
        except (NotFoundError, BadRequestError):
            try:
                buckets[bucket] = await js.create_key_value(bucket=bucket, history=history, ttl=KV_TTL.get(bucket))
            except BadRequestError:
                buckets[bucket] = await js.key_value(bucket)
    return buckets
