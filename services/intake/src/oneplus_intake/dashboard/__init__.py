"""The web dashboard the intake serves at `/ui/` (docs/dashboard.md).

Static files (index.html, dashboard.js, dashboard.css: no build step) and JSON under `/ui/api/`:

  GET /ui/api/cluster             leaves → nodes → NVLink domains → GPUs, holders and health, fragmentation counts
  GET /ui/api/queue               pending jobs (serving order, with reason) and the jobs holding GPUs
  GET /ui/api/explain/{job_id}    why one pending job waits (the solver's `oneplus jobs explain`)
  GET /ui/api/job/{job_id}        one job: record, placement, milestones, events in stream order

The page polls the cluster and the queue every 1.5 s; answers are cached a second (source.py). The view is the
operator's: every team's jobs. The intake binds 127.0.0.1 unless ONEPLUS_HTTP_HOST says otherwise.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from aiohttp import web

from .source import Bus, DashboardError, DashboardSource

__all__ = ["STATIC_DIR", "Dashboard", "DashboardError", "DashboardSource", "mount_dashboard"]

STATIC_DIR = Path(__file__).parent / "static"
_JOB_ID = re.compile(r"^[A-Za-z0-9_-]{1,128}$")  # a NATS subject token: no dots, no wildcards
_NO_CACHE = {"Cache-Control": "no-store"}


def _json(status: int, body: Any) -> web.Response:
    return web.Response(status=status, text=json.dumps(body), content_type="application/json", headers=_NO_CACHE)


class Dashboard:
    def __init__(self, source: DashboardSource) -> None:
        self.source = source

    def routes(self, app: web.Application) -> None:
        app.router.add_get("/ui", self.redirect)
        app.router.add_get("/ui/", self.index)
        app.router.add_get("/ui/api/cluster", self.cluster)
        app.router.add_get("/ui/api/queue", self.queue)
        app.router.add_get("/ui/api/explain/{job_id}", self.explain)
        app.router.add_get("/ui/api/job/{job_id}", self.job)
        app.router.add_static("/ui/static", STATIC_DIR, follow_symlinks=False)

    async def redirect(self, request: web.Request) -> web.Response:
        return web.Response(status=302, headers={"Location": "/ui/"})

    async def index(self, request: web.Request) -> web.Response:
        return web.Response(
            text=(STATIC_DIR / "index.html").read_text(encoding="utf-8"), content_type="text/html", headers=_NO_CACHE
        )

    async def _answer(self, what: Any) -> web.Response:
        try:
            return _json(200, {"ok": True, "result": await what})
        except DashboardError as exc:
            return _json(exc.status, {"ok": False, "error": str(exc)})

    async def cluster(self, request: web.Request) -> web.Response:
        return await self._answer(self.source.cluster())

    async def queue(self, request: web.Request) -> web.Response:
        return await self._answer(self.source.queue())

    def _job_id(self, request: web.Request) -> str:
        job_id = request.match_info["job_id"]
        if not _JOB_ID.match(job_id):
            raise DashboardError(f"not a job id: {job_id[:130]!r}", 400)
        return job_id

    async def explain(self, request: web.Request) -> web.Response:
        try:
            job_id = self._job_id(request)
        except DashboardError as exc:
            return _json(exc.status, {"ok": False, "error": str(exc)})
        return await self._answer(self.source.explain(job_id))

    async def job(self, request: web.Request) -> web.Response:
        try:
            job_id = self._job_id(request)
        except DashboardError as exc:
            return _json(exc.status, {"ok": False, "error": str(exc)})
        return await self._answer(self.source.job(job_id))


def mount_dashboard(app: web.Application, bus: Bus) -> Dashboard:
    """Add the dashboard's routes to the intake's HTTP app; `bus` gives the NATS connection (read per request)."""
    dashboard = Dashboard(DashboardSource(bus))
    dashboard.routes(app)
    return dashboard
