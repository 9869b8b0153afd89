"""Content-Security-Policy for every response (Django 5.2 has no built-in CSP).

`ContentSecurityPolicyMiddleware` sets one policy header on each response that has none yet: scripts
from `'self'` only (no inline script anywhere), inline styles only under `CSP_INLINE_STYLE_PATHS`, the
request's own WebSocket URLs in `connect-src`, `frame-ancestors 'none'`. A view that needs another
policy sets the header itself; the middleware leaves it alone.
Details: docs/deployment.md, *Content-Security-Policy*.
"""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import DisallowedHost

from core.middleware import ResponseMiddleware

HEADER = "Content-Security-Policy"
DEFAULT_INLINE_STYLE_PATHS = ("/admin/", "/api/docs/")


def build_policy(*, host: str | None, inline_style: bool) -> str:
    """The policy string for a response to `host` (None: no WebSocket source is added)."""
    connect = ["'self'"]
    if host:
        connect += [f"ws://{host}", f"wss://{host}"]
    directives = [
        ("default-src", ["'self'"]),
        ("script-src", ["'self'"]),
        ("style-src", ["'self'", "'unsafe-inline'"] if inline_style else ["'self'"]),
        ("img-src", ["'self'", "data:"]),
        ("font-src", ["'self'"]),
        ("connect-src", connect),
        ("frame-ancestors", ["'none'"]),
        ("object-src", ["'none'"]),
        ("base-uri", ["'self'"]),
        ("form-action", ["'self'"]),
    ]
    return "; ".join(f"{name} {' '.join(sources)}" for name, sources in directives)


class ContentSecurityPolicyMiddleware(ResponseMiddleware):
    """Adds the `Content-Security-Policy` header above to every response without one (sync and async)."""

    @staticmethod
    def process(request, response):
        if HEADER in response:
            return response
        try:
            host = request.get_host()
        except DisallowedHost:
            host = None
        paths = getattr(settings, "CSP_INLINE_STYLE_PATHS", DEFAULT_INLINE_STYLE_PATHS)
        inline_style = any(request.path.startswith(prefix) for prefix in paths)
        response[HEADER] = build_policy(host=host, inline_style=inline_style)
        return response
