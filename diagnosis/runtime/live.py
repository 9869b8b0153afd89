"""Live fan-out of a run's events, replay of what was persisted, and following a run until its outcome.

A run is executed by one process (the lease owner); any number of connections, in any process, may watch
it. The executor's sink (`ChannelLayerSink`) publishes each event as a *frame* to the channel-layer group
of the run (`run_group`); a watcher (`RunFollower`) subscribes to that group, replays the persisted
timeline after a sequence number, then follows the live frames until the run's `outcome`.

Frames are exactly the WebSocket frames of the API contract (*Chat* section)::

    {"type": "run", "sessionId", "runId"}
    {"type": "delta", "runId", "text"}
    {"type": "tool", "runId", "toolCallId", "name", "status"}
    {"type": "outcome", "runId", "status", "releaseDecision", "content"}
    {"type": "error", "code", "message"}

and nothing else: no reasoning, no tool input or output. `sse_event` derives the SSE `event:`/`data:` pair
from a frame. A frame that maps to a timeline event carries that event's `sequence_no` beside it (`seq`,
never inside the frame) so transports can emit `id:` lines and clients resume exactly.

Replay maps persisted `TraceEvent`s: `RUN_STARTED` → `run`; `TOOL_INVOCATION` → `tool` with the event's
status (REFUSED starts are not tool calls and are skipped); `RUN_FINISHED` → `outcome` (status, release
decision and content from the run row), preceded by `error` for a FAILED run. Answer deltas are not
persisted; the outcome carries the full content.

No gap, no duplicate: the follower subscribes *before* it reads the database, buffers what arrives
meanwhile, replays, then drains the buffer skipping what it already sent (by sequence number and by the
frame's identity: one `run`, one `outcome`, one `error`, and one frame per tool call and status). The
executor publishes an event only after its row committed, so whatever was published before the
subscription is in the database. Live delivery is best effort (a full channel drops messages; the
channel layer may be briefly unreachable), so the follower also reads the database whenever a live frame
skips sequence numbers that could hold frames, and when the stream has been idle for `CATCHUP_SECONDS`;
a finished run is therefore always closed with its outcome, even when its live frames were lost or it
was finished by the sweeper in another process.
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

from audit.models import EventType, TraceEvent
from diagnosis.models import TERMINAL_RUN_STATUSES, DiagnosisRun, RunStatus
from diagnosis.runtime.db import db

logger = logging.getLogger(__name__)

FRAME_MESSAGE_TYPE = "run.frame"
# Without a live frame for this long, the follower checks the database for what it may have missed.
CATCHUP_SECONDS = 2.0
# RUN_FINISHED commits just before the run row's terminal update; wait this long for the row.
FINISH_ROW_WAIT_SECONDS = 3.0
_FRAME_EVENT_TYPES = (EventType.RUN_STARTED, EventType.TOOL_INVOCATION, EventType.RUN_FINISHED)
_NOT_TOOL_STATUSES = frozenset({"REFUSED"})
_SUBSCRIBE_TIMEOUT = 10.0
# A follower whose frames nobody started reading within this long unsubscribes (an abandoned request).
ABANDON_SECONDS = 60.0
FRAME_TYPES = frozenset({"run", "delta", "tool", "outcome", "error"})


# -------------------------------------------------------------------------------------------------
# Frames
# -------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class LiveFrame:
    """A contract frame and, when it maps to a timeline event, that event's `sequence_no`."""

    frame: dict[str, Any]
    seq: int | None = None

    @property
    def type(self) -> str:
        return self.frame["type"]


def run_group(run_id: str) -> str:
    """The channel-layer group of a run's live frames (run ids are `[A-Za-z0-9_]`, see `new_id`)."""
    return f"run.{run_id}"


def run_frame(*, session_id: str, run_id: str) -> dict[str, Any]:
    return {"type": "run", "sessionId": session_id, "runId": run_id}


def delta_frame(*, run_id: str, text: str) -> dict[str, Any]:
    return {"type": "delta", "runId": run_id, "text": text}


def tool_frame(*, run_id: str, tool_call_id: str, name: str, status: str) -> dict[str, Any]:
    return {"type": "tool", "runId": run_id, "toolCallId": tool_call_id, "name": name, "status": str(status)}


def outcome_frame(*, run_id: str, status: str, release_decision: str | None, content: str) -> dict[str, Any]:
    return {
        "type": "outcome",
        "runId": run_id,
        "status": str(status),
        "releaseDecision": str(release_decision) if release_decision else None,
        "content": content,
    }


def error_frame(*, code: str, message: str) -> dict[str, Any]:
    return {"type": "error", "code": code, "message": message}


def sse_event(frame: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The SSE `event:` name and `data:` object of a frame (the contract's SSE keys)."""
    kind = frame["type"]
    data = {k: v for k, v in frame.items() if k != "type"}
    if kind in ("delta", "tool"):
        data.pop("runId", None)
    return kind, data


def frame_key(frame: dict[str, Any]) -> tuple | None:
    """The identity of a frame within one run (None for deltas, which are never deduplicated)."""
    kind = frame["type"]
    if kind == "tool":
        return ("tool", frame["toolCallId"], frame["status"])
    if kind in ("run", "outcome", "error"):
        return (kind,)
    return None


def frame_for_event(event: Any) -> LiveFrame | None:
    """Map an executor event (`diagnosis.runtime.events`) to a frame with its sequence number, if any.

    The frame is the event's own `ws_frame()` (the contract's keys and nothing else); events without one
    are not chat frames and map to None."""
    to_frame = getattr(event, "ws_frame", None)
    if to_frame is None:
        return None
    frame = to_frame()
    if frame.get("type") not in FRAME_TYPES:
        return None
    seq = getattr(event, "sequence_no", None) if frame["type"] in ("run", "tool", "outcome") else None
    return LiveFrame(frame, seq)


# -------------------------------------------------------------------------------------------------
# Publishing (the executor's sink)
# -------------------------------------------------------------------------------------------------
async def publish(run_id: str, live: LiveFrame) -> bool:
    """Send one frame to the run's group; best effort (False, logged without content, on failure)."""
    layer = get_channel_layer()
    if layer is None:
        return False
    try:
        await layer.group_send(
            run_group(run_id), {"type": FRAME_MESSAGE_TYPE, "frame": live.frame, "seq": live.seq}
        )
    except Exception as exc:  # the durable timeline is the record; followers catch up from it
        logger.warning("live publish failed run=%s frame=%s error=%s", run_id, live.type, type(exc).__name__)
        return False
    return True


class ChannelLayerSink:
    """The executor's `EventSink` for live runs: every event becomes a contract frame in the run's group.

    A channel-layer failure never raises out of `emit`: the live stream is best effort and the durable
    timeline is the record (followers catch up from the database). An event of another run is refused
    (ValueError), so a sink cannot leak one run's frames into another's stream.
    """

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id

    async def emit(self, event: Any) -> None:
        event_run = getattr(event, "run_id", "")
        if event_run and event_run != self.run_id:
            raise ValueError("event of another run")
        live = frame_for_event(event)
        if live is not None:
            await publish(self.run_id, live)


# -------------------------------------------------------------------------------------------------
# Replay (reads of the persisted record)
# -------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Replay:
    """What the database holds for a follower: frames after `after`, whether the run has finished, and
    whether the follower already has everything (the run finished at or before `after`)."""

    frames: list[LiveFrame]
    finished: bool
    complete_before: bool = False
    row_pending: bool = False


def _outcome_frames(run: DiagnosisRun, seq: int | None) -> list[LiveFrame]:
    frames = []
    if run.status == RunStatus.FAILED:
        frames.append(
            LiveFrame(
                error_frame(
                    code=run.error_code or "RUN_FAILED",
                    message=run.error_message or "The run failed.",
                )
            )
        )
    frames.append(
        LiveFrame(
            outcome_frame(
                run_id=run.run_id,
                status=run.status,
                release_decision=run.release_decision,
                content=run.content,
            ),
            seq,
        )
    )
    return frames


def persisted_frames(run_id: str, *, after: int) -> Replay:
    """The frames a follower gets from the database for timeline events with `sequence_no > after`.

    Two queries: the frame-mapped events after `after` and the run row (read second, so a RUN_FINISHED
    seen in the first is normally matched by a terminal row). `row_pending` says RUN_FINISHED is stored
    but the row's terminal update has not landed yet (the caller waits and asks again). A run whose row
    is terminal without a RUN_FINISHED event (that audit write failed) still gets its outcome, without a
    sequence number.
    """
    rows = list(
        TraceEvent.objects.filter(run_id=run_id, sequence_no__gt=after, event_type__in=_FRAME_EVENT_TYPES)
        .order_by("sequence_no")
        .values_list("sequence_no", "event_type", "status", "details")
    )
    run = DiagnosisRun.objects.only(
        "run_id", "session_id", "status", "release_decision", "content", "error_code", "error_message"
    ).get(run_id=run_id)
    frames: list[LiveFrame] = []
    finished_seq: int | None = None
    for seq, event_type, status, details in rows:
        if event_type == EventType.RUN_STARTED:
            frames.append(LiveFrame(run_frame(session_id=run.session_id, run_id=run_id), seq))
        elif event_type == EventType.TOOL_INVOCATION:
            if status in _NOT_TOOL_STATUSES or not details.get("toolCallId"):
                continue
            frames.append(
                LiveFrame(
                    tool_frame(
                        run_id=run_id,
                        tool_call_id=details["toolCallId"],
                        name=details.get("toolName", ""),
                        status=status,
                    ),
                    seq,
                )
            )
        elif event_type == EventType.RUN_FINISHED:
            finished_seq = seq
            break
    if finished_seq is not None:
        if run.status not in TERMINAL_RUN_STATUSES:
            return Replay(frames=frames, finished=False, row_pending=True)
        return Replay(frames=frames + _outcome_frames(run, finished_seq), finished=True)
    if run.status in TERMINAL_RUN_STATUSES:
        if (
            after
            and TraceEvent.objects.filter(
                run_id=run_id, sequence_no__lte=after, event_type=EventType.RUN_FINISHED
            ).exists()
        ):
            return Replay(frames=frames, finished=True, complete_before=True)
        return Replay(frames=frames + _outcome_frames(run, None), finished=True)
    return Replay(frames=frames, finished=False)


# -------------------------------------------------------------------------------------------------
# Following
# -------------------------------------------------------------------------------------------------
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
        self._held_error: LiveFrame | None = None
        self._layer = None
        self._channel: str | None = None
        self._queue: asyncio.Queue = asyncio.Queue()
        self._pump: asyncio.Task | None = None
        self._started = False
        self._closed = False
        self._watchdog: asyncio.TimerHandle | None = None

    async def __aenter__(self) -> RunFollower:
        self._watchdog = asyncio.get_running_loop().call_later(ABANDON_SECONDS, self._abandon_if_unread)
        self._layer = get_channel_layer()
        if self._layer is not None:
            try:
                self._channel = await self._layer.new_channel(prefix="follow.")
                await asyncio.wait_for(
                    self._layer.group_add(run_group(self.run_id), self._channel), _SUBSCRIBE_TIMEOUT
                )
            except Exception as exc:  # no live frames then: the follower reads the database only
                logger.warning("live subscribe failed run=%s error=%s", self.run_id, type(exc).__name__)
                self._channel = None
            else:
                self._pump = asyncio.create_task(self._receive_loop(), name=f"follow:{self.run_id}")
        return self

    def _abandon_if_unread(self) -> None:
        if not self._started and not self._closed:
            logger.info("live follower abandoned run=%s", self.run_id)
            self._abandon = asyncio.ensure_future(self.__aexit__(None, None, None))

    async def __aexit__(self, *exc: Any) -> None:
        """Unsubscribe (idempotent; safe to call from any task)."""
        if self._closed:
            return
        self._closed = True
        if self._watchdog is not None:
            self._watchdog.cancel()
        if self._pump is not None:
            self._pump.cancel()
            with contextlib.suppress(BaseException):
                await self._pump
        if self._layer is not None and self._channel is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(
                    asyncio.wait_for(
                        self._layer.group_discard(run_group(self.run_id), self._channel), _SUBSCRIBE_TIMEOUT
                    )
                )

    async def _receive_loop(self) -> None:
        while True:
            try:
                message = await self._layer.receive(self._channel)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                logger.warning("live receive failed run=%s error=%s", self.run_id, type(exc).__name__)
                await asyncio.sleep(0.5)
                continue
            if message.get("type") == FRAME_MESSAGE_TYPE and isinstance(message.get("frame"), dict):
                self._queue.put_nowait(LiveFrame(message["frame"], message.get("seq")))

    def _emit(self, live: LiveFrame) -> list[LiveFrame]:
        """The frames to send for `live`: none when this follower sent it already (same or lower
        sequence number, or same identity). An `error` is held back and sent right before the outcome,
        so that a failed run always ends `error`, `outcome` whatever path each frame took."""
        if live.seq is not None and live.seq <= self.last_seq:
            return []
        if live.type == "outcome" and live.frame.get("status") not in TERMINAL_RUN_STATUSES:
            return []  # an owner that lost its lease reports a row still being finished: wait for it
        key = frame_key(live.frame)
        if key is not None and key in self.sent:
            return []
        if live.type == "error":
            self._held_error = live
            return []
        if key is not None:
            self.sent.add(key)
        if live.seq is not None:
            self.last_seq = live.seq
        if live.type != "outcome":
            return [live]
        self.finished = True
        held, self._held_error = self._held_error, None
        if held is None:
            return [live]
        self.sent.add(("error",))
        return [held, live]

    async def _from_database(self, *, before: int | None = None) -> list[LiveFrame]:
        """New frames from the database after `last_seq` (and before `before`, when given); waits
        briefly for the terminal row of a run whose RUN_FINISHED is stored."""
        deadline = time.monotonic() + FINISH_ROW_WAIT_SECONDS
        while True:
            replay = await db(persisted_frames, self.run_id, after=self.last_seq)
            if before is not None or not replay.row_pending or time.monotonic() >= deadline:
                break
            await asyncio.sleep(0.05)
        frames = replay.frames
        if before is not None:
            return [out for f in frames if f.seq is not None and f.seq < before for out in self._emit(f)]
        if replay.complete_before:
            self.finished = True
        return [out for f in frames for out in self._emit(f)]

    async def frames(self) -> AsyncIterator[LiveFrame | None]:
        """Replay, then live frames until the outcome; None marks a heartbeat (see the class doc)."""
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
            if live.seq is not None and live.seq > self.last_seq + 1:
                # Events between the last frame sent and this one may hold frames whose live copy was lost.
                for missed in await self._from_database(before=live.seq):
                    yield missed
            for out in self._emit(live):
                yield out


def heartbeat_seconds() -> float:
    """Seconds between SSE keep-alive comments (`CHAT_SSE_HEARTBEAT_SECONDS`, default 15)."""
    return float(getattr(settings, "CHAT_SSE_HEARTBEAT_SECONDS", 15.0))
