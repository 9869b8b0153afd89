"""The process-local path of a run's live events: the executor's events reach the followers of the same
process directly, and the channel layer carries them only to followers in other processes.

Each `RunFollower` registers (`register`) before it subscribes, and gets later events through `deliver`
in emit order; a layer message of this process's own `ORIGIN` is dropped, so nothing arrives twice.
`needs_layer` sends every event but a draft through a cross-process layer, and a draft only while the
run's group has a member elsewhere. Delivery is best effort as through the layer: a full local queue
drops events, and the follower catches up from the database.
Details: docs/chat.md, *Runs outlive their connections* (the process-local path).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from typing import TYPE_CHECKING, Any

from channels.layers import InMemoryChannelLayer

if TYPE_CHECKING:
    from agent.runtime.events import Event

logger = logging.getLogger(__name__)

ORIGIN = uuid.uuid4().hex
REMOTE_CHECK_SECONDS = 1.0
LOCAL_QUEUE_MAX = 5000
REMOTE_CACHE_MAX = 4096

# run id -> this process's followers of it (objects with `loop`, `queue` and `channel` attributes).
_followers: dict[str, set[Any]] = {}
# run id -> (monotonic time of the check, whether the group had a member outside this process)
_remote: dict[str, tuple[float, bool]] = {}


def register(run_id: str, follower: Any) -> None:
    """Deliver the run's events published from now on to `follower` (its `queue`, on its `loop`)."""
    _followers.setdefault(run_id, set()).add(follower)


def unregister(run_id: str, follower: Any) -> None:
    followers = _followers.get(run_id)
    if followers is None:
        return
    followers.discard(follower)
    if not followers:
        del _followers[run_id]
        _remote.pop(run_id, None)


def deliver(run_id: str, event: Event) -> int:
    """Put `event` into the queue of every local follower of the run; how many got it."""
    delivered = 0
    for follower in tuple(_followers.get(run_id, ())):
        queue: asyncio.Queue = follower.queue
        if queue.qsize() >= LOCAL_QUEUE_MAX:
            continue  # a reader that stopped reading: it catches up from the database
        loop = follower.loop
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if loop is running:
            queue.put_nowait(event)
        else:
            with contextlib.suppress(RuntimeError):  # that loop is closed: nobody reads any more
                loop.call_soon_threadsafe(queue.put_nowait, event)
        delivered += 1
    return delivered


def from_here(message: dict[str, Any]) -> bool:
    """Whether a layer message was sent by this process (its followers had it locally already)."""
    return message.get("origin") == ORIGIN


async def needs_layer(layer: Any, run_id: str, group: str, *, draft: bool) -> bool:
    """Whether an event of `run_id` must go through `layer` to reach followers in other processes."""
    if isinstance(layer, InMemoryChannelLayer):
        return False
    if not draft:
        return True
    now = time.monotonic()
    checked = _remote.get(run_id)
    if checked is not None and now - checked[0] < REMOTE_CHECK_SECONDS:
        return checked[1]
    remote = await _group_has_remote_member(layer, run_id, group)
    _remote[run_id] = (now, remote)
    if len(_remote) > REMOTE_CACHE_MAX:  # forget the answers too old to be used again
        for key, (at, _was) in list(_remote.items()):
            if now - at >= REMOTE_CHECK_SECONDS:
                del _remote[key]
    return remote


async def _group_has_remote_member(layer: Any, run_id: str, group: str) -> bool:
    """The run's group holds a channel that is no local follower's (True when it cannot be read)."""
    try:
        key = layer._group_key(group)
        connection = layer.connection(layer.consistent_hash(group))
        members = {m.decode() for m in await connection.zrange(key, 0, -1)}
    except Exception as exc:  # a layer without these (not channels_redis) or Redis unreachable
        logger.debug("live group read failed run=%s error=%s", run_id, type(exc).__name__)
        return True
    local = {f.channel for f in _followers.get(run_id, ()) if f.channel}
    return bool(members - local)
