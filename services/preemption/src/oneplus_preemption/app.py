"""preemption: a thin compatibility consumer of `oneplus.cmd.preemption.request`, for operators' manual requests.

The job owner (placement-solver) chooses victims in its scheduling cycle, records them `preempting` itself and
sends their checkpoint commands; the grace timer and the kill after it are the owner's too. This service keeps the
request subject working for what outside sends it: each named victim (or, for an elastic resize, the job itself)
is read from the hot view and reported `preempting` for the attempt it runs; the owner refuses one that moved on,
and its reaction to one that applied sends the commands. A request that names no victim is left to the owner's
cycle, which considers preemption for every pending job anyway. No working set: one read of a record per victim.
"""

from __future__ import annotations

import logging

from faststream.nats import NatsMessage
from oneplus_bus.service import OneplusService
from oneplus_bus.settings import BusSettings
from oneplus_contracts import JobRecord, PreemptionRequest, subjects
from oneplus_queueing.preemption import preempting_event
from prometheus_client import Counter

from .settings import PreemptionSettings

log = logging.getLogger("oneplus.preemption")

HOLDS_GPUS = ("PLACED", "STARTING", "RUNNING")  # the states `preempting` applies to


class Preemption:
    """Forwards manual preemption requests to the job owner as `preempting` facts."""

    def __init__(self, svc: OneplusService) -> None:
        self.svc = svc
        self.forwarded = Counter(
            "oneplus_preemption_requests_forwarded",
            "Victims of manual preemption requests reported preempting to the job owner",
            registry=svc.metrics,
        )

    async def record(self, job_id: str) -> JobRecord | None:
        """The job's record in the hot view; None when there is none (never submitted, or archived: finished)."""
        rec, _ = await self.svc.ledger.get(job_id)
        return rec

    async def handle(self, req: PreemptionRequest) -> list[str]:
        """Report each victim that holds GPUs now `preempting`; the ids reported (the owner may still refuse one)."""
        if not req.victims:
            log.info("%s: a request without victims; the owner's cycle chooses them for pending jobs", req.job_id)
            return []
        resize = req.victims == [req.job_id]
        out: list[str] = []
        for victim_id in dict.fromkeys(req.victims):
            rec = await self.record(victim_id)
            if rec is None or rec.state not in HOLDS_GPUS:
                log.info("%s: victim %s holds no GPUs now; not preempted", req.job_id, victim_id)
                continue
            if resize and rec.spec.elastic is None:
                log.info("%s: not elastic, a resize request is refused", req.job_id)
                continue
            event = preempting_event(rec, req.job_id, req.reason)
            if event is None:
                continue
            # A fact for the job's owner: it refuses it if the victim moved on since this read.
            await self.svc.ledger.report(event, traceparent=rec.traceparent)
            self.forwarded.inc()
            out.append(victim_id)
        return out


def build_preemption(settings: BusSettings | None = None) -> tuple[OneplusService, Preemption]:
    svc = OneplusService("preemption", "Forwards manual preemption requests to the job owner", settings)
    p = Preemption(svc)

    @svc.durable_subscriber(
        subjects.PREEMPTION_REQUEST, stream=subjects.COMMANDS_STREAM, consumer="preemption", title="preemption requests"
    )
    async def on_request(msg: NatsMessage) -> None:
        await p.handle(PreemptionRequest.model_validate_json(msg.body))

    return svc, p


def main() -> None:
    PreemptionSettings.load_or_exit()  # the bus scaffold's variables, checked before connecting
    svc, _ = build_preemption()
    svc.run()
