"""MLflow delivery ids remembered in a NATS KV bucket, so every intake replica refuses the same repeat."""

from __future__ import annotations

import contextlib
import hashlib
import time

from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue


def _key(delivery_id: str) -> str:
    # Delivery ids are the sender's text; a digest is always a valid KV key.
    return hashlib.sha256(delivery_id.encode("utf-8", "surrogatepass")).hexdigest()


class NatsDeliveryLedger:
    """`claim` is a KV create: the first claim of an id wins, a repeat within the bucket's TTL loses."""

    def __init__(self, kv: KeyValue) -> None:
        self.kv = kv

    async def claim(self, delivery_id: str) -> bool:
        try:
            await self.kv.create(_key(delivery_id), str(time.time()).encode())
        except KeyWrongLastSequenceError:
            return False
        except Exception as exc:  # nats-py raises BadRequestError for create() on an existing key
            if "wrong last sequence" in str(exc):
                return False
            raise
        return True

    async def release(self, delivery_id: str) -> None:
        """Forget a claim whose delivery failed on our side, so the sender's retry is processed."""
        with contextlib.suppress(KeyNotFoundError):
            await self.kv.delete(_key(delivery_id))
