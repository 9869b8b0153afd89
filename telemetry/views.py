"""`GET /metrics`: the service metrics (`telemetry.metrics`) in Prometheus' text format.

With `METRICS_TOKEN` set a scrape must send `Authorization: Bearer <token>` (compared in constant time);
anything else is 401, and counts in the client address's own metrics counter (`access.lockout`: 429
with `Retry-After` for every scrape from that address once locked). Without a token, anonymous scrapes
are served only when `METRICS_ALLOW_ANONYMOUS` is on (its default is DEBUG: on in development, off in
production, where the endpoint then answers 403 until a token is configured or the operator opts in for
an internal-only listener).
"""

from __future__ import annotations

import hmac

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from access import lockout
from telemetry.metrics import registry


def _authorized(request: HttpRequest) -> int | None:
    """None when the scrape may proceed, else the status to refuse it with."""
    token = settings.METRICS_TOKEN
    if token:
        header = request.headers.get("Authorization", "")
        scheme, _, sent = header.partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(sent.strip().encode(), token.encode()):
            return None
        return 401
    return None if settings.METRICS_ALLOW_ANONYMOUS else 403


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    # Guessing the token is bounded in its own counter per address (access.lockout): while it is locked
    # every scrape from that address is 429 with Retry-After, uncounted, the right token too (no guess is
    # confirmed); nobody's API token or login is refused because of it.
    if settings.METRICS_TOKEN and lockout.is_locked(request, username=lockout.METRICS):
        return lockout.lockout_response(request, credentials={"username": lockout.METRICS})
    refused = _authorized(request)
    if refused == 401:
        if lockout.record_failure(request, username=lockout.METRICS):
            return lockout.lockout_response(request, credentials={"username": lockout.METRICS})
        response = HttpResponse("metrics need a bearer token\n", status=401, content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    if refused:
        return HttpResponse(
            "metrics are off: set METRICS_TOKEN (or METRICS_ALLOW_ANONYMOUS on an internal listener)\n",
            status=403,
            content_type="text/plain",
        )
    return HttpResponse(generate_latest(registry()), content_type=CONTENT_TYPE_LATEST)
