"""Who is reading, from a request: the client address and user agent the access log records.

`client_address` is `REMOTE_ADDR` unless `settings.TRUSTED_PROXY_COUNT` (environment
`TRUSTED_PROXY_COUNT`) says how many reverse proxies in front of the app append to `X-Forwarded-For`;
then it is the address the outermost trusted proxy saw (the N-th entry from the right). Entries left of
that are supplied by the client and can be forged, so they are never used.
"""

from __future__ import annotations

from django.conf import settings


def client_address(request) -> str | None:
    remote = request.META.get("REMOTE_ADDR") or None
    hops = int(settings.TRUSTED_PROXY_COUNT or 0)
    if hops <= 0:
        return remote
    forwarded = [part.strip() for part in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",")]
    forwarded = [part for part in forwarded if part]
    if len(forwarded) < hops:
        # Fewer entries than trusted proxies: the request did not come through them all; trust nothing.
        return remote
    return forwarded[-hops]


def user_agent(request) -> str:
    return request.META.get("HTTP_USER_AGENT", "")
