"""A base for middleware that only looks at the finished response, for sync and async stacks alike."""

from __future__ import annotations

from asgiref.sync import iscoroutinefunction, markcoroutinefunction


class ResponseMiddleware:
    """Calls `process(request, response)` on every response and returns what it returns.

    Declares itself sync- and async-capable and follows the stack it is placed in, so an async view (the
    SSE chat) is never forced through a thread. Subclasses implement `process`; they may also define
    Django's `process_exception` hook.
    """

    sync_capable = True
    async_capable = True

    def __init__(self, get_response):
        self.get_response = get_response
        self.async_mode = iscoroutinefunction(get_response)
        if self.async_mode:
            markcoroutinefunction(self)

    def __call__(self, request):
        if self.async_mode:
            return self.__acall__(request)
        return self.process(request, self.get_response(request))

    async def __acall__(self, request):
        return self.process(request, await self.get_response(request))

    def process(self, request, response):
        raise NotImplementedError
