"""Clients of both chat transports for in-process tests: the WebSocket through the real ASGI application
(`channels.testing.WebsocketCommunicator`) and SSE through Django's async test client, which iterates the
streaming response exactly as the ASGI handler does."""

from __future__ import annotations

import asyncio
import json

from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import AsyncClient

from agent.runtime import supervisor
from config.asgi import application
from tests.factories import issue_token
from tests.surfaces.chat.support import assert_frame_keys, owned_runs, parse_sse

TIMEOUT = 15
ORIGIN = (b"origin", b"http://127.0.0.1")


async def ws_connect(user=None, headers=None) -> WebsocketCommunicator:
    """A connected WebSocket, as `user` (what the session middleware resolves for a logged-in browser)."""
    comm = WebsocketCommunicator(application, "/ws/chat/", headers=headers or [ORIGIN])
    if user is not None:
        comm.scope["user"] = user
    connected, _ = await comm.connect(timeout=TIMEOUT)
    assert connected
    return comm


async def ws_frames_until_outcome(comm: WebsocketCommunicator, *, run_id: str | None = None) -> list[dict]:
    """Frames up to and including the outcome (of `run_id`, when given), each checked for its keys."""
    frames = []
    while True:
        frame = await comm.receive_json_from(timeout=TIMEOUT)
        frames.append(frame)
        assert_frame_keys(frame["type"], set(frame), websocket=True)
        if frame["type"] == "outcome" and (run_id is None or frame["runId"] == run_id):
            return frames


class TokenClient(AsyncClient):
    """An async test client that sends `Authorization: Token <key>` with every request."""

    def __init__(self, key: str) -> None:
        super().__init__()
        self.authorization = {"Authorization": f"Token {key}"}

    def generic(self, *args, headers=None, **kwargs):
        return super().generic(*args, headers={**self.authorization, **(headers or {})}, **kwargs)


async def token_client(user) -> AsyncClient:
    """A client authenticated by `user`'s API token (issued for this client)."""
    return TokenClient(await sync_to_async(issue_token)(user))


async def sse_read(response, *, until_outcome: bool = True, stop_after=None) -> tuple[str, list]:
    """Read the stream; stop after the outcome (or when `stop_after(events)` is true)."""
    text = ""
    iterator = aiter(response.streaming_content)
    while True:
        try:
            chunk = await asyncio.wait_for(anext(iterator), TIMEOUT)
        except StopAsyncIteration:
            break
        text += chunk.decode()
        events, _ = parse_sse(text)
        if stop_after is not None and stop_after(events):
            break
        if until_outcome and events and events[-1].event == "outcome":
            break
    await iterator.aclose()
    events, _ = parse_sse(text)
    return text, events


async def post_chat(client, body, **extra):
    return await client.post("/api/chat", data=json.dumps(body), content_type="application/json", **extra)


async def settle(run_id: str) -> None:
    """Wait for this process's task of the run, then stop the supervisor's background tasks."""
    task = owned_runs().get(run_id)
    if task is not None:
        await asyncio.wait_for(asyncio.shield(task), TIMEOUT)
    await supervisor.stop_background()
