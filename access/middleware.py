"""Who is making a change: the request's user, for governance events written by signals.

`CurrentActorMiddleware` keeps the request in a context variable for the duration of the request (sync
or async views alike); `current_actor()` reads its user's username when a governance event is written,
"" outside a request (management commands pass their actor explicitly, or name themselves for the
signals' events with `acting_as`; migrations are the system).
"""

from __future__ import annotations

import contextlib
import contextvars

from asgiref.sync import iscoroutinefunction, markcoroutinefunction

_request: contextvars.ContextVar = contextvars.ContextVar("access_request", default=None)
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
    request = _request.get()
    user = getattr(request, "user", None) if request is not None else None
    if user is not None and getattr(user, "is_authenticated", False):
        return user.get_username()
    return ""


class CurrentActorMiddleware:
    async_capable = True
    sync_capable = True

    def __init__(self, get_response) -> None:
        self.get_response = get_response
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)

    def __call__(self, request):
        if iscoroutinefunction(self):
            return self.__acall__(request)
        token = _request.set(request)
        try:
            return self.get_response(request)
        finally:
            _request.reset(token)

    async def __acall__(self, request):
        token = _request.set(request)
        try:
            return await self.get_response(request)
        finally:
            _request.reset(token)
