"""The web dashboard the intake serves at `/ui/` (docs/dashboard.md).

Static files (index.html, dashboard.js, dashboard.css: no build step) and JSON under `/ui/api/`:

  GET /ui/api/cluster             the site's level tree (any depth) and leaves → nodes → NVLink domains → GPUs,
                                  holders and health, fragmentation counts, each GPU's MIG instances
  GET /ui/api/node/{name}         one node: its row, its domains from the top of the level tree, its MIG layout
  GET /ui/api/queue               pending jobs (serving order, with reason) and the jobs holding GPUs
  GET /ui/api/explain/{job_id}    why one pending job waits (the solver's `oneplus jobs explain`)
  GET /ui/api/job/{job_id}        one job: record, placement, milestones, events in stream order

The page polls the cluster and the queue every 1.5 s; answers are cached a second (source.py). The view is the
operator's: every team's jobs. The intake binds 127.0.0.1 unless ONEPLUS_HTTP_HOST says otherwise.

With HTTP tokens configured (auth.py) `/ui/api/*` needs a platform token, as a bearer header or as the
`oneplus_token` cookie: without one `/ui/` answers a login form that posts the token to `POST /ui/login`, which
sets the cookie (HttpOnly, SameSite=Strict, path /ui) and goes back to `/ui/`; `POST /ui/logout` clears it.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

from aiohttp import web

from ..auth import COOKIE, TokenBook, bearer
from .source import Bus, DashboardError, DashboardSource

__all__ = ["STATIC_DIR", "Dashboard", "DashboardError", "DashboardSource", "mount_dashboard"]

STATIC_DIR = Path(__file__).parent / "static"
_JOB_ID = re.compile(r"^[A-Za-z0-9_-]{1,128}$")  # a NATS subject token: no dots, no wildcards
_NODE_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,252})$")  # a hostname
_NO_CACHE = {"Cache-Control": "no-store"}
COOKIE_MAX_AGE_S = 12 * 3600
LOGIN_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>OnePlus: sign in</title></head>
<body style="font-family: sans-serif; max-width: 32em; margin: 4em auto">
<h1>OnePlus dashboard</h1>
<p>{message}</p>
<form method="post" action="/ui/login">
<label>Platform token <input type="password" name="token" autocomplete="current-password" autofocus></label>
<button type="submit">Sign in</button>
</form>
</body></html>
"""


def _json(status: int, body: Any) -> web.Response:
    return web.Response(status=status, text=json.dumps(body), content_type="application/json", headers=_NO_CACHE)


def login_page(status: int, message: str) -> web.Response:
    return web.Response(
        status=status,
        text=LOGIN_PAGE.format(message=html.escape(message)),
        content_type="text/html",
        headers=_NO_CACHE,
    )


def _see_dashboard() -> web.Response:
    return web.Response(status=303, headers={"Location": "/ui/", **_NO_CACHE})


class Dashboard:
    def __init__(self, source: DashboardSource, tokens: TokenBook | None = None) -> None:
        self.source = source
        self.tokens = tokens or TokenBook()

    def signed_in(self, request: web.Request) -> bool:
        """With tokens configured: whether the request carries a platform token (header or cookie)."""
        token, _ = bearer(request, cookie=True)
        who = self.tokens.identify(token) if token else None
        return who is not None and who.platform

    def routes(self, app: web.Application) -> None:
        app.router.add_get("/ui", self.redirect)
        app.router.add_get("/ui/", self.index)
        app.router.add_post("/ui/login", self.login)
        app.router.add_post("/ui/logout", self.logout)
        app.router.add_get("/ui/api/cluster", self.cluster)
        app.router.add_get("/ui/api/queue", self.queue)
        app.router.add_get("/ui/api/node/{name}", self.node)
        app.router.add_get("/ui/api/explain/{job_id}", self.explain)
        app.router.add_get("/ui/api/job/{job_id}", self.job)
        app.router.add_static("/ui/static", STATIC_DIR, follow_symlinks=False)

    async def redirect(self, request: web.Request) -> web.Response:
        return web.Response(status=302, headers={"Location": "/ui/"})

    async def index(self, request: web.Request) -> web.Response:
        if self.tokens and not self.signed_in(request):
            return login_page(200, "This dashboard shows every team's jobs: sign in with a platform token.")
        return web.Response(
            text=(STATIC_DIR / "index.html").read_text(encoding="utf-8"), content_type="text/html", headers=_NO_CACHE
        )

    async def login(self, request: web.Request) -> web.Response:
        if not self.tokens:
            return _see_dashboard()  # nothing to sign in to
        form = await request.post()
        token = form.get("token")
        who = self.tokens.identify(token.strip()) if isinstance(token, str) and token.strip() else None
        if who is None:
            return login_page(401, "Unknown token.")
        if not who.platform:
            return login_page(403, "That is a team token: the dashboard needs a platform token.")
        answer = _see_dashboard()
        answer.set_cookie(
            COOKIE,
            token.strip() if isinstance(token, str) else "",
            path="/ui",
            max_age=COOKIE_MAX_AGE_S,
            httponly=True,
            samesite="Strict",
            secure=request.secure,
        )
        return answer

    async def logout(self, request: web.Request) -> web.Response:
        answer = _see_dashboard()
        answer.del_cookie(COOKIE, path="/ui")
        return answer

    async def _answer(self, what: Any) -> web.Response:
        try:
            return _json(200, {"ok": True, "result": await what})
        except DashboardError as exc:
            return _json(exc.status, {"ok": False, "error": str(exc)})

    async def cluster(self, request: web.Request) -> web.Response:
        return await self._answer(self.source.cluster())

    async def queue(self, request: web.Request) -> web.Response:
        return await self._answer(self.source.queue())

    async def node(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if not _NODE_NAME.match(name):
            return _json(400, {"ok": False, "error": f"not a node name: {name[:130]!r}"})
        return await self._answer(self.source.node(name))

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


def mount_dashboard(app: web.Application, bus: Bus, tokens: TokenBook | None = None) -> Dashboard:
    """Add the dashboard's routes to the intake's HTTP app; `bus` gives the NATS connection (read per request)."""
    dashboard = Dashboard(DashboardSource(bus), tokens)
    dashboard.routes(app)
    return dashboard
