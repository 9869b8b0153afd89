"""Content-Security-Policy for every response (Django 5.2 has no built-in CSP).

`ContentSecurityPolicyMiddleware` sets one policy header on each response that has none yet:

    default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; font-src 'self';
    connect-src 'self' ws://<host> wss://<host>; frame-ancestors 'none'; object-src 'none';
    base-uri 'self'; form-action 'self'

* No inline script anywhere: the chat page and the admin console load their scripts from static files,
  and the Swagger UI is served by `SpectacularSwaggerSplitView` (its init script is a separate request).
* `style-src` adds `'unsafe-inline'` only under `CSP_INLINE_STYLE_PATHS` (default `/admin/` and
  `/api/docs/`): the admin console's waterfall positions its bars with inline `style` attributes computed
  on the server, and drf-spectacular's Swagger page has an inline `<style>` block. Inline styles there
  cannot run code; scripts stay `'self'` only.
* `connect-src` names the WebSocket URLs of the request's own host explicitly (not every browser
  counts `ws:`/`wss:` of the same host as `'self'`). The host is the validated `request.get_host()`.
* `frame-ancestors 'none'` matches `X_FRAME_OPTIONS = "DENY"` for browsers that honour only CSP.

A view that needs another policy sets the header itself; the middleware leaves it alone.
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
