"""Bounded redelivery, then a dead-letter subject that says why.

FastStream's default policy terminates a message whose handler raised; here a failing message is
NAKed with a growing delay until `max_deliver`, and then published to `oneplus.dlq.<subject>` with
the reason before it is acknowledged. A message that cannot even be decoded goes there at once.
"""

from __future__ import annotations

import json
import logging
import time
import traceback
import uuid
import weakref
from typing import Any

from faststream._internal.middlewares import BaseMiddleware
from faststream.exceptions import HandlerException, NackMessage
from oneplus_contracts import subjects
from prometheus_client import CollectorRegistry, Counter
from pydantic import ValidationError

log = logging.getLogger("oneplus.deadletter")
# Each broker's dead-letter counter, in its service's registry (make_broker sets it up).
_COUNTERS: weakref.WeakKeyDictionary[Any, Counter] = weakref.WeakKeyDictionary()


def count_dead_letters(broker: Any, registry: CollectorRegistry) -> Counter:
    """Count the dead letters `broker` publishes into `registry` (as `oneplus_dead_letters_total`)."""
    counter = Counter(
        "oneplus_dead_letters",
        "Messages given up on and published to oneplus.dlq.<subject>: after max_deliver failed deliveries, or at once "
        "when they cannot be decoded; by source stream and the handler's exception type",
        ["stream", "error"],
        registry=registry,
    )
    _COUNTERS[broker] = counter
    return counter


def _delivered(msg: Any) -> int:
    try:
        return int(msg.raw_message.metadata.num_delivered)
    except Exception:  # a core (non-JetStream) message has no metadata: one delivery only
        return 1


def _is_poison(exc: BaseException) -> bool:
    return isinstance(exc, ValidationError | json.JSONDecodeError | UnicodeDecodeError)


def dead_letter_middleware(max_deliver: int) -> type[BaseMiddleware]:
    class DeadLetterMiddleware(BaseMiddleware):
        async def consume_scope(self, call_next: Any, msg: Any) -> Any:
            try:
                return await call_next(msg)
            except HandlerException:
                raise
            except Exception as exc:
                delivered = _delivered(msg)
                raw = getattr(msg, "raw_message", None)
                if raw is None or getattr(raw, "reply", "") == "" or not _is_jetstream(raw):
                    raise
                if _is_poison(exc) or delivered >= max_deliver:
                    await _publish_dead_letter(self.context, raw, exc, delivered)
                    return None
                raise NackMessage(delay=min(0.2 * 2 ** (delivered - 1), 5.0)) from exc

    return DeadLetterMiddleware


def _is_jetstream(raw: Any) -> bool:
    return str(getattr(raw, "reply", "")).startswith("$JS.ACK")


async def _publish_dead_letter(context: Any, raw: Any, exc: BaseException, delivered: int) -> None:
    broker = context.get("broker")
    meta = raw.metadata if _is_jetstream(raw) else None  # a core NATS message (a heartbeat) has no stream place
    reason = f"{type(exc).__name__}: {exc}"
    log.error("dead-lettering %s after %d deliveries: %s", raw.subject, delivered, reason)
    headers = {
        "Oneplus-Dlq-Reason": reason[:1000].replace("\n", " "),
        "Oneplus-Dlq-Subject": raw.subject,
        "Oneplus-Dlq-Deliveries": str(delivered),
        "Oneplus-Dlq-Ts": str(time.time()),
        "Nats-Msg-Id": f"dlq-{raw.subject}-{meta.sequence.stream if meta else uuid.uuid4().hex}",
    }
    body = {
        "subject": raw.subject,
        "reason": reason,
        "deliveries": delivered,
        "trace": traceback.format_exception_only(type(exc), exc)[-1].strip(),
        "data": raw.data.decode("utf-8", "replace"),
    }
    await broker.publish(
        json.dumps(body), subjects.dead_letter(raw.subject), headers=headers, stream=subjects.DEAD_LETTER_STREAM
    )
    counter = _COUNTERS.get(broker)
    if counter is not None:
        stream = (meta.stream if meta else None) or "none"
        counter.labels(stream=str(stream), error=type(exc).__name__).inc()
