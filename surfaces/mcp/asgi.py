"""The record's MCP endpoint in the ASGI app: `McpMount` sends `/mcp` to the SDK's streamable HTTP
transport (stateless, JSON responses: any process of the service answers any request) and everything
else to Django. `config.asgi` mounts it only with `MCP_SERVER_ENABLED`; otherwise `/mcp` is Django's 404.

Before the transport: the Host (and an Origin, when sent) must be an allowed host (Django's rule, as
DNS-rebinding protection), then `Authorization: Bearer <API token>` is checked by the REST API's
`authenticate_token` (constant-time digest comparison, lockout counters), then the user's rate
(`MCP_SERVER_THROTTLE_RATE`). Refusals are JSON-RPC error bodies: 400, 401 with `WWW-Authenticate:
Bearer`, 429 with `Retry-After`; each is counted (`surfaces.mcp.metrics`).
"""

from __future__ import annotations

import asyncio
import json
import math
from urllib.parse import urlsplit

from django.conf import settings
from django.http.request import split_domain_port, validate_host
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.throttling import SimpleRateThrottle

from access import lockout
from agent.runtime.db import db
from surfaces.api.authentication import MAX_TOKEN_CHARS, authenticate_token
from surfaces.mcp.metrics import count
from surfaces.mcp.server import USER_KEY, build_server

PATH = "/mcp"
SCHEMES = ("bearer", "token")  # `Token` as the REST API spells it; MCP clients send `Bearer`


class McpRateThrottle(SimpleRateThrottle):
    """Scope `mcp`, keyed by user id, rate read from `settings.MCP_SERVER_THROTTLE_RATE` at each use."""

    scope = "mcp"

    def get_rate(self) -> str | None:
        return settings.MCP_SERVER_THROTTLE_RATE or None

    def get_cache_key(self, request, view) -> str:
        return self.cache_format % {"scope": self.scope, "ident": request.user.pk}


class _UserOnly:
    def __init__(self, user) -> None:
        self.user = user


class Refusal(Exception):
    def __init__(self, status: int, outcome: str, message: str, wait: int | None = None) -> None:
        super().__init__(message)
        self.status, self.outcome, self.message, self.wait = status, outcome, message, wait


def _header(scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value.decode("latin1")
    return None


def _host_allowed(host: str | None) -> bool:
    """Django's `HttpRequest.get_host` rule: the host's domain matches `ALLOWED_HOSTS` (with DEBUG and
    none set: the localhost names)."""
    allowed = settings.ALLOWED_HOSTS
    if settings.DEBUG and not allowed:
        allowed = [".localhost", "127.0.0.1", "[::1]"]
    domain, _port = split_domain_port(host or "")
    return bool(domain) and validate_host(domain, allowed)


def check_origin(scope) -> None:
    """DNS-rebinding protection: the Host, and the Origin's host when one is sent, must be allowed."""
    if not _host_allowed(_header(scope, b"host")):
        raise Refusal(400, "bad_host", "Host not allowed.")
    origin = _header(scope, b"origin")
    if origin is not None and not _host_allowed(urlsplit(origin).netloc):
        raise Refusal(403, "bad_origin", "Origin not allowed.")


def _token(scope) -> str:
    parts = (_header(scope, b"authorization") or "").split()
    if len(parts) != 2 or parts[0].lower() not in SCHEMES or len(parts[1]) > MAX_TOKEN_CHARS:
        raise Refusal(401, "unauthenticated", "Authentication required: Authorization: Bearer <API token>.")
    return parts[1]


def authenticate(scope):
    """The token's user, counted against their rate; `Refusal` otherwise (synchronous: run through `db`)."""
    token = _token(scope)
    request = lockout.handshake_request(scope)
    try:
        user, _row = authenticate_token(request, token)
    except lockout.LockedOut as exc:
        raise Refusal(429, "locked_out", exc.detail, exc.wait) from None
    except AuthenticationFailed as exc:
        raise Refusal(401, "unauthenticated", str(exc.detail)) from None
    throttle = McpRateThrottle()
    if not throttle.allow_request(_UserOnly(user), None):
        wait = max(1, math.ceil(throttle.wait() or 1))
        raise Refusal(429, "throttled", f"Too many MCP requests; try again in {wait} s.", wait)
    return user


async def _refuse(send, refusal: Refusal) -> None:
    body = json.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": -32001, "message": refusal.message}})
    headers = [(b"content-type", b"application/json")]
    if refusal.status == 401:
        headers.append((b"www-authenticate", b'Bearer realm="mcp"'))
    if refusal.wait:
        headers.append((b"retry-after", str(int(refusal.wait)).encode()))
    await send({"type": "http.response.start", "status": refusal.status, "headers": headers})
    await send({"type": "http.response.body", "body": body.encode()})


class _Manager:
    """The SDK's session manager of one event loop, run in a task of that loop for the loop's life (the
    manager needs its task group entered; daphne sends no lifespan events)."""

    def __init__(self) -> None:
        self.manager = StreamableHTTPSessionManager(
            build_server(),
            json_response=True,
            stateless=True,
            # Host and Origin are checked by `check_origin` with Django's rule instead.
            security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        )
        self.started = asyncio.Event()
        self.task = asyncio.get_running_loop().create_task(self._run(), name="mcp-session-manager")

    async def _run(self) -> None:
        async with self.manager.run():
            self.started.set()
            await asyncio.Event().wait()


class McpMount:
    """`PATH` (and `PATH/`) to the record's MCP server, anything else to `app`."""

    def __init__(self, app) -> None:
        self.app = app
        self._managers: dict[asyncio.AbstractEventLoop, _Manager] = {}

    async def _manager(self) -> StreamableHTTPSessionManager:
        loop = asyncio.get_running_loop()
        running = self._managers.get(loop)
        if running is None or running.task.done():
            for old in [known for known in self._managers if known.is_closed()]:
                del self._managers[old]
            running = self._managers[loop] = _Manager()
        await running.started.wait()
        return running.manager

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("path", "").rstrip("/") != PATH:
            return await self.app(scope, receive, send)
        try:
            check_origin(scope)
            user = await db(authenticate, scope)
        except Refusal as refusal:
            count("http", refusal.outcome)
            return await _refuse(send, refusal)
        manager = await self._manager()
        scope = dict(scope, path=PATH)
        scope[USER_KEY] = user
        await manager.handle_request(scope, receive, send)
