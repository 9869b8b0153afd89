"""Bounded guessing: django-axes counts failed logins *and* failed API-token authentications.

The admin/session login goes through axes as documented (`AxesStandaloneBackend` first in
`AUTHENTICATION_BACKENDS`, `AxesMiddleware`). Token authentication has no password form, so the REST
API, the SSE views and the WebSocket handshake (`access.authentication`) use axes' handler API directly:
`is_locked` before a token is looked up, and Django's `user_login_failed` signal (which axes records)
after a wrong, expired or revoked one. One counter, one cool-off, one admin view of attempts
(*Axes › Access attempts*) and one `axes_reset` command for both kinds of guessing — rather than a
second counter beside axes that could disagree with it.

Counting (`lockout_parameters`): per client address always, and per username whenever the attempt names
one (a login form's username, or the owner of a token whose prefix matched but whose secret, expiry or
revocation did not). A locked-out request gets 429 `locked_out` in the contract's error shape under
`/api/` (`lockout_response`, also for SSE) and a plain 429 page elsewhere (the admin login); a WebSocket
handshake is closed. The lockout and its lifting are governance events (`access.signals`).
"""

from __future__ import annotations

from axes.handlers.proxy import AxesProxyHandler
from axes.helpers import get_client_username, get_cool_off
from axes.models import AccessBase
from django.contrib.auth.signals import user_login_failed
from django.http import HttpRequest, HttpResponse
from rest_framework import status
from rest_framework.exceptions import APIException

from reasoning.utils import client_address

LOCKED_OUT = "locked_out"
UNKNOWN_ADDRESS = "0.0.0.0"  # noqa: S104 (a placeholder, never bound)


def message() -> str:
    cool_off = get_cool_off()
    minutes = int(cool_off.total_seconds() // 60) if cool_off else None
    wait = f"Try again in {minutes} minute(s)" if minutes else "Ask an administrator to unlock it"
    return f"Too many failed authentication attempts from this address or for this account. {wait}."


class LockedOut(APIException):
    status_code = status.HTTP_429_TOO_MANY_REQUESTS
    default_code = LOCKED_OUT

    def __init__(self) -> None:
        super().__init__(detail=message(), code=LOCKED_OUT)
        cool_off = get_cool_off()
        self.wait = cool_off.total_seconds() if cool_off else None


# --------------------------------------------------------------------------------------------------
# axes settings callables
# --------------------------------------------------------------------------------------------------
def lockout_parameters(request_or_attempt, credentials=None) -> list[str]:
    """`AXES_LOCKOUT_PARAMETERS`: the client address, and the username when the attempt names one."""
    if isinstance(request_or_attempt, AccessBase):
        username = request_or_attempt.username
    else:
        username = get_client_username(request_or_attempt, credentials)
    return ["ip_address", "username"] if username else ["ip_address"]


def client_ip(request) -> str:
    """`AXES_CLIENT_IP_CALLABLE`: the address the reasoning access log records (`TRUSTED_PROXY_COUNT`).
    A request without one (a server on a UNIX socket that passes no client) counts under `0.0.0.0`:
    all such requests share one counter rather than escaping counting."""
    return client_address(request) or UNKNOWN_ADDRESS


def lockout_response(request, original_response=None, credentials=None) -> HttpResponse:
    """`AXES_LOCKOUT_CALLABLE`: 429 `locked_out` in the error shape under /api/, a plain page elsewhere."""
    # core.api imports rest_framework.views, which imports this module's users (the DRF
    # authentication classes): imported here, not at the top, to keep that import acyclic.
    from core.api import API_PREFIX, json_error

    # axes' async path passes (request, credentials); the response does not depend on either.
    if request.path.startswith(API_PREFIX):
        response = json_error(429, message(), LOCKED_OUT)
    else:
        response = HttpResponse(message(), status=429, content_type="text/plain; charset=utf-8")
    cool_off = get_cool_off()
    if cool_off:
        response["Retry-After"] = str(int(cool_off.total_seconds()))
    return response


# --------------------------------------------------------------------------------------------------
# Token authentication's use of axes
# --------------------------------------------------------------------------------------------------
def _credentials(username: str | None) -> dict | None:
    return {"username": username} if username else None


def is_locked(request: HttpRequest, *, username: str | None = None) -> bool:
    """Whether the request's address (or `username`, when given) is locked out now."""
    return AxesProxyHandler.is_locked(request, _credentials(username))


def record_failure(request: HttpRequest, *, username: str | None = None) -> bool:
    """Count one failed token authentication (through Django's `user_login_failed`, which axes
    handles); True when it locked the address or the user out."""
    AxesProxyHandler.update_request(request)
    user_login_failed.send(sender=__name__, credentials=_credentials(username) or {}, request=request)
    return bool(getattr(request, "axes_locked_out", False))


def handshake_request(scope) -> HttpRequest:
    """An `HttpRequest` carrying what axes reads of a WebSocket handshake: path, client address, user
    agent, `X-Forwarded-For` (so `TRUSTED_PROXY_COUNT` applies as for HTTP)."""
    request = HttpRequest()
    request.method = "GET"
    request.path = request.path_info = request.META["PATH_INFO"] = scope.get("path", "")
    client = scope.get("client") or ("", 0)
    request.META["REMOTE_ADDR"] = client[0] or ""
    for key, value in scope.get("headers", ()):
        name = key.decode("latin1").lower()
        if name in ("user-agent", "x-forwarded-for", "accept"):
            request.META["HTTP_" + name.upper().replace("-", "_")] = value.decode("latin1")
    return request
