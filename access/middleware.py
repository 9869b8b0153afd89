"""Who is making a change: the request's user, for governance events written by signals.

`CurrentActorMiddleware` keeps the request in a context variable for the duration of the request (sync
or async views alike); `current_actor()` reads its user's username when a governance event is written,
"" outside a request (management commands pass their actor explicitly, migrations are the system).
"""

from __future__ import annotations

import contextvars

from asgiref.sync import iscoroutinefunction, markcoroutinefunction

_request: contextvars.ContextVar = contextvars.ContextVar("access_request", default=None)


def current_actor() -> str:
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
