"""A Python client for CI scripts and the CLI: submit jobs and ask the platform about them over NATS.

async with OnePlusClient.connect() as c:
    reply = await c.submit(spec, msg_id="ci-run-1234")
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any, Literal, TypeVar

import nats
from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from oneplus_contracts import JobRecord, JobSpec, NodeRecord, SubmitReply, subjects
from oneplus_jobformats.cloudevents import SUBMIT_EVENT_TYPE, encode_binary, encode_structured

TEAM_HEADER = "Oneplus-Team"
JOB_PAGE_MAX = 1000  # the most jobs the intake puts in one page of `oneplus.ops.job.list`


T = TypeVar("T")


class PlatformError(RuntimeError):
    """The platform answered with an error, or nobody answered."""


class OnePlusClient:
    def __init__(self, nc: Client, team: str | None = None, timeout: float = 5.0) -> None:
        self.nc = nc
        self.team = team
        self.timeout = timeout

    @classmethod
    @asynccontextmanager
    async def connect(
        cls, nats_url: str | None = None, *, team: str | None = None, timeout: float = 5.0
    ) -> AsyncIterator[OnePlusClient]:
        url = nats_url or os.environ.get("NATS_URL", "nats://127.0.0.1:4222")
        try:
            nc = await nats.connect(url, connect_timeout=3, max_reconnect_attempts=2, allow_reconnect=False)
        except Exception as exc:
            raise PlatformError(f"cannot reach NATS at {url}: {exc}; is the platform up (`oneplus dev up`)?") from exc
        try:
            yield cls(nc, team=team or os.environ.get("ONEPLUS_TEAM"), timeout=timeout)
        finally:
            await nc.close()

    async def _request(self, subject: str, body: bytes, headers: Mapping[str, str] | None = None) -> bytes:
        hdrs = dict(headers or {})
        if self.team:
            # The intake reads the team from here; across a team's NATS account the server's stamp decides.
            hdrs.setdefault(TEAM_HEADER, self.team)
        try:
            msg = await self.nc.request(subject, body, timeout=self.timeout, headers=hdrs)
        except NoRespondersError as exc:
            raise PlatformError(f"no service answers on {subject}; is the platform up?") from exc
        except NatsTimeout as exc:
            raise PlatformError(f"no answer on {subject} within {self.timeout:g}s") from exc
        return bytes(msg.data)

    async def submit_raw(self, body: bytes, headers: Mapping[str, str] | None = None) -> SubmitReply:
        data = await self._request(subjects.SUBMIT, body, headers)
        return SubmitReply.model_validate_json(data)

    async def submit(self, spec: JobSpec, *, msg_id: str | None = None, source: str = "cli") -> SubmitReply:
        headers = {"Oneplus-Source": source}
        if msg_id:
            headers["Nats-Msg-Id"] = msg_id
        return await self.submit_raw(spec.model_dump_json().encode(), headers)

    async def submit_cloudevent(
        self,
        spec: JobSpec,
        source: str,
        id: str,
        mode: Literal["structured", "binary"] = "structured",
        *,
        type: str = SUBMIT_EVENT_TYPE,
    ) -> SubmitReply:
        """Submit `spec` as a CloudEvent; its `id` names the job, so a retry with the same id is no second job."""
        if mode == "structured":
            headers, body = encode_structured(spec, source, id, type=type)
        elif mode == "binary":
            headers, body = encode_binary(spec, source, id, type=type)
        else:
            raise ValueError(f"mode must be 'structured' or 'binary', not {mode!r}")
        return await self.submit_raw(body, headers)

    async def ops(self, subject: str, payload: Mapping[str, Any] | None = None) -> Any:
        body = dict(payload or {})
        if self.team and "team" not in body:
            body["team"] = self.team
        data = await self._request(subject, json.dumps(body).encode())
        try:
            reply = json.loads(data)
        except json.JSONDecodeError as exc:
            raise PlatformError(f"unreadable answer on {subject}: {data[:200]!r}") from exc
        if not reply.get("ok"):
            raise PlatformError(str(reply.get("error") or reply))
        return reply["result"]

    async def get_job(self, job_id: str) -> JobRecord:
        return JobRecord.model_validate(await self.ops(subjects.OPS_JOB_SHOW, {"job_id": job_id}))

    async def list_jobs(
        self,
        team: str | None = None,
        *,
        state: str | Iterable[str] | None = None,
        since: float | str | datetime | None = None,
        user: str | None = None,
        limit: int | None = None,
    ) -> list[JobRecord]:
        """Jobs of `team` (the client's, or every team for an operator), live ones first, then the archive; every
        page followed. `state`: names or Slurm codes (`"RUNNING,FAILED"`, `["R", "PD"]`); `since`: jobs that had
        not ended by then (epoch seconds, ISO-8601, or a datetime); `limit`: at most this many in all."""
        return [r async for r in self.iter_jobs(team, state=state, since=since, user=user, limit=limit)]

    async def iter_jobs(
        self,
        team: str | None = None,
        *,
        state: str | Iterable[str] | None = None,
        since: float | str | datetime | None = None,
        user: str | None = None,
        limit: int | None = None,
        page_size: int = JOB_PAGE_MAX,
    ) -> AsyncIterator[JobRecord]:
        """`list_jobs` one record at a time, a page (at most `page_size`, and never past NATS' max_payload) per
        request. A job that moved to the archive between two pages comes once, as first seen."""
        payload: dict[str, Any] = {}
        if team:
            payload["team"] = team
        if state is not None:
            payload["state"] = state if isinstance(state, str) else list(state)
        if since is not None:
            payload["since"] = since.timestamp() if isinstance(since, datetime) else since
        if user:
            payload["user"] = user
        seen: set[str] = set()
        cursor: str | None = None
        while limit is None or len(seen) < limit:
            want = page_size if limit is None else min(page_size, limit - len(seen))
            result = await self.ops(f"{subjects.PREFIX}.ops.job.list", {**payload, "limit": want, "cursor": cursor})
            if isinstance(result, list):  # an intake from before paging answers with every job at once
                rows, cursor = result, None
            else:
                rows, cursor = result["jobs"], result.get("next")
            for row in rows:
                rec = JobRecord.model_validate(row)
                if rec.job_id in seen:
                    continue
                seen.add(rec.job_id)
                yield rec
                if limit is not None and len(seen) >= limit:
                    return
            if cursor is None:
                return

    async def cancel(self, job_id: str, team: str | None = None) -> dict[str, Any]:
        payload: dict[str, Any] = {"job_id": job_id, "by": os.environ.get("USER", "cli")}
        if team:
            payload["team"] = team
        result: dict[str, Any] = await self.ops(subjects.OPS_JOB_CANCEL, payload)
        return result

    async def explain(self, job_id: str) -> dict[str, Any]:
        result: dict[str, Any] = await self.ops(subjects.OPS_JOB_EXPLAIN, {"job_id": job_id})
        return result

    async def queue(self, page_size: int = 500) -> list[dict[str, Any]]:
        """squeue's rows, every page of them (the solver answers at most `page_size` rows per request)."""
        rows: list[dict[str, Any]] = []
        cursor: str | None = None
        while True:
            payload: dict[str, Any] = {"limit": page_size} | ({"cursor": cursor} if cursor else {})
            page = await self.ops(subjects.OPS_QUEUE_LIST, payload)
            rows.extend(page["rows"])
            cursor = page.get("next")
            if not cursor:
                return rows

    async def services(self, quiet_s: float = 0.3, kind: str = "INFO") -> list[dict[str, Any]]:
        """Discover NATS micro services the way `nats micro ls` does: collect replies until `quiet_s` of quiet."""
        inbox = self.nc.new_inbox()
        replies: asyncio.Queue[bytes] = asyncio.Queue()

        async def collect(msg: Any) -> None:
            await replies.put(msg.data)

        sub = await self.nc.subscribe(inbox, cb=collect)
        try:
            await self.nc.publish(f"$SRV.{kind}", b"", reply=inbox)
            out: list[dict[str, Any]] = []
            while True:
                try:
                    data = await asyncio.wait_for(replies.get(), timeout=quiet_s)
                except TimeoutError:
                    return out
                if data:  # an empty message is the server's "no responders" status
                    out.append(json.loads(data))
        finally:
            await sub.unsubscribe()

    async def nodes(self, page_size: int = 100) -> list[NodeRecord]:
        """Every node the registry knows, a page at a time (512 node records are well over NATS' max_payload)."""
        out: list[NodeRecord] = []
        cursor: str | None = None
        while True:
            payload: dict[str, Any] = {"limit": page_size} | ({"cursor": cursor} if cursor else {})
            page = await self.ops(subjects.OPS_NODE_LIST, payload)
            out.extend(NodeRecord.model_validate(r) for r in page["nodes"])
            cursor = page.get("next")
            if not cursor:
                return out

    async def node_op(self, subject: str, node: str, **extra: Any) -> dict[str, Any]:
        result: dict[str, Any] = await self.ops(subject, {"node": node, **extra})
        return result


def run_with_client(nats_url: str | None, team: str | None, fn: Callable[[OnePlusClient], Awaitable[T]]) -> T:
    """Connect, run `fn` with the client, close: the one synchronous entry every CLI command goes through."""

    async def go() -> T:
        async with OnePlusClient.connect(nats_url, team=team) as c:
            return await fn(c)

    return asyncio.run(go())
