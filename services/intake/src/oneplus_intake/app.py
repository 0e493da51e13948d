"""intake: validates every submission, turns it into the one JobSpec, accepts or rejects it.

Submissions arrive as NATS requests on `oneplus.jobs.submit` (a JobSpec, or a CloudEvent in structured
or binary mode), as `POST /v1/jobs` over HTTP, and as MLflow webhook deliveries (`POST /webhooks/mlflow`);
all three go through `Intake` (submissions.py). The ops endpoints show, list and cancel jobs of the
caller's team only (tenancy.py says where the team comes from).
"""

from __future__ import annotations

import logging
from typing import Any

from faststream.nats import NatsMessage
from nats.js.errors import InvalidKeyError
from oneplus_bus.broker import whole_message_subscriber
from oneplus_bus.service import OneplusService, OpsError, RawJson
from oneplus_bus.settings import BusSettings
from oneplus_bus.tenancy import Caller, TenancyError, caller_of
from oneplus_contracts import JobCancelRequested, JobRecord, SignalRanks, subjects
from oneplus_contracts.commands import signal_name
from oneplus_stores.archive import JobArchive

from . import joblist
from .deliveries import NatsDeliveryLedger
from .hotview import HotView
from .http_api import JobsApi
from .metrics import IntakeMetrics
from .reservations import ReservationOps
from .settings import IntakeSettings, submit_workers
from .submissions import Intake, job_id_for
from .web import HttpServer, IntakeHttp
from .webhooks import MlflowWebhook, load_templates

__all__ = ["IntakeService", "build_intake", "job_id_for", "main"]

log = logging.getLogger("oneplus.intake")


class IntakeService:
    """The intake's handlers over its service, its submission pipeline and its settings (read at start)."""

    def __init__(self, svc: OneplusService, settings: IntakeSettings | None = None) -> None:
        self.svc = svc
        self.settings = settings
        self.intake = Intake(svc, settings.accept_wait_s if settings is not None else None)
        self.hot: HotView | None = None  # the job list's copy of the hot view, kept from start to stop
        self.http: HttpServer | None = None
        registry = getattr(svc, "metrics", None)
        self.metrics = None if registry is None else IntakeMetrics(registry, self._hot_rows)
        self.intake.metrics = self.metrics
        self.reservations = ReservationOps(svc, self.intake.nodes)

    def _hot_rows(self) -> Any:
        return list(self.hot.rows.values()) if self.hot is not None else None

    @property
    def platform_accounts(self) -> frozenset[str]:
        return (self.settings or IntakeSettings()).platform_accounts

    def caller(self, headers: dict[str, str], claimed: Any = None) -> Caller:
        return caller_of(headers, claimed, platform_accounts=self.platform_accounts)

    def tenant(self, headers: dict[str, str], payload: dict[str, Any]) -> Caller:
        try:
            return self.caller(headers, payload.get("team"))
        except TenancyError as exc:
            raise OpsError(str(exc), exc.code) from exc

    async def on_submit(self, msg: NatsMessage) -> dict[str, Any]:
        headers = dict(msg.headers or {})
        intake = self.intake
        try:
            caller = self.caller(headers)
        except TenancyError as exc:
            job_id = job_id_for(f"refused/{msg.correlation_id}")
            outcome = await intake.reject(job_id, str(exc), "nats", None, exc.code)
        else:
            outcome = await intake.submit(headers, msg.body, caller)
        return outcome.reply.model_dump(mode="json")

    async def start(self) -> None:
        if self.settings is None:
            self.settings = IntakeSettings.from_env()
        if self.settings.http_port is not None:
            warning = self.settings.check_listen()  # SettingsError: no tokens on a non-loopback address
            if warning:
                log.warning("%s", warning)
        await self.intake.start()
        await self.start_hot_view()
        await self.start_http(self.settings)

    async def start_hot_view(self) -> None:
        self.hot = HotView(self.svc.js, self.settings.min_job_age_s if self.settings is not None else None)
        await self.hot.start()
        self.intake.hot = self.hot

    async def stop(self) -> None:
        if self.http is not None:
            await self.http.stop()
            self.http = None
        await self.intake.stop()
        self.intake.hot = None
        if self.hot is not None:
            await self.hot.stop()
            self.hot = None

    async def start_http(self, settings: IntakeSettings) -> None:
        if settings.http_port is None:
            log.info("HTTP intake disabled (ONEPLUS_HTTP_PORT=off)")
            return
        settings.check_listen()  # start() has logged its warning, if any
        if settings.http_tokens:
            teams = settings.http_tokens.teams
            log.info(
                "HTTP intake authenticated: %d token(s), %d team(s)%s",
                len(settings.http_tokens),
                len(teams - {None}),
                ", platform tokens too" if None in teams else "",
            )
        webhook = None
        if settings.mlflow_secret:
            webhook = MlflowWebhook(
                secret=settings.mlflow_secret,
                templates=load_templates(settings.mlflow_templates),
                ledger=NatsDeliveryLedger(self.svc.kv[subjects.WEBHOOK_DELIVERIES_KV]),
                intake=self.intake,
                replay_window_s=settings.replay_window_s,
            )
            log.info("MLflow webhooks on, %d job template(s)", len(webhook.templates.templates))
        api = JobsApi(self, self.svc.nc, self.svc.tracer)
        app = IntakeHttp(
            self.intake, webhook, self.svc.tracer, api=api, tokens=settings.http_tokens, metrics=self.metrics
        ).app()
        server = HttpServer(app, settings.http_host, settings.http_port)
        try:
            await server.start()
        except OSError as exc:
            if settings.http_port_explicit:
                raise
            # The default port may be taken on a developer's machine; NATS intake works without HTTP.
            log.warning("HTTP intake not started: %s:%d: %s", settings.http_host, settings.http_port, exc.strerror)
            return
        self.http = server

    async def visible_job(self, payload: dict[str, Any], headers: dict[str, str]) -> tuple[JobRecord, Caller]:
        caller = self.tenant(headers, payload)
        job_id = str(payload.get("job_id") or "")
        try:
            rec, _ = await self.svc.ledger.get(job_id)
        except InvalidKeyError:  # no job is named that way
            raise OpsError(f"no job {job_id!r}", 404) from None
        if rec is None:
            rec = await self.svc.ledger.unfolded(job_id)  # submitted a moment ago, its acceptance not folded yet
        if rec is None and self.hot is not None:
            rec = self.hot.array_task(job_id)  # an array's id: one of its tasks stands for it (a cancel ends them all)
        if rec is None:
            rec = await JobArchive(self.svc.js).get(job_id)  # long finished: cancelling it is a conflict, not a 404
        if rec is None or not caller.sees(rec.spec.team):
            raise OpsError(f"no job {job_id!r}", 404)  # another team's job does not exist, as far as this caller knows
        return rec, caller

    async def job_show(self, payload: dict[str, Any], headers: dict[str, str]) -> JobRecord:
        """A job from the hot view, else from the archive."""
        svc = self.svc
        return await joblist.job_show(svc.ledger, JobArchive(svc.js), payload, self.tenant(headers, payload))

    async def job_list(self, payload: dict[str, Any], headers: dict[str, str]) -> RawJson:
        """One page of jobs (joblist.py): limit, cursor, state, since, user; `{"jobs": [...], "next": ...}`."""
        svc = self.svc
        return await joblist.job_list(svc.ledger, JobArchive(svc.js), payload, self.tenant(headers, payload), self.hot)

    async def job_cancel(self, payload: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
        rec, caller = await self.visible_job(payload, headers)
        # The array's id (scancel 123) names every task of it: one fact, which the owner folds as a cancel of each.
        job_id = str(payload.get("job_id") or rec.job_id)
        if rec.terminal:
            raise OpsError(f"job {job_id} already {rec.state}", 409)
        by = caller.user if caller.bound and caller.user else str(payload.get("by") or "unknown")
        await self.svc.ledger.report(
            JobCancelRequested(job_id=job_id, reason=f"cancelled by {by}", by=by), wait_s=self.intake.accept_wait_s
        )
        return {"job_id": job_id, "state": rec.state, "cancel_requested": True}

    async def job_signal(self, payload: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
        """`scancel --signal`: the signal goes to every node the job runs on (SignalRanks on the commands stream);
        each executor delivers it to the job's batch script, ranks and running srun steps' tasks there."""
        rec, caller = await self.visible_job(payload, headers)
        raw = payload.get("signal")
        try:
            sig = signal_name(raw)
        except ValueError as exc:
            raise OpsError(str(exc), 400) from None
        if rec.terminal:
            raise OpsError(f"job {rec.job_id} already {rec.state}: nothing to signal", 409)
        if rec.allocation is None or rec.token is None or rec.state not in ("STARTING", "RUNNING"):
            raise OpsError(f"job {rec.job_id} is {rec.state}: it has no running processes to signal", 409)
        by = caller.user if caller.bound and caller.user else str(payload.get("by") or "unknown")
        nodes = sorted(set(rec.allocation.nodes))
        for node in nodes:
            cmd = SignalRanks(job_id=rec.job_id, node=node, token=rec.token, signal=sig, by=by)
            await self.svc.js.publish(
                subjects.node_command(node, "signal"),
                cmd.model_dump_json().encode(),
                headers={"Nats-Msg-Id": cmd.command_id},
                stream=subjects.COMMANDS_STREAM,
            )
        return {"job_id": rec.job_id, "signal": sig, "nodes": nodes}

    # --- advance reservations (reservations.py) -----------------------------------------------------------------
    # The team a client puts in every ops payload names the caller; it is no field of the reservation.
    async def reservation_create(self, payload: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
        caller = self.tenant(headers, payload)
        return await self.reservations.create({k: v for k, v in payload.items() if k != "team"}, caller)

    async def reservation_list(self, payload: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
        return await self.reservations.list()

    async def reservation_delete(self, payload: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
        return await self.reservations.delete(payload, self.tenant(headers, payload))


def build_intake(
    settings: BusSettings | None = None, intake_settings: IntakeSettings | None = None
) -> tuple[OneplusService, IntakeService]:
    """The intake service: its submission subscriber, ops endpoints and HTTP server, from settings (env if None)."""
    svc = OneplusService("intake", "Accepts jobs from the CLI, CI/CD CloudEvents, HTTP and MLflow webhooks", settings)
    it = IntakeService(svc, intake_settings)
    whole_message_subscriber(
        svc.broker,
        subjects.SUBMIT,
        queue="intake",
        title="job submissions (request/reply)",
        max_workers=submit_workers(intake_settings),
    )(it.on_submit)
    svc.on_start(it.start)
    svc.on_stop(it.stop)
    svc.ops("job-show", subjects.OPS_JOB_SHOW)(it.job_show)
    svc.ops("job-list", f"{subjects.PREFIX}.ops.job.list")(it.job_list)
    svc.ops("job-cancel", subjects.OPS_JOB_CANCEL)(it.job_cancel)
    svc.ops("job-signal", subjects.OPS_JOB_SIGNAL)(it.job_signal)
    svc.ops("reservation-create", subjects.OPS_RESERVATION_CREATE)(it.reservation_create)
    svc.ops("reservation-list", subjects.OPS_RESERVATION_LIST)(it.reservation_list)
    svc.ops("reservation-delete", subjects.OPS_RESERVATION_DELETE)(it.reservation_delete)
    return svc, it


def main() -> None:
    svc, _ = build_intake(intake_settings=IntakeSettings.load_or_exit())
    svc.run()
