"""Who is making a change: the request's user, for governance events written by signals.

`current_actor()` reads the username of the request's user (`core.request_context.current_request`, set
by `CurrentRequestMiddleware` for the duration of every request) when a governance event is written,
"" outside a request (management commands pass their actor explicitly, or name themselves for the
signals' events with `acting_as`; migrations are the system).
"""

from __future__ import annotations

import contextlib
import contextvars

from core.request_context import current_request

_named: contextvars.ContextVar = contextvars.ContextVar("access_named_actor", default="")
_source: contextvars.ContextVar = contextvars.ContextVar("access_change_source", default=None)


@contextlib.contextmanager
def acting_as(actor: str, *, source: dict | None = None):
    """The governance events written meanwhile name `actor` (a management command outside a request;
    single sign-on applying an identity provider's claims, `access.sso`), and carry `source` (what made
    the change, e.g. the IdP and the groups it asserted) in their details."""
    token = _named.set(actor)
    source_token = _source.set(source)
    try:
        yield
    finally:
        _source.reset(source_token)
        _named.reset(token)


def current_source() -> dict | None:
    """What made the change being recorded, when a caller said so (`acting_as(..., source=...)`)."""
    return _source.get()


def current_actor() -> str:
    if _named.get():
        return _named.get()
    request = current_request()
    user = getattr(request, "user", None) if request is not None else None
    if user is not None and getattr(user, "is_authenticated", False):
        return user.get_username()
    return ""
