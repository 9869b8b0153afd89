"""Who may speak for clients, and TLS on every WebSocket: the one home of both rules.

`TrustedProxyHeaders` (ASGI, outermost in `config.asgi`) keeps the forwarded headers of a request or
handshake only when its peer is inside `TRUSTED_PROXIES`, and removes them from any other peer before
anything reads them. `arrived_over_tls(scope)` says whether the connection was TLS at daphne or at a
trusted proxy. `WebSocketTlsRequired` (with `WEBSOCKET_REQUIRE_TLS`) closes a chat handshake that did not
arrive over TLS at once with `CLOSE_TLS_REQUIRED` (4426); the application behind it never sees it.
Details: docs/security.md, *Proxies and TLS*.
"""

from __future__ import annotations

import ipaddress
from functools import lru_cache

from django.conf import settings

FORWARDED_HEADERS = frozenset(
    {
        b"x-forwarded-for",
        b"x-forwarded-proto",
        b"x-forwarded-host",
        b"x-forwarded-port",
        b"x-real-ip",
        b"forwarded",
    }
)
CLOSE_TLS_REQUIRED = 4426


@lru_cache(maxsize=8)
def _networks(spec: tuple[str, ...]) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    return tuple(ipaddress.ip_network(item.strip(), strict=False) for item in spec if item.strip())


def trusted_networks() -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    """`TRUSTED_PROXIES` parsed (CIDRs or single addresses; an invalid entry raises ValueError, which
    the system check `diagnosis.E002` reports at start-up)."""
    return _networks(tuple(settings.TRUSTED_PROXIES or ()))


def is_trusted_proxy(address: str | None) -> bool:
    """Whether a peer at `address` may speak for clients (forwarded headers honoured)."""
    if not address:
        return False
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return any(ip in network for network in trusted_networks())


def _peer(scope) -> str | None:
    client = scope.get("client")
    return client[0] if client else None


def arrived_over_tls(scope) -> bool:
    """TLS at daphne's socket, or at a trusted proxy that said so in `X-Forwarded-Proto` (call it on a
    scope `TrustedProxyHeaders` has filtered, or it trusts every peer)."""
    if scope.get("scheme") in ("https", "wss"):
        return True
    for name, value in scope.get("headers", ()):
        if name.lower() == b"x-forwarded-proto":
            return value.decode("latin1").split(",")[0].strip().lower() == "https"
    return False


class TrustedProxyHeaders:
    """ASGI wrapper: removes the forwarded headers of HTTP and WebSocket scopes whose peer is not a
    trusted proxy (module docstring); every other scope, and trusted peers' headers, pass unchanged."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] in ("http", "websocket") and not is_trusted_proxy(_peer(scope)):
            headers = scope.get("headers", ())
            if any(name.lower() in FORWARDED_HEADERS for name, _ in headers):
                scope = dict(scope)
                scope["headers"] = [(n, v) for n, v in headers if n.lower() not in FORWARDED_HEADERS]
        return await self.app(scope, receive, send)


class WebSocketTlsRequired:
    """ASGI wrapper for WebSocket scopes: with `WEBSOCKET_REQUIRE_TLS`, a handshake that did not arrive
    over TLS is closed with `CLOSE_TLS_REQUIRED` before the wrapped application sees it."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "websocket" or not settings.WEBSOCKET_REQUIRE_TLS or arrived_over_tls(scope):
            return await self.app(scope, receive, send)
        message = await receive()
        if message["type"] != "websocket.connect":
            return None
        # Accepted only so that the client reads a close code (a refused handshake is a bare HTTP 403).
        await send({"type": "websocket.accept"})
        await send({"type": "websocket.close", "code": CLOSE_TLS_REQUIRED, "reason": "TLS required"})
        return None
