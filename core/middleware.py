"""Bases for middleware that follow the sync or async stack they are placed in."""

from __future__ import annotations

from asgiref.sync import iscoroutinefunction, markcoroutinefunction


class StackMiddleware:
    """Declares itself sync- and async-capable and follows the stack it is placed in (`async_mode`), so
    an async view (the SSE chat) is never forced through a thread. Subclasses define `__call__`, which
    returns `self.__acall__(request)` when `async_mode` is set."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response):
        self.get_response = get_response
        self.async_mode = iscoroutinefunction(get_response)
        if self.async_mode:
            markcoroutinefunction(self)


class ResponseMiddleware(StackMiddleware):
    """Calls `process(request, response)` on every response and returns what it returns. Subclasses
    implement `process`; they may also define Django's `process_exception` hook."""

    def __call__(self, request):
        if self.async_mode:
            return self.__acall__(request)
        return self.process(request, self.get_response(request))

    async def __acall__(self, request):
        return self.process(request, await self.get_response(request))

    def process(self, request, response):
        raise NotImplementedError
