"""The request being served, for code that runs beneath it without being handed it.

`CurrentRequestMiddleware` keeps the request in a context variable for the duration of the request
(sync or async views alike); `current_request()` reads it, None outside a request (management commands,
the runtime's own tasks). Its readers: the governance events' actor (`access.middleware.current_actor`)
and the replica router's read-your-writes pin (`core.db_router`). One variable and one middleware, so
that every reader sees the same request.
"""

from __future__ import annotations

import contextvars
from typing import Any

from core.middleware import StackMiddleware

_request: contextvars.ContextVar[Any] = contextvars.ContextVar("current_request", default=None)


def current_request() -> Any:
    """The request this code runs beneath, or None."""
    return _request.get()


class CurrentRequestMiddleware(StackMiddleware):
    """Sets `current_request()` for everything beneath it; follows the sync or async stack it is in."""

    def __call__(self, request):
        if self.async_mode:
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
