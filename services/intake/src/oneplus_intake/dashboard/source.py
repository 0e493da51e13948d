"""Where the dashboard's data comes from: the platform's ops subjects over the intake's own NATS connection.

The same requests the CLI makes (`oneplus nodes`, `oneplus jobs list`, `squeue`, `oneplus jobs explain`), each
list followed page by page. Every answer is cached for `ttl_s` (1 s) and a request already under way is shared, so
a hundred browsers polling every 1.5 s cost the platform what one does.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from nats.js import JetStreamContext
from nats.js.api import DeliverPolicy
from oneplus_contracts import JobRecord, NodeRecord, subjects
from oneplus_contracts.jobindex import HOLDING_STATES

from . import views

NODE_PAGE = 100
JOB_PAGE = 1000
QUEUE_PAGE = 500
MAX_PAGES = 200  # a listing longer than this many pages is cut there rather than followed for ever


class DashboardError(RuntimeError):
    """The platform did not answer, or answered with an error; `status` is what the browser is told."""

    def __init__(self, message: str, status: int = 502) -> None:
        super().__init__(message)
        self.status = status


class Bus(Protocol):
    @property
    def nc(self) -> Client: ...

    @property
    def js(self) -> JetStreamContext: ...


class TtlCache:
    """Values kept `ttl_s` seconds; concurrent misses of one key wait on a single fetch."""

    def __init__(self, ttl_s: float, max_keys: int = 256) -> None:
        self.ttl_s = ttl_s
        self.max_keys = max_keys
        self._values: dict[str, tuple[float, Any]] = {}
        self._inflight: dict[str, asyncio.Future[Any]] = {}
        self.fetches = 0

    async def get(self, key: str, fetch: Callable[[], Awaitable[Any]]) -> Any:
        hit = self._values.get(key)
        if hit is not None and hit[0] > time.monotonic():
            return hit[1]
        running = self._inflight.get(key)
        if running is not None:
            return await asyncio.shield(running)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._inflight[key] = fut
        try:
            self.fetches += 1
            value = await fetch()
        except BaseException as exc:
            fut.set_exception(exc)
            fut.exception()  # retrieved: nobody else may be waiting
            raise
        else:
            fut.set_result(value)
            if len(self._values) >= self.max_keys:
                self._values.clear()
            self._values[key] = (time.monotonic() + self.ttl_s, value)
            return value
        finally:
            self._inflight.pop(key, None)


class DashboardSource:
    def __init__(self, bus: Bus, ttl_s: float = 1.0, timeout_s: float = 5.0) -> None:
        self.bus = bus
        self.timeout_s = timeout_s
        self.cache = TtlCache(ttl_s)

    async def ops(self, subject: str, payload: dict[str, Any]) -> Any:
        try:
            msg = await self.bus.nc.request(subject, json.dumps(payload).encode(), timeout=self.timeout_s)
        except NoRespondersError:
            raise DashboardError(f"no service answers on {subject}", 503) from None
        except NatsTimeout:
            raise DashboardError(f"no answer on {subject} within {self.timeout_s:g}s", 504) from None
        try:
            reply = json.loads(msg.data)
        except json.JSONDecodeError:
            raise DashboardError(f"unreadable answer on {subject}") from None
        if not isinstance(reply, dict) or not reply.get("ok"):
            error = reply.get("error") if isinstance(reply, dict) else reply
            status = 404 if "no job" in str(error) else 502
            raise DashboardError(f"{subject}: {error}", status)
        return reply["result"]

    async def _pages(self, subject: str, payload: dict[str, Any], key: str) -> list[Any]:
        out: list[Any] = []
        cursor: str | None = None
        for _ in range(MAX_PAGES):
            page = await self.ops(subject, payload | ({"cursor": cursor} if cursor else {}))
            out.extend(page[key])
            cursor = page.get("next")
            if not cursor:
                break
        return out

    async def nodes(self) -> list[NodeRecord]:
        rows = await self._pages(subjects.OPS_NODE_LIST, {"limit": NODE_PAGE}, "nodes")
        return [NodeRecord.model_validate(r) for r in rows]

    async def holding_jobs(self) -> list[JobRecord]:
        payload = {"limit": JOB_PAGE, "state": sorted(HOLDING_STATES)}
        rows = await self._pages(f"{subjects.PREFIX}.ops.job.list", payload, "jobs")
        seen: dict[str, JobRecord] = {}
        for row in rows:
            rec = JobRecord.model_validate(row)
            seen.setdefault(rec.job_id, rec)
        return list(seen.values())

    async def holders(self) -> list[JobRecord]:
        """The jobs holding GPUs, cached a second: the cluster, the queue and a job's page colour from them alike."""
        result: list[JobRecord] = await self.cache.get("holders", self.holding_jobs)
        return result

    async def cluster(self) -> dict[str, Any]:
        async def fetch() -> dict[str, Any]:
            nodes, jobs = await asyncio.gather(self.nodes(), self.holders())
            return views.cluster_view(nodes, jobs, time.time())

        result: dict[str, Any] = await self.cache.get("cluster", fetch)
        return result

    async def node(self, name: str) -> dict[str, Any]:
        """One node's page, from the cluster picture (the same cached answer: no request of its own)."""
        found = views.node_detail(await self.cluster(), name)
        if found is None:
            raise DashboardError(f"no node {name!r}", 404)
        return found

    async def queue(self) -> dict[str, Any]:
        async def fetch() -> dict[str, Any]:
            rows, jobs, reservations = await asyncio.gather(
                self._pages(subjects.OPS_QUEUE_LIST, {"limit": QUEUE_PAGE}, "rows"), self.holders(), self.reservations()
            )
            return views.queue_view(rows, time.time(), views.job_colours(jobs), reservations)

        result: dict[str, Any] = await self.cache.get("queue", fetch)
        return result

    async def reservations(self) -> list[dict[str, Any]]:
        """The advance reservations (the intake's own list); none when it cannot answer: the queue shows without."""
        try:
            result = await self.ops(subjects.OPS_RESERVATION_LIST, {})
        except DashboardError:
            return []
        rows: list[dict[str, Any]] = result.get("reservations", []) if isinstance(result, dict) else []
        return rows

    async def explain(self, job_id: str) -> dict[str, Any]:
        async def fetch() -> dict[str, Any]:
            answer: dict[str, Any] = await self.ops(subjects.OPS_JOB_EXPLAIN, {"job_id": job_id})
            return answer

        result: dict[str, Any] = await self.cache.get(f"explain/{job_id}", fetch)
        return result

    async def job(self, job_id: str) -> dict[str, Any]:
        async def fetch() -> dict[str, Any]:
            rec = JobRecord.model_validate(await self.ops(subjects.OPS_JOB_SHOW, {"job_id": job_id}))
            explain: dict[str, Any] | None = None
            if rec.state in views.PENDING_STATES:  # why it waits, on its page: the solver's `jobs explain`
                try:
                    explain = await self.explain(job_id)
                except DashboardError as exc:
                    explain = {"error": str(exc)}
            events, holders = await asyncio.gather(self.events(job_id), self.holders())
            colour = views.job_colours(holders).get(job_id)
            return views.job_view(rec, events, time.time(), colour=colour, explain=explain)

        result: dict[str, Any] = await self.cache.get(f"job/{job_id}", fetch)
        return result

    async def events(self, job_id: str, limit: int = views.EVENT_LIMIT + 1) -> list[dict[str, Any]]:
        """The job's events on ONEPLUS_JOBS in stream order (at most `limit`), each with its stream sequence."""
        js = self.bus.js
        sub = await js.subscribe(
            subjects.job_events_of(job_id), ordered_consumer=True, deliver_policy=DeliverPolicy.ALL
        )
        out: list[dict[str, Any]] = []
        try:
            while len(out) < limit:
                try:
                    msg = await sub.next_msg(timeout=1.0 if out else 0.5)
                except (TimeoutError, NatsTimeout):
                    break
                try:
                    event = json.loads(msg.data)
                except json.JSONDecodeError:
                    event = {"type": "unreadable", "raw": msg.data[:200].decode(errors="replace")}
                if isinstance(event, dict):
                    out.append(event | {"seq": msg.metadata.sequence.stream})
                if msg.metadata.num_pending == 0:
                    break
        finally:
            await sub.unsubscribe()
        return out
