"""The channel layer of a single process (no `REDIS_URL`): channels' in-memory layer with its expiry
sweep amortised.

`channels.layers.InMemoryChannelLayer` walks every channel's queue and every group's members on each
`receive` and `group_send` to drop expired messages and memberships: O(channels) work per frame, so
O(chats²) per second of streaming. Under 200 concurrent chats that sweep was about a fifth of the
process's CPU (docs/performance.md, B3 profile). Here the sweep runs at most once per `sweep_interval`
seconds (`CHANNEL_LAYER_SWEEP_SECONDS`, default 1; 0 sweeps on every call, as channels does): a message
older than its expiry (60 s) or a membership older than the group expiry (a day) is dropped up to one
interval later than before. Nothing else changes (capacities, copies, group semantics).
"""

from __future__ import annotations

import time
from collections.abc import Callable

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
