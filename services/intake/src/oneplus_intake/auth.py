"""Who may call the HTTP intake: a bearer token per team, and platform tokens that may act for any team.

Tokens come from `ONEPLUS_HTTP_TOKENS_FILE` (YAML or JSON: team → list of tokens) and `ONEPLUS_HTTP_TOKENS`
(`team=token,team=token`). An entry is either a SHA-256 hash of the token, written `sha256:<64 hex digits>` (what
to store: `printf %s "$TOKEN" | sha256sum`), or the token itself. The key `"*"` in the file, and the team `*` in the
variable, names platform tokens: their caller is an operator who may act for any team (the `Oneplus-Team` header
chooses one, as on loopback without tokens). `ONEPLUS_HTTP_ADMIN_TOKEN` adds one platform token.

A presented token is hashed and compared with every stored hash in constant time (`hmac.compare_digest`, no early
exit), so neither the tokens nor their hashes leak through timing. With tokens configured, `/v1/*` and `/ui/api/*`
need `Authorization: Bearer <token>` (401 with `WWW-Authenticate: Bearer` without one, or with an unknown one); the
team is the token's, and an `Oneplus-Team` header or `team` parameter naming another team is 403. The dashboard's
JSON (`/ui/api/*`) is the operator's view of every team: it takes a platform token only (a team token is 403), from
the header or from the `oneplus_token` cookie that the dashboard's login form (`POST /ui/login`) sets. `/healthz`,
`/openapi.json`, the dashboard's page and static files stay open; `POST /webhooks/mlflow` is authenticated by its
HMAC signature (`ONEPLUS_MLFLOW_SECRET`: MLflow cannot send a bearer token).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web
from oneplus_bus.tenancy import TEAM_HEADER

from .http_api import error_response

PLATFORM = "*"  # the "team" of platform tokens, in the file and in ONEPLUS_HTTP_TOKENS
HASH_PREFIX = "sha256:"
COOKIE = "oneplus_token"
REALM = "oneplus"
_HEX64 = re.compile(r"[0-9a-f]{64}")
_TEAM = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # JobSpec's team names
MIN_TOKEN_CHARS = 16

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class TokenError(ValueError):
    """A tokens file or variable that cannot be used; the message names it (never a token)."""


@dataclass(frozen=True)
class Identity:
    """The caller a token stands for: a team, or the platform (team None) that may act for any team."""

    team: str | None

    @property
    def platform(self) -> bool:
        return self.team is None


def token_hash(token: str) -> str:
    """What to store for a token: `sha256:` and the hex digest of its UTF-8 bytes."""
    return HASH_PREFIX + hashlib.sha256(token.encode()).hexdigest()


def _digest(entry: str, where: str) -> bytes:
    entry = entry.strip()
    if entry.lower().startswith(HASH_PREFIX):
        hexdigest = entry[len(HASH_PREFIX) :].lower()
        if not _HEX64.fullmatch(hexdigest):
            raise TokenError(f"{where}: a {HASH_PREFIX} entry must be 64 hex digits")
        return bytes.fromhex(hexdigest)
    if len(entry) < MIN_TOKEN_CHARS:
        raise TokenError(f"{where}: a token must be at least {MIN_TOKEN_CHARS} characters (or a {HASH_PREFIX} hash)")
    return hashlib.sha256(entry.encode()).digest()


def _team(name: Any, where: str) -> str | None:
    if name == PLATFORM:
        return None
    if not isinstance(name, str) or not _TEAM.fullmatch(name):
        raise TokenError(f"{where}: {str(name)[:64]!r} is not a team name (or {PLATFORM!r} for platform tokens)")
    return name


class TokenBook:
    """Every configured token's SHA-256 digest and whom it stands for."""

    def __init__(self, entries: Iterable[tuple[bytes, str | None]] = ()) -> None:
        self.entries: list[tuple[bytes, Identity]] = []
        seen: dict[bytes, str | None] = {}
        for digest, team in entries:
            if digest in seen and seen[digest] != team:
                raise TokenError("one token is configured for two teams")
            seen[digest] = team
            self.entries.append((digest, Identity(team)))

    def __bool__(self) -> bool:
        return bool(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def teams(self) -> set[str | None]:
        return {who.team for _, who in self.entries}

    def identify(self, token: str) -> Identity | None:
        """Whom `token` stands for, or None; the time taken does not depend on which entry (if any) matches."""
        presented = hashlib.sha256(token.encode()).digest()
        found: Identity | None = None
        for digest, who in self.entries:
            if hmac.compare_digest(presented, digest):
                found = who
        return found

    @classmethod
    def parse_mapping(cls, data: Any, where: str) -> list[tuple[bytes, str | None]]:
        if data is None:
            return []
        if not isinstance(data, Mapping):
            raise TokenError(f"{where}: must map each team to a list of tokens or {HASH_PREFIX} hashes")
        entries: list[tuple[bytes, str | None]] = []
        for name, tokens in data.items():
            team = _team(name, where)
            if isinstance(tokens, str):
                tokens = [tokens]
            if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
                raise TokenError(f"{where}: team {name!r} must have a list of strings")
            entries += [(_digest(t, f"{where}: team {name!r}"), team) for t in tokens]
        return entries

    @classmethod
    def load_file(cls, path: Path) -> list[tuple[bytes, str | None]]:
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise TokenError(f"ONEPLUS_HTTP_TOKENS_FILE={path}: cannot read it: {exc.strerror}") from None
        try:
            data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
        except (json.JSONDecodeError, yaml.YAMLError) as exc:
            raise TokenError(
                f"ONEPLUS_HTTP_TOKENS_FILE={path}: not {'JSON' if path.suffix == '.json' else 'YAML'}: "
                f"{type(exc).__name__}"
            ) from None
        return cls.parse_mapping(data, f"ONEPLUS_HTTP_TOKENS_FILE={path}")

    @classmethod
    def parse_pairs(cls, raw: str, where: str = "ONEPLUS_HTTP_TOKENS") -> list[tuple[bytes, str | None]]:
        entries: list[tuple[bytes, str | None]] = []
        for i, pair in enumerate(p.strip() for p in raw.split(",")):
            if not pair:
                continue
            name, sep, token = pair.partition("=")
            if not sep or not token.strip():
                raise TokenError(f"{where}: entry {i + 1} is not team=token")
            entries.append((_digest(token, f"{where}: entry {i + 1}"), _team(name.strip(), f"{where}: entry {i + 1}")))
        return entries

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> TokenBook:
        entries: list[tuple[bytes, str | None]] = []
        path = env.get("ONEPLUS_HTTP_TOKENS_FILE", "").strip()
        if path:
            entries += cls.load_file(Path(path))
        entries += cls.parse_pairs(env.get("ONEPLUS_HTTP_TOKENS", ""))
        admin = env.get("ONEPLUS_HTTP_ADMIN_TOKEN", "").strip()
        if admin:
            entries.append((_digest(admin, "ONEPLUS_HTTP_ADMIN_TOKEN"), None))
        return cls(entries)


def is_loopback(host: str) -> bool:
    """Whether a listen address reaches this machine only: 127.0.0.0/8, ::1 or localhost."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:
        return False


# --- the middleware ------------------------------------------------------------------------------------------------


def needs_token(path: str) -> bool:
    return path == "/v1" or path.startswith("/v1/") or path.startswith("/ui/api/")


def unauthorized(error: str, invalid: bool = False) -> web.Response:
    answer = error_response(401, error, "unauthorized")
    challenge = f'Bearer realm="{REALM}"'
    if invalid:
        challenge += ', error="invalid_token"'
    answer.headers["WWW-Authenticate"] = challenge
    return answer


def bearer(request: web.Request, cookie: bool = False) -> tuple[str | None, str | None]:
    """The token a request presents, or an error saying what is wrong with its Authorization header."""
    raw = request.headers.get("Authorization")
    if raw is not None:
        scheme, _, token = raw.strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None, "the Authorization header must be 'Bearer <token>'"
        return token.strip(), None
    if cookie and request.cookies.get(COOKIE):
        return request.cookies[COOKIE], None
    return None, None


def _header(request: web.Request, name: str) -> str | None:
    return request.headers.get(name)


def auth_middleware(book: TokenBook) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    """Bearer tokens on /v1/* and /ui/api/*; a team token's requests carry its team in `Oneplus-Team`, nothing else."""

    @web.middleware
    async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not needs_token(request.path):
            return await handler(request)
        dashboard = request.path.startswith("/ui/api/")
        token, problem = bearer(request, cookie=dashboard)
        if problem:
            return unauthorized(problem, invalid=True)
        if token is None:
            return unauthorized("this endpoint needs 'Authorization: Bearer <token>' (docs/http-api.md#authentication)")
        who = book.identify(token)
        if who is None:
            return unauthorized("unknown token", invalid=True)
        if who.platform:
            return await handler(request)  # an operator: the Oneplus-Team header, if any, chooses the team
        if dashboard:
            return error_response(403, "the dashboard shows every team's jobs: it needs a platform token", "forbidden")
        team = who.team
        claimed = _header(request, TEAM_HEADER)
        if claimed is not None and claimed != team:
            return error_response(
                403, f"the token is team {team!r}'s; header {TEAM_HEADER} names {claimed[:128]!r}", "wrong_team"
            )
        for wanted in request.query.getall("team", []):
            if wanted and wanted != team:
                return error_response(
                    403, f"the token is team {team!r}'s; the team parameter names {wanted[:128]!r}", "wrong_team"
                )
        headers = request.headers.copy()
        headers[TEAM_HEADER] = str(team)
        return await handler(request.clone(headers=headers))

    return authenticate
