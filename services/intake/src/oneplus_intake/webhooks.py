"""`POST /webhooks/mlflow`: verify, refuse repeats, turn the event into the jobs its templates name.

Order: signature and replay window (the raw body, before anything reads it), envelope, delivery id (a repeat is
409), templates, then each job through the same path as a NATS submission with the delivery id as its
submission id. A failure on our side releases the delivery id, so MLflow's retry is processed, not refused.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from oneplus_bus.tenancy import Caller
from oneplus_jobformats.errors import JobFormatError
from oneplus_jobformats.mlflow import WebhookRejected, WebhookTemplates, parse_envelope, verify_request

from .submissions import ACCEPTED, DUPLICATE, Intake

log = logging.getLogger("oneplus.intake.mlflow")


class ReleasableLedger(Protocol):
    async def claim(self, delivery_id: str) -> bool: ...

    async def release(self, delivery_id: str) -> None: ...


def load_templates(path: Path | None) -> WebhookTemplates:
    """The templates file named by ONEPLUS_MLFLOW_TEMPLATES; none configured means events start no job."""
    if path is None:
        return WebhookTemplates([])
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise JobFormatError(f"cannot read the webhook templates: {exc.strerror}", filename=str(path)) from None
    return WebhookTemplates.from_yaml(text, filename=str(path))


def _status(exc: WebhookRejected) -> int:
    # A stale timestamp is a replay, not a wrong secret: 400 like other malformed deliveries; 401 is the signature.
    return 400 if exc.code == "stale_timestamp" else exc.http_status


def submission_id(delivery_id: str, index: int) -> str:
    """The first job of a delivery is named by the delivery id itself, the others by id and position."""
    return delivery_id if index == 0 else f"{delivery_id}.{index}"


@dataclass
class MlflowWebhook:
    secret: str
    templates: WebhookTemplates
    ledger: ReleasableLedger
    intake: Intake
    replay_window_s: int = 300
    clock: Callable[[], float] = time.time

    async def deliver(self, headers: Mapping[str, str], raw_body: bytes) -> tuple[int, dict[str, Any]]:
        """HTTP status and JSON answer for one delivery."""
        try:
            delivery_id = verify_request(
                self.secret, headers, raw_body, now=self.clock(), tolerance_s=self.replay_window_s
            )
            event = parse_envelope(raw_body)
        except WebhookRejected as exc:
            log.info("mlflow delivery refused: %s", exc)
            return _status(exc), {"ok": False, "code": exc.code, "error": exc.reason}
        if not await self.ledger.claim(delivery_id):
            reason = f"delivery {delivery_id!r} was already processed"
            return 409, {"ok": False, "code": "duplicate_delivery", "error": reason}
        try:
            return await self._jobs(delivery_id, event.event, self.templates.jobs_for(event))
        except JobFormatError as exc:
            # The delivery is fine; the templates cannot make a job of it. A retry would fail the same way.
            return 422, {"ok": False, "code": "bad_template", "error": str(exc), "delivery_id": delivery_id}
        except BaseException:
            await self.ledger.release(delivery_id)
            raise

    async def _jobs(self, delivery_id: str, event: str, specs: list[Any]) -> tuple[int, dict[str, Any]]:
        jobs: list[dict[str, Any]] = []
        refused = False
        for i, spec in enumerate(specs):
            outcome = await self.intake.accept(
                spec,
                submission_id=submission_id(delivery_id, i),
                source="mlflow",
                warnings=[],
                caller=Caller(team=None),  # the templates name the team; whoever holds the secret wrote them
            )
            refused = refused or outcome.status not in (ACCEPTED, DUPLICATE)
            jobs.append({"name": spec.name, **outcome.reply.model_dump(mode="json")})
        log.info("mlflow %s delivery %s: %d job(s)", event, delivery_id, len(jobs))
        body = {"ok": not refused, "delivery_id": delivery_id, "event": event, "jobs": jobs}
        return (422 if refused else 200), body
