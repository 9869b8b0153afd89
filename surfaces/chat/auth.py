"""Who is on the other end of a chat, over either transport: an API token for scripts, the session
cookie for pages. The REST API's own authenticators decide, on the runtime's bounded database pool.

`authenticate_http` (the SSE views): the API token, then the session with CSRF on unsafe methods, with
the REST API's JSON errors (401, 403, 429 `locked_out`). `ChatAuthMiddleware` (WebSocket): the session
cookie, unless the handshake carries `Authorization`, which alone then decides (`authenticate_token`;
a lock-out is answered by the consumer with close code 4429). Tokens never travel in the URL.
`ChatOriginValidator` requires an allowed `Origin`, or a token when the handshake sends none.
Details: docs/chat.md, *Authentication for scripts*.
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
