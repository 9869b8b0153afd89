"""Who is on the other end of a WebSocket: session cookie for pages, `Authorization: Token` for scripts.

`ChatAuthMiddleware` wraps channels' session authentication. When the handshake carries an
`Authorization: Token <key>` header (a DRF token), that token alone decides the user (an unknown key or an
inactive user is anonymous; the session cookie is then not consulted). Tokens never travel in the URL, so
they stay out of access logs.

`ChatOriginValidator` protects cookie-authenticated sockets against cross-site WebSocket hijacking:
browsers always send `Origin`, and it must name a host of `ALLOWED_HOSTS` (as channels'
`AllowedHostsOriginValidator`). A handshake without `Origin` cannot come from a web page; it is accepted
only when it authenticates with a token (browsers cannot set `Authorization` on a WebSocket handshake),
so scripts need not invent an origin.
"""

from __future__ import annotations

from channels.auth import AuthMiddlewareStack
from channels.middleware import BaseMiddleware
from channels.security.websocket import OriginValidator
from django.conf import settings
from django.contrib.auth.models import AnonymousUser

from diagnosis.runtime.db import db


def _header(scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value
    return None


def token_key(scope) -> str | None:
    """The key of an `Authorization: Token <key>` header, or None when there is no such header."""
    raw = _header(scope, b"authorization")
    if raw is None:
        return None
    parts = raw.decode("latin1").split()
    if len(parts) != 2 or parts[0].lower() != "token":
        return ""
    return parts[1]


def _user_for_token(key: str):
    from rest_framework.authtoken.models import Token

    token = Token.objects.select_related("user").filter(key=key).first() if key else None
    if token is None or not token.user.is_active:
        return AnonymousUser()
    return token.user


class _TokenMiddleware(BaseMiddleware):
    """Replaces `scope["user"]` by the token's user when the handshake carries `Authorization`."""

    async def __call__(self, scope, receive, send):
        key = token_key(scope)
        if key is not None:
            scope = dict(scope, user=await db(_user_for_token, key))
        return await super().__call__(scope, receive, send)


def ChatAuthMiddleware(inner):
    """Session authentication (cookie), overridden by an `Authorization: Token` header when present."""
    return AuthMiddlewareStack(_TokenMiddleware(inner))


class ChatOriginValidator(OriginValidator):
    """`Origin` must be an allowed host; no `Origin` is accepted only with an `Authorization` header."""

    async def __call__(self, scope, receive, send):
        if scope["type"] == "websocket" and _header(scope, b"origin") is None and token_key(scope):
            return await self.application(scope, receive, send)
        return await super().__call__(scope, receive, send)


def ChatOriginValidatorFromSettings(inner):
    allowed = list(settings.ALLOWED_HOSTS)
    if settings.DEBUG and not allowed:
        allowed = ["localhost", "127.0.0.1", "[::1]"]
    return ChatOriginValidator(inner, allowed)
