"""The process-local path of a run's live events: the executor's events reach the followers of the same
process directly, and the channel layer carries them only to followers in other processes.

A chat's run executes in the process whose connection started it (`supervisor.launch`), so its own
follower is almost always local. Through the Redis channel layer every frame cost that process four
Redis round trips to publish (`group_send`: expire, read the group, expire the channels, a script) and a
blocking pop and a decode to receive, per follower: at 50 draft pieces a second per chat this was most
of the process's CPU and the frames queued for seconds (docs/performance.md, B3). Here:

- Every `RunFollower` registers itself (`register`) before it subscribes to the run's group, so an event
  published after that reaches it through `deliver`, in emit order, without the layer. Delivery into a
  follower of another event loop of the process goes through that loop (`call_soon_threadsafe`). A
  follower holding `LOCAL_QUEUE_MAX` undelivered events misses the next ones, as a full channel does;
  it catches up from the database like after any lost live frame.
- Every message the process sends through the layer carries `ORIGIN`, this process's token; a follower
  drops a layer message of its own origin, which it has had locally already. So nothing arrives twice,
  drafts included (they carry no sequence number to de-duplicate by).
- `needs_layer` says whether an event must still go through the layer. Not with the in-memory layer (it
  reaches no other process). With another layer, every event but a draft goes (a handful per run, and
  what a follower elsewhere needs whatever its timing); a draft goes only when the run's group has a
  member that is not one of this process's followers, as read from the layer at most once per
  `REMOTE_CHECK_SECONDS` per run. A follower in another process that subscribes meanwhile therefore
  gets drafts from up to that long after it subscribed — the same as subscribing that much later.
  Drafts are best-effort by contract (not persisted; the outcome carries the whole answer), and when
  the group cannot be read the draft goes through the layer as before.
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
