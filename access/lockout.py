"""Bounded guessing without locking out the team: django-axes counts failed passwords, TOTP codes and
tokens, each kind of credential in its own counter of the one who guessed.

Counters: password, totp and token per (username, address) — `counter_name` —, anonymous, webhook and
metrics per address; a locked counter refuses only the attempts it counts (never a credential of another
kind), before checking them and without counting them. Token and TOTP checks use axes' handler API
(`is_locked`, `record_failure`); a lockout answers 429 `locked_out` with `Retry-After`. Lockouts and
their lifting are governance events (`access.signals`). Details: docs/security.md, *1. No unlimited guessing*.
"""

from __future__ import annotations

import datetime as dt
import math

from axes.attempts import get_cool_off_threshold
from axes.handlers.proxy import AxesProxyHandler
from axes.helpers import get_client_username, get_cool_off
from axes.models import AccessAttempt
from django.conf import settings
from django.contrib.auth.signals import user_login_failed
from django.core.exceptions import BadRequest, SuspiciousOperation
from django.db.models import Max
from django.http import HttpRequest, HttpResponse, QueryDict
from django.http.multipartparser import MultiPartParserError
from django.template.defaultfilters import pluralize
from django.template.loader import render_to_string
from django.urls import NoReverseMatch, reverse
from django.utils import timezone
from django.utils.datastructures import MultiValueDict

from core.errors import ClientRefusal
from core.product import PRODUCT_NAME
from reasoning.utils import client_address

LOCKED_OUT = "locked_out"
UNKNOWN_ADDRESS = "0.0.0.0"  # noqa: S104 (a placeholder, never bound)

# The usernames of the address-only counters that are not the anonymous one (see the module).
WEBHOOK = "(aiops webhook token)"
METRICS = "(metrics token)"
RESERVED = {WEBHOOK: "webhook", METRICS: "metrics"}

# The kinds of a user's credentials, each counted apart. A password attempt counts under the username
# as typed (axes' own login handling); the others under the username and a suffix of spaces and
# parentheses, which no Django username can hold (`UnicodeUsernameValidator`), so no account's counter
# is another's, and the login form refuses such a name unchecked (`reserved`).
PASSWORD, TOTP, TOKEN = "password", "totp", "token"
NAMED = (PASSWORD, TOTP, TOKEN)
_SUFFIX = {TOTP: " (totp code)", TOKEN: " (api token)"}

_WHAT = {
    PASSWORD: "with this account's password from this address",
    TOTP: "with this account's authenticator codes from this address",
    TOKEN: "with this account's API tokens from this address",
    "anonymous": "with unknown tokens from this address",
    "webhook": "with a wrong webhook token from this address",
    "metrics": "with a wrong metrics token from this address",
}


def counter_name(username: str, kind: str) -> str:
    """The axes username of `kind`'s counter of `username` (see `_SUFFIX`)."""
    return username + _SUFFIX.get(kind, "")


def counter_of(username: str | None) -> str:
    """Which counter an attempt with the axes username `username` counts in: `password`, `totp`,
    `token`, `anonymous`, `webhook` or `metrics`."""
    if not username:
        return "anonymous"
    if username in RESERVED:
        return RESERVED[username]
    return next((kind for kind, suffix in _SUFFIX.items() if username.endswith(suffix)), PASSWORD)


def owner_of(username: str | None) -> str:
    """The account a named counter belongs to ("" for the address-only counters)."""
    kind = counter_of(username)
    if kind not in NAMED:
        return ""
    return username.removesuffix(_SUFFIX.get(kind, ""))


def reserved(username: str | None) -> bool:
    """Whether `username` is the name of a counter that no login form may count in."""
    return bool(username) and counter_of(username) != PASSWORD


def limit_for(username: str | None) -> int:
    """The failures that lock the counter of `username` (see the module)."""
    if counter_of(username) in NAMED:
        return int(settings.LOCKOUT_FAILURE_LIMIT)
    return int(settings.LOCKOUT_ANONYMOUS_FAILURE_LIMIT)


def _wait_text(seconds: int | None) -> str:
    if seconds is None:
        return "Ask an administrator to unlock it."
    if seconds < 60:
        return f"Try again in {seconds} second{pluralize(seconds)}."
    minutes = math.ceil(seconds / 60)
    return f"Try again in {minutes} minute{pluralize(minutes)}."


def message(username: str | None = None, wait: int | None = None) -> str:
    what = _WHAT[counter_of(username)]
    return f"Too many failed authentication attempts {what}. {_wait_text(wait)}"


def retry_after(request: HttpRequest, username: str | None) -> int | None:
    """Seconds until the counter of (`username`, the request's address) is unlocked at the latest: the
    cool-off after its newest counted failure (refused attempts are not counted, so it does not move).
    None without a cool-off (a lockout that only an administrator lifts)."""
    cool_off = get_cool_off(request)
    if not cool_off:
        return None
    AxesProxyHandler.update_request(request)
    newest = (
        AccessAttempt.objects.filter(
            username=username or None,
            ip_address=request.axes_ip_address,
            attempt_time__gte=get_cool_off_threshold(request),
        )
        .aggregate(newest=Max("attempt_time"))
        .get("newest")
    )
    if newest is None:
        return int(cool_off.total_seconds())
    left = (newest + cool_off - timezone.now()) / dt.timedelta(seconds=1)
    return max(1, math.ceil(left))


class LockedOut(ClientRefusal):
    """429 `locked_out`: this counter is locked (the API answers it through `core.api`)."""

    status_code = 429
    code = LOCKED_OUT

    def __init__(self, request: HttpRequest | None = None, username: str | None = None) -> None:
        wait = retry_after(request, username) if request is not None else None
        super().__init__(message(username, wait), wait=wait)


# --------------------------------------------------------------------------------------------------
# axes settings callables
# --------------------------------------------------------------------------------------------------
def failure_limit(request, credentials=None) -> int:
    """`AXES_FAILURE_LIMIT`: the limit of the counter the attempt counts in."""
    return limit_for(get_client_username(request, credentials))


def client_ip(request) -> str:
    """`AXES_CLIENT_IP_CALLABLE`: the address the reasoning access log records (`TRUSTED_PROXY_COUNT`).
    A request without one (a server on a UNIX socket that passes no client) counts under `0.0.0.0`:
    all such requests share one counter rather than escaping counting."""
    return client_address(request) or UNKNOWN_ADDRESS


def not_counted(request, credentials=None) -> bool:
    """`AXES_WHITELIST_CALLABLE`: an OpenID Connect callback (`access.oidc`: its credentials are the
    sign-in's nonce and PKCE verifier, never a username) is neither refused nor counted. Its code is
    single-use, bound to this browser's state and redeemed with the client secret: a failure is not a
    guess of a secret held here, and counting it would let one client lock its address out of SSO."""
    if not credentials:
        return False
    return (
        "nonce" in credentials
        and "code_verifier" in credentials
        and not credentials.get(getattr(settings, "AXES_USERNAME_FORM_FIELD", "username"))
    )


def _login_url(request) -> str:
    try:
        return reverse("admin:login")
    except NoReverseMatch:  # pragma: no cover (the admin is always installed)
        return "/"


def lockout_response(request, original_response=None, credentials=None) -> HttpResponse:
    """`AXES_LOCKOUT_CALLABLE`: 429 `locked_out` in the error shape under /api/, a readable page with the
    wait and a way back elsewhere; `Retry-After` on both."""
    # core.api imports rest_framework.views, which imports this module's users (the DRF
    # authentication classes): imported here, not at the top, to keep that import acyclic.
    from core.api import API_PREFIX, json_error

    # axes' async path passes (request, credentials): the second argument is then the credentials.
    if credentials is None and isinstance(original_response, dict):
        credentials = original_response
    credentials = credentials or getattr(request, "axes_credentials", None)
    username = get_client_username(request, credentials) if credentials is not None else None
    wait = retry_after(request, username)
    text = message(username, wait)
    if request.path.startswith(API_PREFIX):
        response = json_error(429, text, LOCKED_OUT)
    elif request.path.startswith("/metrics"):
        response = HttpResponse(text + "\n", status=429, content_type="text/plain; charset=utf-8")
    else:
        context = {
            "message": text,
            "wait_text": _wait_text(wait),
            "login_url": _login_url(request),
            "site_header": PRODUCT_NAME,
        }
        page = render_to_string("access/locked_out.html", context, request=request)
        response = HttpResponse(page, status=429, content_type="text/html; charset=utf-8")
    if wait is not None:
        response["Retry-After"] = str(wait)
    return response


# --------------------------------------------------------------------------------------------------
# Token authentication's use of axes
# --------------------------------------------------------------------------------------------------
def _credentials(username: str | None) -> dict:
    # Always the key: without it axes would read a `username` from the request's POST data, letting an
    # anonymous guess pick the counter it lands in.
    return {getattr(settings, "AXES_USERNAME_FORM_FIELD", "username"): username or None}


def is_locked(request: HttpRequest, *, username: str | None = None) -> bool:
    """Whether the counter of (`username`, or none; the request's address) is locked out now."""
    return AxesProxyHandler.is_locked(request, _credentials(username))


def record_failure(request: HttpRequest, *, username: str | None = None) -> bool:
    """Count one failed authentication in the counter of (`username` or none, the request's address)
    (through Django's `user_login_failed`, which axes handles); True when it locked that counter."""
    AxesProxyHandler.update_request(request)
    _readable_post(request)
    user_login_failed.send(sender=__name__, credentials=_credentials(username), request=request)
    return bool(getattr(request, "axes_locked_out", False))


def _readable_post(request: HttpRequest) -> None:
    """axes copies `request.POST` into the attempt it records: a body Django cannot parse (multipart
    without a boundary, too many fields, over `DATA_UPLOAD_MAX_MEMORY_SIZE`) is recorded as no POST data
    rather than turning a counted failure into a 500 — the failure is still counted."""
    try:
        request.POST  # noqa: B018 (parsed here, once, for axes)
    except (MultiPartParserError, SuspiciousOperation, BadRequest, UnicodeDecodeError, ValueError):
        request._post, request._files = QueryDict(), MultiValueDict()


def refuse(request: HttpRequest, *, username: str | None = None) -> None:
    """The one rule for a failed credential: refused uncounted while its counter is locked (raises
    `LockedOut`), else counted, and `LockedOut` when that reached the limit. Returns when the caller
    should answer its ordinary 401."""
    if is_locked(request, username=username):
        raise LockedOut(request, username)
    if record_failure(request, username=username):
        raise LockedOut(request, username)


def tries_left(request: HttpRequest, username: str | None) -> int | None:
    """After a failure counted in this request: how many more the counter of `username` allows."""
    failures = getattr(request, "axes_failures_since_start", None)
    if failures is None:
        return None
    return max(0, limit_for(username) - int(failures))


_LOCKED = {
    PASSWORD: "this account's password is refused",
    TOTP: "this account's authenticator codes are refused",
    TOKEN: "this account's API tokens are refused",
}


def tries_left_text(left: int, kind: str = PASSWORD) -> str:
    cool_off = get_cool_off()
    minutes = f" for {math.ceil(cool_off.total_seconds() / 60)} minute(s)" if cool_off else ""
    tries = "1 try" if left == 1 else f"{left} tries"
    return f"{tries} left before {_LOCKED[kind]} from this address{minutes}."


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
