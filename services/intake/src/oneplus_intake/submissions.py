"""One way in for every submission (NATS request, HTTP POST, MLflow webhook): read, bind the team, admit, accept.

The submission id (CloudEvent id, `Nats-Msg-Id`, `Idempotency-Key`, MLflow delivery id) names the job, so a
retry is answered with the same job id and `duplicate: true`, never a second job. Ids are scoped by team, so
two teams that happen to use the same id get two jobs. Bad input gets a `job.rejected` event and an error
reply naming the problem; nothing already accepted is touched.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass

from oneplus_bus.informer import StreamTail, kv_list_and_watch
from oneplus_bus.ledger import NotDelivered, Reported, latest_entries, latest_values
from oneplus_bus.service import OneplusService
from oneplus_bus.telemetry import traceparent_of_current
from oneplus_bus.tenancy import Caller, TenancyError, bind_team
from oneplus_contracts import (
    JobAccepted,
    JobRecord,
    JobRejected,
    JobSpec,
    NodeRecord,
    SubmitReply,
    new_id,
    subjects,
)
from oneplus_contracts.advance import AdvanceReservation
from oneplus_contracts.arrays import ArrayError, task_job_id
from oneplus_jobformats.cloudevents import decode_submission
from oneplus_jobformats.errors import JobFormatError
from oneplus_jobformats.site import SiteMapError, site_from_env
from oneplus_queueing.advance import AdvanceBook, AdvanceReservationError, check_job
from oneplus_queueing.config import QueueConfig, QueueConfigError
from oneplus_stores.archive import JobArchive
from oneplus_stores.clusterview import QUEUES_KEY, live_queue_config
from pydantic import ValidationError

from .admission import ClusterFacts, EmptyCluster, Inadmissible, admission_key, admit, refuse_dependency_cycle
from .hotview import HotView
from .metrics import IntakeMetrics, refusal_reason
from .settings import IntakeSettings

log = logging.getLogger("oneplus.intake")

SOURCE_HEADER = "Oneplus-Source"
SUBMISSION_ID_HEADERS = ("Nats-Msg-Id", "Idempotency-Key")

# HTTP statuses of the outcomes (the NATS reply carries the same verdict in `ok` / `error`).
ACCEPTED, DUPLICATE, UNREADABLE, WRONG_TEAM, CANNOT_RUN = 201, 200, 400, 403, 422


def job_id_for(msg_id: str) -> str:
    """The same submission id always names the same job: retries dedupe beyond the stream's window too."""
    return "j-" + hashlib.sha256(msg_id.encode("utf-8", "surrogatepass")).hexdigest()[:12]


def _header(headers: Mapping[str, str], name: str) -> str | None:
    wanted = name.lower()
    return next((v for k, v in headers.items() if k.lower() == wanted), None)


@dataclass(frozen=True)
class Outcome:
    reply: SubmitReply
    status: int


class Intake:
    """The submission pipeline of one intake process, over its service's ledger and KV buckets."""

    def __init__(self, svc: OneplusService, accept_wait_s: float | None = None) -> None:
        self.svc = svc
        # How long a submission waits for the owner to fold its `accepted` fact, so that a `jobs show` right after
        # the reply finds the job; past it the reply goes out anyway (the fact is stored and will be folded).
        self.accept_wait_s = IntakeSettings.load().accept_wait_s if accept_wait_s is None else accept_wait_s
        self.metrics: IntakeMetrics | None = None  # set by the service: submissions by outcome, reason, source
        self._nodes: dict[str, NodeRecord] | None = None
        self.empty_cluster = EmptyCluster()
        self._facts: ClusterFacts | None = None  # what admission reads of the nodes, until their shape changes
        self._config: QueueConfig | None = None
        self._tails: list[StreamTail] = []
        self.advance = AdvanceBook()  # the advance reservations, for --reservation's checks
        self.hot: HotView | None = None  # the service's copy of the hot view, once it follows the bucket

    async def start(self) -> None:
        """Keep the cluster's nodes and the queue config in memory, fed by their buckets' changes."""
        self._nodes = {}
        self._tails.append(await kv_list_and_watch(self.svc.js, subjects.TOPOLOGY_KV, self._on_node, "intake-topology"))
        self._tails.append(await kv_list_and_watch(self.svc.js, subjects.QUEUES_KV, self._on_queues, "intake-queues"))
        self._tails.append(
            await kv_list_and_watch(self.svc.js, subjects.ADVANCE_RESERVATIONS_KV, self._on_advance, "intake-advance")
        )

    async def stop(self) -> None:
        for tail in self._tails:
            await tail.stop()

    async def _on_node(self, node: str, value: bytes | None) -> None:
        assert self._nodes is not None
        old = self._nodes.get(node)
        if value is None:
            self._nodes.pop(node, None)
            self._facts = None
            return
        rec = self._nodes[node] = NodeRecord.model_validate_json(value)
        if old is None or admission_key(old) != admission_key(rec):
            self._facts = None  # a heartbeat's update changes nothing admission reads: the facts stand

    async def advance_reservations(self, named: str | None = None) -> list[AdvanceReservation]:
        """The advance reservations: followed once started, else read from the bucket (a one-off intake). `named`:
        one the followed copy lacks is read from the bucket after all (created a moment ago, its watch not yet in)."""
        if self._tails and (named is None or named in self.advance.by_name):
            return self.advance.all
        book = AdvanceBook()
        for key, value, _ in await latest_entries(self.svc.js, subjects.ADVANCE_RESERVATIONS_KV):
            book.apply(key, value)
        return book.all

    async def _on_advance(self, key: str, value: bytes | None) -> None:
        self.advance.apply(key, value)  # an unreadable entry is left out: a job naming it is refused as unknown

    async def _on_queues(self, key: str, value: bytes | None) -> None:
        if key == QUEUES_KEY:
            self._config = None  # read again on the next submission (a refused config is reported there)

    async def queue_config(self) -> QueueConfig:
        if self._config is None:
            config = await live_queue_config(self.svc.kv[subjects.QUEUES_KV])
            if self._tails:
                self._config = config
            return config
        return self._config

    async def cluster_facts(self) -> ClusterFacts:
        if self._nodes is None:
            return ClusterFacts.of(await self.nodes())
        if self._facts is None:
            self._facts = ClusterFacts.of(self._nodes.values())
        return self._facts

    async def nodes(self) -> list[NodeRecord]:
        if self._nodes is not None:
            return list(self._nodes.values())
        return [NodeRecord.model_validate_json(v) for v in await latest_values(self.svc.js, subjects.TOPOLOGY_KV)]

    async def dependencies_of(self, job_id: str) -> list[str] | None:
        """The job ids an existing job's dependencies name; None when there is no such job (or it has ended)."""
        rec, _ = await self.svc.ledger.get(job_id)
        if rec is None or rec.terminal:
            return None  # an ended job waits for nothing: no cycle goes through it
        return [j for d in rec.spec.dependencies for j in d.job_ids]

    async def earlier(self, job_id: str) -> JobRecord | None:
        """The record of an earlier submission of `job_id`: in the hot view, else in the archive (a retry of a job
        long finished is no new job either). The followed copy answers without a round trip; a job it has not seen
        yet was accepted moments ago, and the facts stream's dedupe on the event id answers for that one."""
        if self.hot is not None and self.hot.following:
            rec = self.hot.record(job_id)
        else:
            rec, _ = await self.svc.ledger.get(job_id)
        return rec if rec is not None else await JobArchive(self.svc.js).get(job_id)

    async def recorded(self, job_id: str) -> JobRecord | None:
        """The job's record as the owner has it now: its saved record and the job events after it (`JobLedger.get`),
        not the followed copy, which may lag the owner."""
        rec, _ = await self.svc.ledger.get(job_id)
        return rec

    def count(self, outcome: str, source: str, reason: str = "none") -> None:
        if self.metrics is not None:
            self.metrics.submission(outcome, source, reason)

    async def reject(
        self, job_id: str, reason: str, source: str, team: str | None, status: int, exc: BaseException | None = None
    ) -> Outcome:
        log.info("rejected %s: %s", job_id, reason)
        self.count("refused", source, refusal_reason(status, exc))
        await self.svc.ledger.publish(
            JobRejected(event_id=f"rejected-{job_id}", job_id=job_id, reason=reason, source=source, team=team)
        )
        return Outcome(SubmitReply(ok=False, job_id=job_id, error=reason), status)

    async def submit(self, headers: Mapping[str, str], body: bytes, caller: Caller, source: str = "nats") -> Outcome:
        """A raw submission: a job document, or a CloudEvent (structured or binary) carrying one."""
        source = _header(headers, SOURCE_HEADER) or source
        try:
            sub = decode_submission(headers, body)
        except JobFormatError as exc:
            return await self.reject(new_id("j-"), str(exc), source, caller.team, UNREADABLE)
        msg_id = sub.event_id or next(filter(None, (_header(headers, h) for h in SUBMISSION_ID_HEADERS)), None)
        return await self.accept(
            sub.spec,
            submission_id=msg_id or new_id("sub-"),
            source=sub.source or source,
            warnings=sub.warnings,
            caller=caller,
        )

    async def record_accepted(self, event: JobAccepted) -> Reported:
        """The job's acceptance, durable before the submission is answered: straight to the job owner, which answers
        once its `accepted` event is committed and the record is in the hot view (no append of the fact itself); if no
        owner answers within the accept wait (none, a takeover, a paused one), in the facts stream, where it waits for
        the next owner. An array's acceptance stands for its tasks, whose folding is paced: it takes the stream."""
        traceparent = traceparent_of_current()
        if self.accept_wait_s > 0 and event.spec.array is None:
            try:
                got = await self.svc.ledger.deliver(event, traceparent, timeout=self.accept_wait_s)
                # Refused means the job is there already: a retry of this submission recorded it first.
                return Reported(folded=got.folded, duplicate=not got.folded)
            except NotDelivered as exc:
                log.info("%s: %s; kept in the facts stream instead", event.job_id, exc)
        return await self.svc.ledger.report(event, traceparent=traceparent, wait_s=self.accept_wait_s)

    async def accept(
        self, spec: JobSpec, *, submission_id: str, source: str, warnings: list[str], caller: Caller
    ) -> Outcome:
        """A spec already read: bind it to the caller's team, dedupe on the submission id, admit, record."""
        scoped = submission_id if caller.team is None else f"{caller.team}/{submission_id}"
        job_id = job_id_for(scoped)
        rec = await self.earlier(job_id)
        if rec is None and spec.array is not None:  # an array has no record of its own: its first task stands for it
            rec = await self.earlier(task_job_id(job_id, spec.array.task_ids[0]))
        if rec is not None:  # a retry: answer as the first time, even if the cluster or the body changed since
            self.count("duplicate", source)
            return Outcome(SubmitReply(ok=True, job_id=job_id, duplicate=True, warnings=rec.warnings), DUPLICATE)
        try:
            spec = bind_team(spec, caller)
        except TenancyError as exc:
            return await self.reject(job_id, str(exc), source, caller.team, exc.code)
        try:
            config = await self.queue_config()
            spec = config.with_queue_models(spec)  # a queue's flavors (GPU models), as Kueue assigns them
            if spec.array is not None:
                spec.array.check_size(site_from_env().max_array_size)  # Slurm's MaxArraySize, from the site file
            admit(spec, config, await self.cluster_facts(), self.empty_cluster)
            await refuse_dependency_cycle(job_id, spec, self.dependencies_of)
            if spec.reservation is not None:
                check_job(spec, await self.advance_reservations(spec.reservation), time.time())
        except (
            Inadmissible,
            QueueConfigError,
            ValidationError,
            ArrayError,
            SiteMapError,
            AdvanceReservationError,
        ) as exc:
            if (rec := await self.recorded(job_id)) is not None:
                # A retry whose first try was committed after this intake's copy last looked (seen across hosts:
                # admitted then, refused now while a node was cut off): the job exists, so no `rejected` for it.
                self.count("duplicate", source)
                return Outcome(SubmitReply(ok=True, job_id=job_id, duplicate=True, warnings=rec.warnings), DUPLICATE)
            return await self.reject(job_id, str(exc), source, spec.team, CANNOT_RUN, exc)
        event = JobAccepted(event_id=f"accepted-{job_id}", job_id=job_id, spec=spec, source=source, warnings=warnings)
        reported = await self.record_accepted(event)
        if reported.duplicate:  # a retry that came before the owner recorded the first: the stream's msg id caught it
            self.count("duplicate", source)
            return Outcome(SubmitReply(ok=True, job_id=job_id, duplicate=True, warnings=warnings), DUPLICATE)
        if spec.array is not None:
            log.info("accepted array %s of %d tasks (%s, team %s) from %s", job_id, spec.array.tasks, spec.name,
                     spec.team, source)  # fmt: skip
        else:
            log.info("accepted %s (%s, team %s) from %s", job_id, spec.name, spec.team, source)
        self.count("accepted", source)
        return Outcome(SubmitReply(ok=True, job_id=job_id, warnings=warnings), ACCEPTED)
