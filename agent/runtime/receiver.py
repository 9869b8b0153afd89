"""A loop that receives from one channel of the channel layer until it is stopped, and a stop that ends
it even where a cancellation is lost.

Cancelling a task blocked in channels_redis's `receive` does not always end it. On CPython 3.11,
`asyncio.wait_for` drops a cancellation that arrives as the awaited step completes: it returns the
step's result instead (3.12 rebuilt `wait_for` on `asyncio.timeout` and fixed it). redis-py 8 writes
every command through `wait_for` when the connection has a socket timeout, as the channel layer's has
(`REDIS_CHANNEL_SOCKET_TIMEOUT`), so a cancel that lands while the blocking pop is being written is
lost, and channels_redis pops again, and again, until some message reaches the process. Measured
(`tests/agent/runtime/test_receiver.py`, real Redis): one cancel of four receivers left one of them
running in 12 of 60 tries; in the rolling-restart test the same await chain held a draining daphne
to its shutdown bound in about 1 run of 4, and a follower whose client left stayed behind as a task
that popped for ever.

`Receiver.stop` does not rely on one cancellation. It sets a flag the loop reads after every receive,
cancels, and when the task has not ended after a short grace it cancels again and sends a wake-up
message to the channel itself: a receive still waiting on the channel returns it, and the loop leaves.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

WAKE_MESSAGE_TYPE = "receiver.wake"  # sent by `stop` to the receiver's own channel; never handled
GRACE_SECONDS = 0.05  # a cancellation that works ends the receive well within this
RECANCEL_SECONDS = 0.25  # then, while it has not ended: cancel again this often


class Receiver:
    """Receives messages from `channel` of `layer` and passes each to `handle` (synchronous; a wake-up
    message is never passed), until `stop`. A receive that raises is logged as `<what> receive failed
    error=<class>` and retried after `pause` seconds. `run` is the loop, awaited by the task that owns
    it; `stop` may be awaited by any task of the same event loop, once or more."""

    def __init__(
        self, layer: Any, channel: str, handle: Callable[[dict], None], *, what: str, pause: float
    ) -> None:
        self.layer, self.channel = layer, channel
        self._handle, self._what, self._pause = handle, what, pause
        self._stopping = False
        self._task: asyncio.Task | None = None

    async def run(self) -> None:
        self._task = asyncio.current_task()
        while not self._stopping:
            try:
                message = await self.layer.receive(self.channel)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if self._stopping:
                    return
                logger.warning("%s receive failed error=%s", self._what, type(exc).__name__)
                await asyncio.sleep(self._pause)
                continue
            if self._stopping:
                return
            if message.get("type") != WAKE_MESSAGE_TYPE:
                self._handle(message)

    async def stop(self, timeout: float) -> bool:
        """End the loop within `timeout` seconds; True when it has ended (or never started)."""
        self._stopping = True
        task = self._task
        if task is None or task.done():
            return True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=min(GRACE_SECONDS, timeout))
        woken = False
        while not done and (left := deadline - loop.time()) > 0:
            task.cancel()
            if not woken:
                woken = True
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self.layer.send(self.channel, {"type": WAKE_MESSAGE_TYPE}), left)
            left = max(0.0, deadline - loop.time())
            done, _ = await asyncio.wait({task}, timeout=min(RECANCEL_SECONDS, left))
        if not done:
            logger.warning("%s receive did not stop within %.1f s", self._what, timeout)
        return bool(done)
