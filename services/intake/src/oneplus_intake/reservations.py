"""Advance reservations written by the intake: `oneplus.ops.reservation.create|list|delete` and the HTTP API's
`/v1/reservations` go through these handlers, so the CLI and HTTP callers get the same checks and the same one-line
refusals (a start in the past, an unknown node, a taken name, an overlap on the same nodes, a GPU count the
cluster cannot hold in that window). Creating and deleting are an operator's (a platform caller); anyone may list.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from nats.js.errors import InvalidKeyError, KeyNotFoundError, KeyWrongLastSequenceError
from oneplus_bus.ledger import latest_entries
from oneplus_bus.service import OneplusService, OpsError
from oneplus_bus.tenancy import Caller
from oneplus_contracts import NodeRecord, subjects
from oneplus_contracts.advance import AdvanceReservation, AdvanceReservationRequest
from oneplus_queueing.advance import (
    AdvanceBook,
    AdvanceReservationError,
    check_new,
    check_window,
    pick_nodes,
    window_rows,
)
from pydantic import ValidationError


def validation_line(exc: ValidationError) -> str:
    """A pydantic refusal as one line: each problem's message, the field named when it is a field's."""
    parts = []
    for e in exc.errors():
        msg = str(e["msg"]).removeprefix("Value error, ")
        where = ".".join(str(x) for x in e.get("loc", ()))
        parts.append(f"{where}: {msg}" if where and not msg.startswith("reservation") else msg)
    return "; ".join(parts)


class ReservationOps:
    """The intake's reservation handlers over its bus; `nodes` gives the cluster's nodes (the intake's copy)."""

    def __init__(self, svc: OneplusService, nodes: Callable[[], Awaitable[list[NodeRecord]]]) -> None:
        self.svc = svc
        self.nodes = nodes
        self.writing = asyncio.Lock()  # one create at a time here; replicas are settled by the bucket's order

    async def _bucket(self) -> Any:
        return await self.svc.js.key_value(subjects.ADVANCE_RESERVATIONS_KV)

    async def stored(self) -> list[AdvanceReservation]:
        """Every stored reservation, read from the bucket now (a create checks against the latest)."""
        return [res for res, _ in await self._stored_with_revisions()]

    async def _stored_with_revisions(self) -> list[tuple[AdvanceReservation, int]]:
        out: list[tuple[AdvanceReservation, int]] = []
        for key, value, revision in await latest_entries(self.svc.js, subjects.ADVANCE_RESERVATIONS_KV):
            book = AdvanceBook()
            if book.apply(key, value) is None:
                out.append((book.by_name[key], revision))
        return out

    @staticmethod
    def operator(caller: Caller, what: str) -> None:
        if caller.team is not None:
            raise OpsError(f"{what} is an operator's: team {caller.team!r} may not", 403)

    async def create(self, payload: dict[str, Any], caller: Caller) -> dict[str, Any]:
        """Check the request against the stored reservations and the cluster's nodes, then store it (the name is
        taken by the bucket's create, so two creates of one name cannot both succeed)."""
        self.operator(caller, "creating a reservation")
        try:
            req = AdvanceReservationRequest.model_validate(payload)
        except ValidationError as exc:
            raise OpsError(validation_line(exc), 400) from None
        async with self.writing:
            return await self._create(req)

    async def _create(self, req: AdvanceReservationRequest) -> dict[str, Any]:
        now = time.time()
        existing = await self.stored()
        known = {r.topology.node: r for r in await self.nodes()}
        try:
            nodes = req.nodes
            if req.gpus is not None:
                if not known:
                    raise AdvanceReservationError(f"reservation {req.name}: the cluster has no nodes to hold GPUs", 409)
                check_window(req.name, req.start_ts, req.end_ts, now)  # no nodes are picked for a past window
                gpus_of = {n: len(r.topology.gpus) for n, r in known.items() if r.status != "lost"}
                nodes = pick_nodes(req.name, req.gpus, req.start_ts, req.end_ts, gpus_of, existing)
            res = req.reservation(nodes, now)
            check_new(res, existing, now, known_nodes=list(known))
        except AdvanceReservationError as exc:
            raise OpsError(str(exc), exc.code) from None
        kv = await self._bucket()
        try:
            revision = await kv.create(res.name, res.model_dump_json().encode())
        except KeyWrongLastSequenceError:
            raise OpsError(f"reservation {res.name} already exists; delete it first", 409) from None
        # Another intake may have stored an overlapping one meanwhile: the one written first stands.
        earlier = [other for other, rev in await self._stored_with_revisions() if rev < revision]
        try:
            check_new(res, earlier, now)
        except AdvanceReservationError as exc:
            await kv.delete(res.name, last=revision)
            raise OpsError(str(exc), exc.code) from None
        return dict(res.model_dump(mode="json"))

    async def list(self) -> dict[str, Any]:
        """Every reservation with its state now (WAITING, ACTIVE, ENDED), as `oneplus reservation list --json`."""
        return {"reservations": window_rows(time.time(), await self.stored())}

    async def delete(self, payload: dict[str, Any], caller: Caller) -> dict[str, Any]:
        self.operator(caller, "deleting a reservation")
        name = payload.get("name")
        if not isinstance(name, str) or not name:
            raise OpsError("name the reservation to delete", 400)
        kv = await self._bucket()
        try:
            entry = await kv.get(name)
        except (KeyNotFoundError, InvalidKeyError):  # an invalid key (spaces, wildcards) names none either
            entry = None
        if entry is None or not entry.value:
            raise OpsError(f"no reservation {name!r}", 404)
        await kv.delete(name)
        return {"name": name, "deleted": True}
