"""Who is on the other end of a chat, over either transport: an API token for scripts, the session
cookie for pages. The REST API's own authenticators decide, on the runtime's bounded database pool
(`runtime.db.db`).

* HTTP (`authenticate_http`, the SSE views): `surfaces.api.authentication.ApiTokenAuthentication` (hashed,
  expiring, revocable tokens; failures counted by axes), then DRF's `SessionAuthentication` with its CSRF
  enforcement on unsafe methods — the REST API's authenticators, tried token first, so a request with
  `Authorization: Token <token>` is decided by the token alone. A failure is the contract's JSON error:
  401 `not_authenticated` / `authentication_failed` (with `WWW-Authenticate: Token`), 403
  `permission_denied` (CSRF), 429 `locked_out` (too many failures, `access.lockout`).
* WebSocket (`ChatAuthMiddleware`): channels' session authentication (cookie), overridden when the
  handshake carries `Authorization`: that header alone then decides, through the same
  `surfaces.api.authentication.authenticate_token` (an unknown, expired or revoked token, an inactive user or
  another scheme is anonymous, and the failure is counted against the client address and the token's
  owner; a locked-out handshake is marked `scope["auth_refusal"] = "locked_out"`, which the consumer
  answers with a `locked_out` error frame and close code 4429; the session cookie is not consulted).
  Tokens never travel in the URL, so they stay out of access logs. CSRF does not apply to a handshake;
  `ChatOriginValidator` protects cookie-authenticated sockets against cross-site WebSocket hijacking
  instead: browsers always send `Origin`, and it must name a host of `ALLOWED_HOSTS` (as channels'
  `AllowedHostsOriginValidator`). A handshake without `Origin` cannot come from a web page; it is accepted
  only when it authenticates with a token (browsers cannot set `Authorization` on a WebSocket handshake), so
  scripts need not invent an origin.
"""

from __future__ import annotations

from channels.auth import AuthMiddlewareStack
from channels.middleware import BaseMiddleware
from channels.security.websocket import OriginValidator
from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.http import HttpRequest, JsonResponse
from rest_framework.authentication import SessionAuthentication
from rest_framework.exceptions import APIException, NotAuthenticated
from rest_framework.parsers import BaseParser
from rest_framework.request import Request

from access import lockout
from agent.runtime.db import db
from core.api import json_error
from surfaces.api.authentication import ApiTokenAuthentication, authenticate_token, token_from_header

AUTHENTICATORS = (ApiTokenAuthentication, SessionAuthentication)


# -------------------------------------------------------------------------------------------------
# HTTP (SSE views)
# -------------------------------------------------------------------------------------------------
class _BodyLeftAlone(BaseParser):
    """Lets DRF's CSRF check look for a form token without parsing the body: the view reads it itself."""

    media_type = "*/*"

    def parse(self, stream, media_type=None, parser_context=None) -> dict:
        return {}


def _http_user(request: HttpRequest) -> AbstractBaseUser:
    """The request's user by DRF's authenticators (synchronous ORM; run it through `db`)."""
    drf_request = Request(
        request, parsers=[_BodyLeftAlone()], authenticators=[cls() for cls in AUTHENTICATORS]
    )
    user = drf_request.user
    if user is None or not user.is_authenticated:
        raise NotAuthenticated()
    return user


async def authenticate_http(request: HttpRequest) -> tuple[AbstractBaseUser | None, JsonResponse | None]:
    """(user, None), or (None, the error response) when DRF's authenticators refuse the request."""
    try:
        return await db(_http_user, request), None
    except APIException as exc:
        response = json_error(exc.status_code, str(exc.detail), str(exc.get_codes()))
        if exc.status_code == 401:
            response["WWW-Authenticate"] = AUTHENTICATORS[0]().authenticate_header(request)
        if getattr(exc, "wait", None):
            response["Retry-After"] = str(int(exc.wait))
        return None, response


# -------------------------------------------------------------------------------------------------
# WebSocket
# -------------------------------------------------------------------------------------------------
def _header(scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value
    return None


def has_token(scope) -> bool:
    """Whether the handshake authenticates with `Authorization: Token <key>`."""
    raw = _header(scope, b"authorization")
    parts = raw.decode("latin1").split() if raw is not None else []
    return len(parts) == 2 and parts[0].lower() == "token"


LOCKED_OUT = lockout.LOCKED_OUT


def _token_scope(scope, authorization: bytes) -> dict:
    """The scope with the token's user (anonymous on any failure), and `auth_refusal` when locked out."""
    request = lockout.handshake_request(scope)
    try:
        token = token_from_header(authorization)
        if token is None:
            return dict(scope, user=AnonymousUser())
        user, _row = authenticate_token(request, token)
    except lockout.LockedOut:
        return dict(scope, user=AnonymousUser(), auth_refusal=LOCKED_OUT)
    except APIException:
        return dict(scope, user=AnonymousUser())
    return dict(scope, user=user)


class _TokenMiddleware(BaseMiddleware):
    """Replaces `scope["user"]` by the token's user when the handshake carries `Authorization`."""

    async def __call__(self, scope, receive, send):
        authorization = _header(scope, b"authorization")
        if authorization is not None:
            scope = await db(_token_scope, scope, authorization)
        return await super().__call__(scope, receive, send)


def ChatAuthMiddleware(inner):
    """Session authentication (cookie), overridden by an `Authorization` header when present."""
    return AuthMiddlewareStack(_TokenMiddleware(inner))


class ChatOriginValidator(OriginValidator):
    """`Origin` must be an allowed host; no `Origin` is accepted only with an `Authorization: Token`."""

    async def __call__(self, scope, receive, send):
        if scope["type"] == "websocket" and _header(scope, b"origin") is None and has_token(scope):
            return await self.application(scope, receive, send)
        return await super().__call__(scope, receive, send)


def ChatOriginValidatorFromSettings(inner):
    allowed = list(settings.ALLOWED_HOSTS)
    if settings.DEBUG and not allowed:
        allowed = ["localhost", "127.0.0.1", "[::1]"]
    return ChatOriginValidator(inner, allowed)
