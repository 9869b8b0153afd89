"""Live fan-out of a run's events, replay of what was persisted, and following a run until its outcome.

The executor's sink (`ChannelLayerSink`) publishes each event, after its row committed, to the watchers
of its own process directly and to the run's channel-layer group (`run_group`) for the others. A
`RunFollower`, in any process, subscribes first, replays the persisted timeline after a sequence number,
then follows live events until the outcome: no gap, no duplicate, and a finished run always reaches its
outcome, because the follower reads the database again whenever live delivery skips or stalls. It
yields the executor's event objects (`agent.runtime.events`); the chat transport encodes them.
Details: docs/chat.md, *Runs outlive their connections*; docs/runtime.md, *Live events*.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from channels.layers import get_channel_layer
from django.conf import settings

from agent.runtime import local_fanout
from agent.runtime.db import db
from agent.runtime.events import (
    CHAT_TIMELINE_TYPES,
    DraftEvent,
    ErrorEvent,
    Event,
    OutcomeEvent,
    ToolEvent,
    from_message,
    identity,
    progress_of,
    run_event,
    sequence_of,
    timestamp,
    to_message,
)
from agent.runtime.receiver import Receiver
from audit.models import EventType
from audit.read import chat_timeline, finished_by
from diagnosis.models import DEMO_PROVIDER, TERMINAL_RUN_STATUSES, DiagnosisRun, RunStatus

logger = logging.getLogger(__name__)

FRAME_MESSAGE_TYPE = "run.frame"
# Without a live frame for this long, the follower checks the database for what it may have missed.
CATCHUP_SECONDS = 2.0
# RUN_FINISHED commits just before the run row's terminal update; wait this long for the row.
FINISH_ROW_WAIT_SECONDS = 3.0
# REFUSED starts are not tool calls; ERROR_OBSERVED is an observation, not a status change of the call.
_NOT_TOOL_STATUSES = frozenset({"REFUSED", "ERROR_OBSERVED"})
_SUBSCRIBE_TIMEOUT = 10.0
# How long closing a follower waits for its cancelled receive to unwind before the reader's stream ends.
_UNSUBSCRIBE_WAIT = 1.0
# A follower whose frames nobody started reading within this long unsubscribes (an abandoned request).
ABANDON_SECONDS = 60.0


def run_group(run_id: str) -> str:
    """The channel-layer group of a run's live events (run ids are `[A-Za-z0-9_]`, see `new_id`)."""
    return f"run.{run_id}"


# -------------------------------------------------------------------------------------------------
# Publishing (the executor's sink)
# -------------------------------------------------------------------------------------------------
async def publish(run_id: str, event: Event) -> bool:
    """Send one event to the run's followers: this process's directly, the others' through the run's
    group (`local_fanout`); best effort (False, logged without content, when the layer failed or there
    is neither a layer nor a local follower)."""
    local = local_fanout.deliver(run_id, event)
    layer = get_channel_layer()
    if layer is None:
        return local > 0
    group = run_group(run_id)
    try:
        if not await local_fanout.needs_layer(layer, run_id, group, draft=isinstance(event, DraftEvent)):
            return True
        message = {"type": FRAME_MESSAGE_TYPE, "origin": local_fanout.ORIGIN, **to_message(event)}
        await layer.group_send(group, message)
    except Exception as exc:  # the durable timeline is the record; followers catch up from it
        logger.warning("live publish failed run=%s frame=%s error=%s", run_id, event.type, type(exc).__name__)
        return False
    return True


def draft_coalesce_seconds() -> float:
    """How long the sink may hold a run's draft text to send several pieces as one frame
    (`CHAT_DRAFT_COALESCE_MS`; 0 = one frame per piece)."""
    return max(0.0, float(settings.CHAT_DRAFT_COALESCE_MS or 0)) / 1000.0


# A coalesced draft frame is sent at once when its text reaches this many characters.
MAX_COALESCED_DRAFT_CHARS = 4096


class ChannelLayerSink:
    """The executor's `EventSink` for live runs: every event goes to the run's group, in emit order.

    A channel-layer failure never raises out of `emit`: the live stream is best effort and the durable
    timeline is the record (followers catch up from the database). An event of another run is refused
    (ValueError), so a sink cannot leak one run's frames into another's stream.

    Draft coalescing (`coalesce_seconds` > 0, default `CHAT_DRAFT_COALESCE_MS`): at most one `draft`
    frame per window. A draft that finds the run quiet (no draft frame published within the window and
    none held) goes out at once; otherwise its text is held, later drafts of the run are appended, and
    the held text goes out as one `draft` frame, their concatenation in order, (a) when the window since
    the last draft frame ends (a timer), (b) as soon as it reaches `MAX_COALESCED_DRAFT_CHARS`, and
    (c) before any other event of the run, which therefore never overtakes answer text written before
    it. So a piece waits at most one window (plus the event loop's own delay), a model that writes more
    slowly than one piece per window is not delayed at all, and a burst (a loaded process reading several
    chunks at once) costs one frame. Nothing is dropped or reordered: every publish happens under one
    lock, taking whatever text is held at that moment. Drafts carry no sequence number and are not
    persisted, so the contract's `draft {"text"}` frames are unchanged but for how the text is split;
    every other frame is published exactly as before.
    """

    def __init__(self, run_id: str, *, coalesce_seconds: float | None = None) -> None:
        self.run_id = run_id
        self.coalesce_seconds = draft_coalesce_seconds() if coalesce_seconds is None else coalesce_seconds
        self._held: list[str] = []
        self._held_chars = 0
        self._timer: asyncio.TimerHandle | None = None
        self._flushing: set[asyncio.Task] = set()
        self._lock = asyncio.Lock()
        self._last_draft_at = float("-inf")

    async def emit(self, event: Event) -> None:
        event_run = getattr(event, "run_id", "")
        if event_run and event_run != self.run_id:
            raise ValueError("event of another run")
        if self.coalesce_seconds <= 0:
            await publish(self.run_id, event)
            return
        if isinstance(event, DraftEvent):
            loop = asyncio.get_running_loop()
            self._held.append(event.text)
            self._held_chars += len(event.text)
            quiet = loop.time() - self._last_draft_at >= self.coalesce_seconds
            if (quiet and len(self._held) == 1) or self._held_chars >= MAX_COALESCED_DRAFT_CHARS:
                await self.flush()
            elif self._timer is None:
                wait = max(0.0, self._last_draft_at + self.coalesce_seconds - loop.time())
                self._timer = loop.call_later(wait, self._on_timer)
            return
        async with self._lock:
            await self._publish_held()
            await publish(self.run_id, event)

    async def flush(self) -> None:
        """Publish the held draft text now (nothing when none is held)."""
        async with self._lock:
            await self._publish_held()

    def _on_timer(self) -> None:
        self._timer = None
        task = asyncio.ensure_future(self.flush())
        self._flushing.add(task)
        task.add_done_callback(self._flushing.discard)

    async def _publish_held(self) -> None:
        """Under the lock: publish the held text as one draft and forget it."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._held:
            return
        text = "".join(self._held)
        self._held.clear()
        self._held_chars = 0
        self._last_draft_at = asyncio.get_running_loop().time()
        await publish(self.run_id, DraftEvent(run_id=self.run_id, text=text))


# -------------------------------------------------------------------------------------------------
# Replay (reads of the persisted record)
# -------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Replay:
    """What the database holds for a follower: events after `after` (`frames`), whether the run has
    finished, and whether the follower already has everything (the run finished at or before `after`)."""

    frames: list[Event]
    finished: bool
    complete_before: bool = False
    row_pending: bool = False


def _outcome_events(run: DiagnosisRun, seq: int | None) -> list[Event]:
    events: list[Event] = []
    if run.status == RunStatus.FAILED:
        events.append(
            ErrorEvent(
                code=run.error_code or "RUN_FAILED",
                message=run.error_message or "The run failed.",
                run_id=run.run_id,
            )
        )
    events.append(
        OutcomeEvent(
            run_id=run.run_id,
            status=run.status,
            release_decision=run.release_decision,
            content=run.content,
            sequence_no=seq,
        )
    )
    return events


def persisted_frames(run_id: str, *, after: int) -> Replay:
    """The events a follower gets from the database for timeline events with `sequence_no > after`.

    Two queries (`audit.read.chat_timeline`). `row_pending` says RUN_FINISHED is stored but the row's
    terminal update has not landed yet (the caller waits and asks again). A run whose row is terminal
    without a RUN_FINISHED event (that audit write failed) still gets its outcome, without a sequence
    number.
    """
    rows, run = chat_timeline(run_id=run_id, after=after, event_types=CHAT_TIMELINE_TYPES)
    if run.status in TERMINAL_RUN_STATUSES and not any(r.event_type == EventType.RUN_FINISHED for r in rows):
        # The row read terminal after the events were read: the finish may have committed in between
        # (its last events and RUN_FINISHED commit with the row). Read the events once more, so that a
        # run is closed with its last frames, not only its outcome; if RUN_FINISHED is still absent,
        # its write failed.
        rows, run = chat_timeline(run_id=run_id, after=after, event_types=CHAT_TIMELINE_TYPES)
    events: list[Event] = []
    finished_seq: int | None = None
    for row in rows:
        if row.event_type == EventType.RUN_STARTED:
            demo = (row.details or {}).get("provider") == DEMO_PROVIDER
            events.append(run_event(run, sequence_no=row.sequence_no, demo=demo))
        elif (
            progress := progress_of(
                run_id=run_id,
                event_type=row.event_type,
                status=row.status,
                details=row.details,
                sequence_no=row.sequence_no,
                at=timestamp(row.created_at),
            )
        ) is not None:
            events.append(progress)
        elif row.event_type == EventType.TOOL_INVOCATION:
            if row.status in _NOT_TOOL_STATUSES or not row.details.get("toolCallId"):
                continue
            events.append(
                ToolEvent(
                    run_id=run_id,
                    tool_call_id=row.details["toolCallId"],
                    name=row.details.get("toolName", ""),
                    status=row.status,
                    sequence_no=row.sequence_no,
                    at=timestamp(row.created_at),
                )
            )
        elif row.event_type == EventType.RUN_FINISHED:
            finished_seq = row.sequence_no
            break
    if finished_seq is not None:
        if run.status not in TERMINAL_RUN_STATUSES:
            return Replay(frames=events, finished=False, row_pending=True)
        return Replay(frames=events + _outcome_events(run, finished_seq), finished=True)
    if run.status in TERMINAL_RUN_STATUSES:
        if after and finished_by(run_id=run_id, sequence_no=after):
            return Replay(frames=events, finished=True, complete_before=True)
        return Replay(frames=events + _outcome_events(run, None), finished=True)
    return Replay(frames=events, finished=False)


# -------------------------------------------------------------------------------------------------
# Following
# -------------------------------------------------------------------------------------------------
_followers = 0


def live_followers() -> int:
    """Run followers subscribed in this process now (the `/metrics` gauge of live connections)."""
    return _followers


class RunFollower:
    """Replay a run after `after`, then follow it live until its outcome (see the module docstring).

    Use as an async context manager (it subscribes on entry and unsubscribes on exit) and iterate
    `frames()`. With `heartbeat` seconds, `frames()` yields None whenever that long passed without a
    frame (SSE keep-alive comments). Iteration ends after the `outcome` frame, or at once when the run
    had finished at or before `after`. The follower never affects the run: leaving it stops watching.
    """

    def __init__(self, run_id: str, *, after: int = 0, heartbeat: float | None = None) -> None:
        self.run_id = run_id
        self.after = max(0, int(after))
        self.heartbeat = heartbeat
        self.last_seq = self.after
        self.sent: set[tuple] = set()
        self.finished = False
        self._held_error: Event | None = None
        self._layer = None
        self._channel: str | None = None
        # Live events arrive here from the layer (`_receive_loop`) or, published in this process,
        # directly (`local_fanout.deliver`, which reads `queue`, `loop` and `channel`).
        self._queue: asyncio.Queue = asyncio.Queue()
        self.queue = self._queue
        self.loop: asyncio.AbstractEventLoop | None = None
        self.channel: str | None = None
        self._pump: asyncio.Task | None = None
        self._receiver: Receiver | None = None
        self._started = False
        self._closed = False
        self._watchdog: asyncio.TimerHandle | None = None

    async def __aenter__(self) -> RunFollower:
        global _followers
        _followers += 1
        self._counted = True
        self._watchdog = asyncio.get_running_loop().call_later(ABANDON_SECONDS, self._abandon_if_unread)
        self.loop = asyncio.get_running_loop()
        local_fanout.register(self.run_id, self)
        self._layer = get_channel_layer()
        if self._layer is not None:
            try:
                # The layer's default prefix, shared with every process-local channel of this process
                # (see `agent.runtime.supervisor._control_listener`).
                self._channel = await self._layer.new_channel()
                self.channel = self._channel
                await asyncio.wait_for(
                    self._layer.group_add(run_group(self.run_id), self._channel), _SUBSCRIBE_TIMEOUT
                )
            except Exception as exc:  # no live frames then: the follower reads the database only
                logger.warning("live subscribe failed run=%s error=%s", self.run_id, type(exc).__name__)
                self._channel = self.channel = None
            else:
                self._receiver = Receiver(
                    self._layer, self._channel, self._on_message, what=f"live run={self.run_id}", pause=0.5
                )
                self._pump = asyncio.create_task(self._receiver.run(), name=f"follow:{self.run_id}")
        return self

    def _abandon_if_unread(self) -> None:
        if not self._started and not self._closed:
            logger.info("live follower abandoned run=%s", self.run_id)
            self._abandon = asyncio.ensure_future(self.__aexit__(None, None, None))

    async def __aexit__(self, *exc: Any) -> None:
        """Unsubscribe (idempotent; safe to call from any task)."""
        global _followers
        if self._closed:
            return
        self._closed = True
        local_fanout.unregister(self.run_id, self)
        if getattr(self, "_counted", False):
            self._counted = False
            _followers -= 1
        if self._watchdog is not None:
            self._watchdog.cancel()
        if self._receiver is not None:
            # Bounded: a receive the channel layer does not let go of at once must not hold the reader's
            # stream open after its outcome (it ends when this returns); `Receiver.stop` still ends a
            # receive whose cancellation the layer lost.
            with contextlib.suppress(BaseException):  # (a pump of another, closed loop: nothing to wait for)
                await self._receiver.stop(_UNSUBSCRIBE_WAIT)
        if self._layer is not None and self._channel is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(
                    asyncio.wait_for(
                        self._layer.group_discard(run_group(self.run_id), self._channel), _SUBSCRIBE_TIMEOUT
                    )
                )

    def _on_message(self, message: dict) -> None:
        if message.get("type") != FRAME_MESSAGE_TYPE or local_fanout.from_here(message):
            return  # not a frame, or one this process delivered to its followers directly
        event = from_message(message)
        if event is not None:
            self._queue.put_nowait(event)

    def _emit(self, event: Event) -> list[Event]:
        """The events to send for `event`: none when this follower sent it already (same or lower
        sequence number, or same identity). An `error` is held back and sent right before the outcome,
        so that a failed run always ends `error`, `outcome` whatever path each event took."""
        seq = sequence_of(event)
        if seq is not None and seq <= self.last_seq:
            return []
        if isinstance(event, OutcomeEvent) and event.status not in TERMINAL_RUN_STATUSES:
            return []  # an owner that lost its lease reports a row still being finished: wait for it
        key = identity(event)
        if key is not None and key in self.sent:
            return []
        if isinstance(event, ErrorEvent):
            self._held_error = event
            return []
        if key is not None:
            self.sent.add(key)
        if seq is not None:
            self.last_seq = seq
        if not isinstance(event, OutcomeEvent):
            return [event]
        self.finished = True
        held, self._held_error = self._held_error, None
        if held is None:
            return [event]
        self.sent.add(("error",))
        return [held, event]

    async def _from_database(self, *, before: int | None = None) -> list[Event]:
        """New events from the database after `last_seq` (and before `before`, when given); waits
        briefly for the terminal row of a run whose RUN_FINISHED is stored."""
        deadline = time.monotonic() + FINISH_ROW_WAIT_SECONDS
        while True:
            replay = await db(persisted_frames, self.run_id, after=self.last_seq)
            if before is not None or not replay.row_pending or time.monotonic() >= deadline:
                break
            await asyncio.sleep(0.05)
        frames = replay.frames
        if before is not None:
            return [
                out
                for f in frames
                if (seq := sequence_of(f)) is not None and seq < before
                for out in self._emit(f)
            ]
        if replay.complete_before:
            self.finished = True
        return [out for f in frames for out in self._emit(f)]

    async def frames(self) -> AsyncIterator[Event | None]:
        """Replay, then live events until the outcome; None marks a heartbeat (see the class doc)."""
        self._started = True
        for live in await self._from_database():
            yield live
        idle_since = beat_since = time.monotonic()
        while not self.finished:
            now = time.monotonic()
            waits = [CATCHUP_SECONDS - (now - idle_since)]
            if self.heartbeat:
                waits.append(self.heartbeat - (now - beat_since))
            try:
                live = await asyncio.wait_for(self._queue.get(), max(0.01, min(waits)))
            except TimeoutError:
                now = time.monotonic()
                if self.heartbeat and now - beat_since >= self.heartbeat:
                    beat_since = now
                    yield None
                if now - idle_since >= CATCHUP_SECONDS:
                    idle_since = now
                    for missed in await self._from_database():
                        beat_since = idle_since = time.monotonic()
                        yield missed
                continue
            idle_since = beat_since = time.monotonic()
            seq = sequence_of(live)
            if seq is not None and seq > self.last_seq + 1:
                # Events between the last frame sent and this one may hold frames whose live copy was lost.
                for missed in await self._from_database(before=seq):
                    yield missed
            for out in self._emit(live):
                yield out
