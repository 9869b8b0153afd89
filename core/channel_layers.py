"""The channel layer of a single process (no `REDIS_URL`): channels' in-memory layer with its expiry
sweep amortised.

`InMemoryChannelLayer` sweeps expired messages and memberships at most once per
`CHANNEL_LAYER_SWEEP_SECONDS` (default 1; 0 sweeps on every call, as channels does) instead of on every
`receive` and `group_send`, and `group_send` delivers to the members in the calling task instead of one
task per member. Nothing else changes: capacities, the copy per member, a full member skipped
(`ChannelFull`), group semantics; an expired message may only live up to one interval longer.
Details: docs/performance.md, *Live capacity* (the B3 profile and the measurements).
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
