"""The product's ASGI application with one more path, `/tests/stuck`: a response that starts, then never
ends, not even when its application instance is cancelled (as daphne cancels every open one when its
reactor stops). Served by `python -m config.serve` in tests/agent/runtime/test_serve_exit.py."""

from __future__ import annotations

import asyncio

from config.asgi import application as product

STUCK_PATH = "/tests/stuck"


async def application(scope, receive, send):
    if scope["type"] != "http" or scope.get("path") != STUCK_PATH:
        return await product(scope, receive, send)
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"started\n", "more_body": True})
    while True:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            continue  # swallowed: this instance never ends
