"""The channel layer of a single process (no `REDIS_URL`): channels' in-memory layer with its expiry
sweep amortised.

`channels.layers.InMemoryChannelLayer` walks every channel's queue and every group's members on each
`receive` and `group_send` to drop expired messages and memberships: O(channels) work per frame, so
O(chats²) per second of streaming. Under 200 concurrent chats that sweep was about a fifth of the
process's CPU (docs/performance.md, B3 profile). Here the sweep runs at most once per `sweep_interval`
seconds (`CHANNEL_LAYER_SWEEP_SECONDS`, default 1; 0 sweeps on every call, as channels does): a message
older than its expiry (60 s) or a membership older than the group expiry (a day) is dropped up to one
interval later than before.

`group_send` delivers to the group's members one after the other in the calling task, instead of one
task per member gathered through `asyncio.as_completed`: an in-memory `send` never waits (it puts
without blocking, or raises `ChannelFull`), so the outcome is the same (every member that has room gets
its own copy; a full member is skipped, as channels does) without creating and scheduling a task and its
completion machinery per member and frame. Nothing else changes (capacities, the copy per member,
group semantics).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

from channels.exceptions import ChannelFull
from channels.layers import InMemoryChannelLayer as _ChannelsInMemoryLayer


class InMemoryChannelLayer(_ChannelsInMemoryLayer):
    def __init__(
        self, sweep_interval: float = 1.0, clock: Callable[[], float] = time.monotonic, **kwargs
    ) -> None:
        super().__init__(**kwargs)
        self.sweep_interval = float(sweep_interval)
        self._clock = clock
        self._next_sweep = float("-inf")

    def _clean_expired(self) -> None:
        now = self._clock()
        if now < self._next_sweep:
            return
        self._next_sweep = now + self.sweep_interval
        super()._clean_expired()

    async def group_send(self, group, message):
        assert isinstance(message, dict), "Message is not a dict"
        self.require_valid_group_name(group)
        self._clean_expired()
        for channel in list(self.groups.get(group, {})):
            with contextlib.suppress(ChannelFull):
                await self.send(channel, message)
