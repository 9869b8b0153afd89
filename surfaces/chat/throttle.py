"""The rate limit on starting chats: `POST /api/chat` and the WebSocket `chat` frame share one budget.

`CHAT_THROTTLE_RATE` (default `30/min`; empty = off) bounds the runs one user may start per period,
beside `CHAT_MAX_ACTIVE_RUNS_PER_USER`, so a script cannot start and cancel without end. DRF's
`SimpleRateThrottle` counts in Django's `default` cache; a refusal is `ChatThrottled` (429 `throttled`
with the seconds to wait) and is not counted. `surfaces.chat.service.start_chat` checks it first.
Details: docs/deployment.md, *Rate limits*.
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
