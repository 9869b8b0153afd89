"""The chat WebSocket (`ws/chat/`): start, cancel and follow runs; frames exactly as the API contract.

Client frames (JSON text, at most 64 KiB) are `chat`, `attach` and `cancel`; server frames are those of
`surfaces.chat.protocol`. Authentication is the handshake's (`surfaces.chat.auth`): an anonymous
connection is closed at once with 4401 (4429 after a `locked_out` error). A malformed, binary,
oversized or unknown frame gets an `error` frame and the socket stays usable. Closing the socket stops
following, never the runs; starting, finding, following and cancelling are `surfaces.chat.service`'s,
shared with the SSE views.
Details: docs/chat.md, *WebSocket `ws/chat/`*.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

from channels.generic.websocket import AsyncJsonWebsocketConsumer

from agent.runtime.live import RunFollower
from agent.runtime.supervisor import ensure_background
from surfaces.chat import service
from surfaces.chat.protocol import ChatRefused, error_frame, to_json, ws_frame

logger = logging.getLogger(__name__)

MAX_FRAME_BYTES = 64 * 1024
MAX_FOLLOWS_PER_SOCKET = 16
CLOSE_UNAUTHENTICATED = 4401
CLOSE_LOCKED_OUT = 4429


class ChatConsumer(AsyncJsonWebsocketConsumer):
    """One chat connection of an authenticated user; it may follow several runs at once (one follower
    task per run). See the module docstring for the frames."""

    # No channel of its own: nothing is ever sent to a connection through the channel layer (each run
    # follower subscribes with its own `agent.runtime.receiver.Receiver`). With the default alias, channels
    # gave every connection a receive on the layer for its whole life: one more receiver in
    # channels_redis's per-process turn-taking, and on close a cancel the layer can lose, after which
    # daphne killed the connection's instance 10 s later ("took too long to shut down"). An alias that is
    # not configured (None) makes `get_channel_layer` return None: channels then waits on the socket only.
    channel_layer_alias = None

    async def connect(self) -> None:
        self.followers: dict[str, tuple[asyncio.Task, RunFollower]] = {}
        self.user = self.scope.get("user")
        await self.accept()
        if self.scope.get("auth_refusal") == "locked_out":
            await self._error("locked_out", "Too many failed authentication attempts; try again later.")
            await self.close(code=CLOSE_LOCKED_OUT)
            return
        if self.user is None or not self.user.is_authenticated or not self.user.is_active:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        ensure_background()

    async def disconnect(self, code: int) -> None:
        followers = list(getattr(self, "followers", {}).values())
        self.followers = {}
        for task, _ in followers:
            task.cancel()
        for task, follower in followers:
            with contextlib.suppress(BaseException):
                await task
            await follower.__aexit__(None, None, None)

    # ---------------------------------------------------------------------------------------------
    # Incoming frames
    # ---------------------------------------------------------------------------------------------
    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs) -> None:
        if self.user is None or not self.user.is_authenticated:
            return
        if text_data is None:
            await self._error("malformed_frame", "Frames must be JSON text.")
            return
        if len(text_data) > MAX_FRAME_BYTES or len(text_data.encode("utf-8")) > MAX_FRAME_BYTES:
            await self._error("frame_too_large", f"Frames must be at most {MAX_FRAME_BYTES} bytes.")
            return
        try:
            content = json.loads(text_data)
        except ValueError:
            await self._error("malformed_frame", "Frames must be JSON objects.")
            return
        if not isinstance(content, dict):
            await self._error("malformed_frame", "Frames must be JSON objects.")
            return
        kind = content.get("type")
        handler = {"chat": self._chat, "cancel": self._cancel, "attach": self._attach}.get(
            kind if isinstance(kind, str) else ""
        )
        if handler is None:
            await self._error("unknown_type", "type must be one of chat, cancel, attach.")
            return
        try:
            await handler(content)
        except ChatRefused as refused:
            await self._error(refused.code, refused.message)

    async def _chat(self, content: dict[str, Any]) -> None:
        self._check_follow_capacity()
        follower = await service.open_chat(
            user=self.user, query=content.get("query"), session_id=content.get("sessionId")
        )
        self._follow(follower)

    async def _cancel(self, content: dict[str, Any]) -> None:
        await service.cancel_run(user=self.user, run_id=content.get("runId"))

    async def _attach(self, content: dict[str, Any]) -> None:
        after = service.validate_after(content.get("after"), strings=False)
        run = await service.find_run(user=self.user, run_id=content.get("runId"))
        if run.run_id not in self.followers:
            self._check_follow_capacity()
        await self._stop_following(run.run_id)
        self._follow(await service.open_stream(run.run_id, after=after))

    # ---------------------------------------------------------------------------------------------
    # Following
    # ---------------------------------------------------------------------------------------------
    def _check_follow_capacity(self) -> None:
        if len(self.followers) >= MAX_FOLLOWS_PER_SOCKET:
            raise ChatRefused(
                429, "too_many_follows", f"One socket follows at most {MAX_FOLLOWS_PER_SOCKET} runs at once."
            )

    async def _stop_following(self, run_id: str) -> None:
        previous = self.followers.pop(run_id, None)
        if previous is not None:
            previous[0].cancel()
            with contextlib.suppress(BaseException):
                await previous[0]
            await previous[1].__aexit__(None, None, None)

    def _follow(self, follower: RunFollower) -> None:
        run_id = follower.run_id
        task = asyncio.create_task(self._forward(run_id, follower), name=f"ws-follow:{run_id}")
        self.followers[run_id] = (task, follower)

    async def _forward(self, run_id: str, follower: RunFollower) -> None:
        try:
            async for event in follower.frames():
                if event is not None:
                    await self.send_json(ws_frame(event))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.warning("ws follow failed run=%s error=%s", run_id, type(exc).__name__)
        finally:
            await follower.__aexit__(None, None, None)
            current = self.followers.get(run_id)
            if current is not None and current[1] is follower:
                del self.followers[run_id]

    async def _error(self, code: str, message: str) -> None:
        await self.send_json(error_frame(code=code, message=message))

    @classmethod
    async def encode_json(cls, content: dict[str, Any]) -> str:
        return to_json(content)
