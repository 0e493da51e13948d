"""A Python client for CI scripts and the CLI: submit jobs and ask the platform about them over NATS.

async with OnePlusClient.connect() as c:
    reply = await c.submit(spec, msg_id="ci-run-1234")
"""

from __future__ import annotations

import asyncio
import gc
import getpass
import importlib.util
import json
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from datetime import datetime
from functools import cache
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal, TypeVar

# Start-up time: nats, pydantic and the contracts' models cost most of a second to import, and `oneplus --help`,
# `oneplus queue` need none of the models: they are imported where a method needs them.
if TYPE_CHECKING:
    from nats.aio.client import Client
    from oneplus_contracts import JobRecord, JobSpec, NodeRecord, SubmitReply
    from oneplus_contracts.advance import AdvanceReservation, AdvanceReservationRequest
    from pydantic import TypeAdapter

SUBMIT_EVENT_TYPE = "io.oneplus.job.submit"  # oneplus_jobformats.cloudevents.SUBMIT_EVENT_TYPE (a test checks it)


def _load_subjects() -> ModuleType:
    """`oneplus_contracts.subjects` (plain string constants) without importing the package, whose `__init__` builds
    every pydantic model (0.4 s of CPU); the package's own module when something has imported it already."""
    loaded = sys.modules.get("oneplus_contracts.subjects")
    if loaded is not None:
        return loaded
    try:
        spec = importlib.util.find_spec("oneplus_contracts")  # a top-level name: found, not imported
        where = list(spec.submodule_search_locations or []) if spec else []
        file_spec = importlib.util.spec_from_file_location("oneplus._contracts_subjects", f"{where[0]}/subjects.py")
        if file_spec is None or file_spec.loader is None:
            raise ImportError("no subjects.py")
        mod = importlib.util.module_from_spec(file_spec)
        file_spec.loader.exec_module(mod)
        return mod
    except (ImportError, IndexError, OSError):
        from oneplus_contracts import subjects as real

        return real


subjects = _load_subjects()

TEAM_HEADER = "Oneplus-Team"
QUEUES_CONFIG_KEY = "config"  # oneplus_stores.clusterview.QUEUES_KEY (a test checks they agree)
JOB_PAGE_MAX = 1000  # the most jobs the intake puts in one page of `oneplus.ops.job.list`


T = TypeVar("T")


def read_job_page(subject: str, data: bytes) -> tuple[list[JobRecord], str | None]:
    """A reply of the job list: its records and the next page's cursor. The reply is read by pydantic in one pass
    (json.loads and a model a record took 2.6 times as long: most of a long listing's time in the client)."""
    from pydantic import ValidationError

    try:
        with _collector_paused():
            reply = _job_list_reply().validate_json(data)
    except ValidationError as exc:
        errors = exc.errors()
        first = errors[0] if errors else {"loc": (), "msg": str(exc)}
        loc = ".".join(str(part) for part in first["loc"])
        where = f"{loc}: " if loc else ""
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise PlatformError(f"unreadable answer on {subject}: {where}{first['msg']}{more}") from None
    if not reply.ok:
        raise PlatformError(str(reply.error or "the job list failed, and did not say why"))
    if isinstance(reply.result, list):  # an intake from before paging answers with every job at once
        return reply.result, None
    if reply.result is None:
        raise PlatformError(f"unreadable answer on {subject}: no result")
    return reply.result.jobs, reply.result.next


@contextmanager
def _collector_paused() -> Iterator[None]:
    """No garbage collection while one page (at most NATS' max_payload) is read. Its records are new and none is
    garbage, yet each young collection moved them on and each full one walked every record kept so far: the
    collector took over half the time of reading 10,000 jobs."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@cache
def _job_list_reply() -> TypeAdapter[Any]:
    """The job list's reply as pydantic reads it (built on first use: pydantic and the models cost start-up time)."""
    from oneplus_contracts import JobRecord
    from pydantic import TypeAdapter as Adapter
    from pydantic import create_model

    # Made by create_model: classes in a function, with postponed annotations, leave pydantic names to resolve.
    page = create_model("JobListPage", jobs=(list[JobRecord], ...), next=(str | None, None))
    reply = create_model(
        "JobListReply", ok=(bool, ...), result=(page | list[JobRecord] | None, None), error=(str | None, None)
    )
    return Adapter(reply)


class PlatformError(RuntimeError):
    """The platform answered with an error, or nobody answered."""


def submitting_user(env: Mapping[str, str] | None = None) -> str:
    """Who submits: `ONEPLUS_USER`, else `USER`, else `LOGNAME`, else the login name of the process (`getpass`),
    else "unknown". Every submission path of the CLI (`submit` in every format, `sbatch`) asks this one function."""
    env = os.environ if env is None else env
    for name in ("ONEPLUS_USER", "USER", "LOGNAME"):
        value = (env.get(name) or "").strip()
        if value:
            return value
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no login name and no passwd entry, e.g. in a bare container
        return "unknown"


def with_submitter(spec: JobSpec, env: Mapping[str, str] | None = None) -> JobSpec:
    """`spec` owned by `submitting_user()` unless its document named a user of its own."""
    if "user" in spec.model_fields_set and spec.user not in ("", "unknown"):
        return spec
    return spec.model_copy(update={"user": submitting_user(env)})


def _import_nats(url: str) -> None:
    """Import nats-py for a command line that connects once and exits. nats-py imports aiohttp (0.35 s of CPU) for
    WebSocket URLs only; for a nats:// or tls:// URL the import is left out of this process."""
    if "nats" in sys.modules or url.startswith(("ws://", "wss://")) or "aiohttp" in sys.modules:
        import nats

        return
    sys.modules["aiohttp"] = None  # type: ignore[assignment]  # makes nats.aio.transport's `import aiohttp` fail
    try:
        import nats  # noqa: F401
    finally:
        del sys.modules["aiohttp"]  # anything else may import it later


class OnePlusClient:
    def __init__(self, nc: Client, team: str | None = None, timeout: float = 5.0, *, where: str = "") -> None:
        self.nc = nc
        self.team = team
        self.timeout = timeout
        self.where = where  # "nats://... (from NATS_URL)": named in the errors that say nobody answers

    @classmethod
    @asynccontextmanager
    async def connect(
        cls, nats_url: str | None = None, *, team: str | None = None, timeout: float = 5.0
    ) -> AsyncIterator[OnePlusClient]:
        import nats

        from .devstate import locate_nats

        target = locate_nats(nats_url)
        url = target.url
        errors: list[Exception] = []

        async def keep(exc: Exception) -> None:
            errors.append(exc)  # nats-py's default prints a traceback per failed attempt; the caller gets one line

        try:
            nc = await nats.connect(
                # NATS_URL may name every server of a cluster, comma-separated.
                servers=[u.strip() for u in url.split(",") if u.strip()],
                connect_timeout=3,
                max_reconnect_attempts=1,
                reconnect_time_wait=0.5,
                allow_reconnect=False,
                error_cb=keep,
            )
        except Exception as exc:
            cause = errors[-1] if errors else exc
            why = str(cause) or type(cause).__name__
            raise PlatformError(
                f"cannot reach NATS at {target.describe()}: {why}; is the platform up (`oneplus dev up`)?"
            ) from None
        try:
            yield cls(nc, team=team or os.environ.get("ONEPLUS_TEAM"), timeout=timeout, where=target.describe())
        finally:
            await nc.close()

    async def _request(self, subject: str, body: bytes, headers: Mapping[str, str] | None = None) -> bytes:
        from nats.errors import NoRespondersError
        from nats.errors import TimeoutError as NatsTimeout

        hdrs = dict(headers or {})
        if self.team:
            # The intake reads the team from here; across a team's NATS account the server's stamp decides.
            hdrs.setdefault(TEAM_HEADER, self.team)
        try:
            msg = await self.nc.request(subject, body, timeout=self.timeout, headers=hdrs)
        except NoRespondersError as exc:
            at = f" at {self.where}" if self.where else ""
            raise PlatformError(f"no service answers on {subject}{at}; is the platform up?") from exc
        except NatsTimeout as exc:
            raise PlatformError(f"no answer on {subject} within {self.timeout:g}s") from exc
        return bytes(msg.data)

    async def submit_raw(self, body: bytes, headers: Mapping[str, str] | None = None) -> SubmitReply:
        from oneplus_contracts import SubmitReply

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
        from oneplus_jobformats.cloudevents import encode_binary, encode_structured

        if mode == "structured":
            headers, body = encode_structured(spec, source, id, type=type)
        elif mode == "binary":
            headers, body = encode_binary(spec, source, id, type=type)
        else:
            raise ValueError(f"mode must be 'structured' or 'binary', not {mode!r}")
        return await self.submit_raw(body, headers)

    async def _ops_request(self, subject: str, payload: Mapping[str, Any] | None) -> bytes:
        body = dict(payload or {})
        if self.team and "team" not in body:
            body["team"] = self.team
        return await self._request(subject, json.dumps(body).encode())

    async def ops(self, subject: str, payload: Mapping[str, Any] | None = None) -> Any:
        data = await self._ops_request(subject, payload)
        try:
            reply = json.loads(data)
        except json.JSONDecodeError as exc:
            raise PlatformError(f"unreadable answer on {subject}: {data[:200]!r}") from exc
        if not reply.get("ok"):
            raise PlatformError(str(reply.get("error") or reply))
        return reply["result"]

    async def get_job(self, job_id: str) -> JobRecord:
        from oneplus_contracts import JobRecord

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
            request = {**payload, "limit": want, "cursor": cursor}
            subject = f"{subjects.PREFIX}.ops.job.list"
            rows, cursor = read_job_page(subject, await self._ops_request(subject, request))
            for rec in rows:
                if rec.job_id in seen:
                    continue
                seen.add(rec.job_id)
                yield rec
                if limit is not None and len(seen) >= limit:
                    return
            if cursor is None:
                return

    async def cancel(self, job_id: str, team: str | None = None) -> dict[str, Any]:
        payload: dict[str, Any] = {"job_id": job_id, "by": submitting_user()}
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
        from oneplus_contracts import NodeRecord

        out: list[NodeRecord] = []
        cursor: str | None = None
        while True:
            payload: dict[str, Any] = {"limit": page_size} | ({"cursor": cursor} if cursor else {})
            page = await self.ops(subjects.OPS_NODE_LIST, payload)
            out.extend(NodeRecord.model_validate(r) for r in page["nodes"])
            cursor = page.get("next")
            if not cursor:
                return out

    async def _queues_bucket(self) -> Any:
        from nats.js.errors import BucketNotFoundError

        try:
            return await self.nc.jetstream().key_value(subjects.QUEUES_KV)
        except BucketNotFoundError:
            raise PlatformError(
                f"no `{subjects.QUEUES_KV}` bucket at {self.where or 'this NATS'}: the platform has not started here"
            ) from None

    async def queue_config_text(self) -> str | None:
        """The queue config stored in the `queues` bucket (YAML); None when none is (the services then use their
        ONEPLUS_QUEUES_FILE or the default `default` queue)."""
        from nats.js.errors import KeyNotFoundError

        try:
            entry = await (await self._queues_bucket()).get(QUEUES_CONFIG_KEY)
        except KeyNotFoundError:
            return None
        return entry.value.decode() if entry.value else None

    async def put_queue_config(self, yaml_text: str) -> None:
        """Store a queue config (checked by the caller: `oneplus_queueing.queuefile.load_queue_file`); the intake,
        the solver and the preemption service follow the bucket."""
        await (await self._queues_bucket()).put(QUEUES_CONFIG_KEY, yaml_text.encode())

    async def _advance_bucket(self) -> Any:
        from nats.js.errors import BucketNotFoundError

        try:
            return await self.nc.jetstream().key_value(subjects.ADVANCE_RESERVATIONS_KV)
        except BucketNotFoundError:
            raise PlatformError(
                f"no `{subjects.ADVANCE_RESERVATIONS_KV}` bucket at {self.where or 'this NATS'}: the platform has not "
                "started here"
            ) from None

    async def advance_reservations(self) -> list[AdvanceReservation]:
        """Every advance reservation stored (ended ones too, until deleted)."""
        from oneplus_bus.ledger import latest_entries
        from oneplus_contracts.advance import AdvanceReservation

        await self._advance_bucket()  # says so when the platform has not started here
        items = await latest_entries(self.nc.jetstream(), subjects.ADVANCE_RESERVATIONS_KV)
        return [AdvanceReservation.model_validate_json(value) for _, value, _ in items]

    async def reservations(self) -> list[dict[str, Any]]:
        """Every advance reservation as the intake lists it (`oneplus.ops.reservation.list`): name, state (WAITING,
        ACTIVE, ENDED), nodes, GPUs, window, who is admitted; a team may ask too."""
        result: dict[str, Any] = await self.ops(subjects.OPS_RESERVATION_LIST, {})
        rows: list[dict[str, Any]] = result["reservations"]
        return rows

    async def create_advance_reservation(self, res: AdvanceReservation, now: float | None = None) -> AdvanceReservation:
        """Create it through the intake (`oneplus.ops.reservation.create`), which checks it against the others and
        the cluster's nodes (`oneplus_queueing.advance.check_new`) and stores it; `now` is the intake's clock now."""
        from oneplus_contracts.advance import AdvanceReservationRequest

        fields = res.model_dump(include={"name", "nodes", "start_ts", "end_ts", "users", "teams", "accounts", "maint"})
        return await self.create_reservation(AdvanceReservationRequest.model_validate(fields))

    async def create_reservation(self, req: AdvanceReservationRequest) -> AdvanceReservation:
        """Create a reservation of nodes or of a GPU count (the intake picks whole nodes for it); a refusal is a
        PlatformError of one line, the same the HTTP API answers."""
        from oneplus_contracts.advance import AdvanceReservation

        stored = await self.ops(subjects.OPS_RESERVATION_CREATE, req.model_dump(mode="json", exclude_none=True))
        return AdvanceReservation.model_validate(stored)

    async def delete_advance_reservation(self, name: str) -> bool:
        """Delete it through the intake; False when there is none of that name."""
        try:
            await self.ops(subjects.OPS_RESERVATION_DELETE, {"name": name})
        except PlatformError as exc:
            if str(exc) == f"no reservation {name!r}":
                return False
            raise
        return True

    async def signal(self, job_id: str, signal: str, team: str | None = None) -> dict[str, Any]:
        """`scancel --signal`: send `signal` to the running job's processes (batch script, ranks, srun steps' tasks)
        on every node it runs on, without ending it."""
        payload: dict[str, Any] = {"job_id": job_id, "signal": signal, "by": submitting_user()}
        if team:
            payload["team"] = team
        result: dict[str, Any] = await self.ops(subjects.OPS_JOB_SIGNAL, payload)
        return result

    async def node_op(self, subject: str, node: str, **extra: Any) -> dict[str, Any]:
        result: dict[str, Any] = await self.ops(subject, {"node": node, **extra})
        return result


def run_with_client(nats_url: str | None, team: str | None, fn: Callable[[OnePlusClient], Awaitable[T]]) -> T:
    """Connect, run `fn` with the client, close: the one synchronous entry every CLI command goes through."""

    from .devstate import locate_nats

    _import_nats(locate_nats(nats_url).url)

    async def go() -> T:
        async with OnePlusClient.connect(nats_url, team=team) as c:
            return await fn(c)

    return asyncio.run(go())
