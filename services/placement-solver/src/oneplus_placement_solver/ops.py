"""The solver's ops endpoints: why a job waits (`explain`, and each replica's reasons for its own shard), the
squeue-like queue listing and the per-queue summary. Read-only: they read the working set and the last decision."""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Iterable
from typing import Any

from oneplus_bus.service import OpsError
from oneplus_contracts import subjects
from oneplus_queueing.model import PendingReason
from oneplus_queueing.report import queue_rows, queues_rows, split_records
from oneplus_queueing.shards import replica_for
from oneplus_stores.clusterview import explain_job, merge_reason

from .context import SolverContext
from .scheduler import Scheduler

log = logging.getLogger("oneplus.solver")

QUEUE_PAGE_DEFAULT = 500
QUEUE_PAGE_MAX = 2000


class SolverOps:
    def __init__(self, ctx: SolverContext, scheduler: Scheduler) -> None:
        self.ctx = ctx
        self.scheduler = scheduler

    def own_reasons(self, job_ids: Iterable[str]) -> tuple[dict[str, PendingReason], list[str]]:
        """This replica's last cycle on `job_ids`: their reasons, and their serving order."""
        d = self.scheduler.decision
        if d is None:
            return {}, []
        wanted = set(job_ids)
        return {j: r for j, r in d.reasons.items() if j in wanted}, [j for j in d.order if j in wanted]

    async def on_reasons_request(self, msg: Any) -> None:
        try:
            job_ids = [str(j) for j in json.loads(msg.data or b"{}").get("job_ids", [])]
        except (ValueError, AttributeError, TypeError):
            job_ids = []
        reasons, order = self.own_reasons(job_ids)
        body = {"reasons": {j: [r.code, r.message] for j, r in reasons.items()}, "order": order}
        with contextlib.suppress(Exception):
            await msg.respond(json.dumps(body).encode())

    async def reasons_for(self, job_ids: Iterable[str]) -> tuple[dict[str, PendingReason], list[str]]:
        """Why `job_ids` wait and in what order, each from the replica whose shard it is in (its last cycle); a
        replica that does not answer within a second leaves its jobs without a reason."""
        ctx = self.ctx
        ids = list(job_ids)
        if len(ctx.members) <= 1:
            return self.own_reasons(ids)
        shards: dict[str, list[str]] = {}
        for job_id in ids:
            shards.setdefault(replica_for(job_id, ctx.members), []).append(job_id)
        reasons, order = self.own_reasons(shards.pop(ctx.settings.replica, []))
        for replica, wanted in sorted(shards.items()):
            try:
                reply = await ctx.svc.nc.request(
                    subjects.ops_solver_reasons(replica), json.dumps({"job_ids": wanted}).encode(), timeout=1.0
                )
                got = json.loads(reply.data)
                for job_id, (code, message) in got.get("reasons", {}).items():
                    reasons[job_id] = PendingReason(job_id, code, message)
                order += [str(j) for j in got.get("order", [])]
            except Exception as exc:
                log.info("solver replica %s did not say why its %d job(s) wait: %s", replica, len(wanted), exc)
        return reasons, order

    async def explain(self, payload: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
        owner = self.ctx.owner
        job_id = str(payload.get("job_id") or "")
        rec = owner.index.get(job_id) or await owner.archive.get(job_id)
        if rec is None:
            raise OpsError(f"no job {job_id!r}", 404)
        team = payload.get("team")
        if team and rec.spec.team != team:
            raise OpsError(f"no job {job_id!r} in team {team!r}", 404)
        if rec.state != "ACCEPTED":
            return {
                "job_id": job_id,
                "state": rec.state,
                "pending": False,
                "message": f"job is {rec.state}, not pending",
            }
        jobs = [*owner.index.pending.values(), *owner.index.holders.values()]
        out: dict[str, Any] = {
            "job_id": job_id,
            "state": rec.state,
            "pending": True,
            **explain_job(
                self.ctx.work.capacity.copy(),
                rec,
                jobs,
                mix_gpu_models=rec.spec.queue in self.ctx.work.config.mixing_queues,
            ),
        }
        why = (await self.reasons_for([job_id]))[0].get(job_id)
        if why is not None:
            out["reason"] = why.code
            out["message"] = merge_reason(why.code, why.message, out["message"])
        return out

    async def queue_list(self, payload: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
        """squeue-like rows (holders by start time, then pending jobs in serving order with their reason), paged."""
        team = payload.get("team")
        limit, offset = page_args(payload)
        index = self.ctx.owner.index
        live = [*index.holders.values(), *index.pending.values()]
        records = [r for r in live if team is None or r.spec.team == team]
        reasons, order = await self.reasons_for(r.job_id for r in records if r.state == "ACCEPTED")
        rows = queue_rows(time.time(), records, reasons, order)
        keys = ("job_id", "queue", "name", "user", "st", "time", "gpus", "where")
        page = rows[offset : offset + limit]
        out = [{**dict(zip(keys, r.cells(), strict=True)), "reason": r.reason, "message": r.message} for r in page]
        nxt = str(offset + limit) if offset + limit < len(rows) else None
        return {"rows": out, "next": nxt}

    async def queues_list(self, payload: dict[str, Any], headers: dict[str, str]) -> list[dict[str, Any]]:
        """Per queue: guarantee, limit, used, borrowed, pending and the fair-share factor."""
        now = time.time()
        index = self.ctx.owner.index
        live = [r for r in [*index.holders.values(), *index.pending.values()] if not r.cancel_requested]
        pending, running = split_records(live)
        usage = await self.scheduler.usage_for(now)
        return [row.to_dict() for row in queues_rows(now, self.ctx.work.config, pending, running, usage)]


def page_args(payload: dict[str, Any]) -> tuple[int, int]:
    try:
        raw_limit, raw_cursor = payload.get("limit"), payload.get("cursor")
        limit = QUEUE_PAGE_DEFAULT if raw_limit is None else int(raw_limit)
        offset = 0 if raw_cursor in (None, "") else int(raw_cursor)
    except (TypeError, ValueError) as exc:
        raise OpsError(f"'limit' and 'cursor' must be whole numbers: {exc}") from exc
    if not 1 <= limit <= QUEUE_PAGE_MAX:
        raise OpsError(f"'limit' must be between 1 and {QUEUE_PAGE_MAX}, not {limit}")
    if offset < 0:
        raise OpsError(f"'cursor' must not be negative, not {offset}")
    return limit, offset
