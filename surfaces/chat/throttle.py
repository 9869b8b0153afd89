"""The rate limit on starting chats: `POST /api/chat` and the WebSocket `chat` frame share one budget.

`CHAT_THROTTLE_RATE` (default `30/min`; DRF's rate syntax `N/sec|min|hour|day`; empty = off) is the
number of runs one user may *start* per period, whichever transport starts them. It complements
`CHAT_MAX_ACTIVE_RUNS_PER_USER` (how many may run at once): without it a script could start, cancel and
start again without end, each start costing a run row, a lease and model calls.

DRF's `SimpleRateThrottle` does the counting (a sliding window of timestamps in Django's `default` cache:
per process without `REDIS_URL`, shared by every process with it). A refusal is `ChatThrottled`, a
`ChatRefused` with status 429, code `throttled` and the seconds to wait (`Retry-After` on SSE, in the
message on the WebSocket); refused attempts are not counted. The chat service
(`surfaces.chat.service.start_chat`) checks it before the query is validated, as DRF throttles come
before a view's validation.
"""

from __future__ import annotations

import math

from django.conf import settings
from django.contrib.auth.base_user import AbstractBaseUser
from rest_framework.throttling import SimpleRateThrottle

from surfaces.chat.protocol import ChatRefused


class ChatThrottled(ChatRefused):
    """Too many chats started: 429 `throttled`, retry after `retry_after` seconds."""

    def __init__(self, retry_after: int) -> None:
        super().__init__(
            429,
            "throttled",
            f"Too many chats started; try again in {retry_after} s.",
            retry_after=retry_after,
        )


class _UserOnly:
    """What the throttle reads of a request: its user."""

    def __init__(self, user: AbstractBaseUser) -> None:
        self.user = user


class ChatRateThrottle(SimpleRateThrottle):
    """Scope `chat`, keyed by user id, rate read from `settings.CHAT_THROTTLE_RATE` at each use."""

    scope = "chat"

    def get_rate(self) -> str | None:
        return settings.CHAT_THROTTLE_RATE or None

    def get_cache_key(self, request, view) -> str:
        return self.cache_format % {"scope": self.scope, "ident": request.user.pk}


def check_chat_rate(*, user: AbstractBaseUser) -> None:
    """Count one chat start for `user`, or raise `ChatThrottled` (nothing counted) over the rate."""
    throttle = ChatRateThrottle()
    if not throttle.allow_request(_UserOnly(user), None):
        raise ChatThrottled(max(1, math.ceil(throttle.wait() or 1)))
