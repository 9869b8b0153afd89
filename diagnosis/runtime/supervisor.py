"""Per-process ownership of live runs: start, cancel, and the process's background duties.

Transports (the WebSocket consumer, the SSE views) never execute a run themselves. They call
`start_chat` (validate, enforce the per-user limit, create the run) and `launch` (execute it in an
`asyncio` task owned by this process), then *follow* the run through `diagnosis.runtime.live`. The task
is kept in a per-process registry with a strong reference until it ends; it is not tied to any
connection, so closing the socket or the HTTP stream never stops the run.

Cancel (`request_cancel`) sets the run's `cancel_requested` column (the executor's heartbeat reads it at
its next beat, whatever process owns the run), fires the run's in-process `CancelToken` when this
process owns it, and otherwise sends a control message to the run's control group, which the owning
process joined when it launched the run, so the owner stops at once.

Background duties, started lazily once per process (per event loop) by `ensure_background()`: the
control listener (one channel per process) and the periodic sweeper (`diagnosis.runtime.sweeper`,
every `RUN_SWEEP_INTERVAL_SECONDS`; 0 disables it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import Any

from channels.layers import get_channel_layer
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import transaction

from diagnosis.models import TERMINAL_RUN_STATUSES, ChatSession, DiagnosisRun, RunStatus
from diagnosis.runtime.cancel import CancelToken
from diagnosis.runtime.db import db
from diagnosis.runtime.events import SafeSink
from diagnosis.runtime.executor import RunNotClaimable, execute_run, prepare_run
from diagnosis.runtime.live import ChannelLayerSink
from diagnosis.selectors import sees_all_sessions

logger = logging.getLogger(__name__)

QUERY_MAX_CHARS = 8000
ID_MAX_CHARS = 64
ACTIVE_STATUSES = (RunStatus.PENDING, RunStatus.RUNNING)
CONTROL_MESSAGE_TYPE = "run.cancel"


class ChatRefused(Exception):
    """A chat, attach or cancel request the transport must refuse: `code` and a safe `message` for the
    contract's error shape, and the HTTP `status` an SSE endpoint answers with."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


def max_active_runs() -> int:
    return int(getattr(settings, "CHAT_MAX_ACTIVE_RUNS_PER_USER", 3))


# -------------------------------------------------------------------------------------------------
# Validation and creation (synchronous; await through `db`)
# -------------------------------------------------------------------------------------------------
def validate_query(query: Any) -> str:
    if not isinstance(query, str) or not query.strip():
        raise ChatRefused(400, "invalid_request", "query must be a non-empty string.")
    if len(query) > QUERY_MAX_CHARS:
        raise ChatRefused(400, "invalid_request", f"query must be at most {QUERY_MAX_CHARS} characters.")
    return query


def validate_id(value: Any, name: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > ID_MAX_CHARS:
        raise ChatRefused(400, "invalid_request", f"{name} must be a string of 1..{ID_MAX_CHARS} characters.")
    return value


def validate_after(value: Any) -> int:
    if value is None or value == "":
        return 0
    if isinstance(value, bool):
        raise ChatRefused(400, "invalid_request", "after must be a non-negative integer.")
    if isinstance(value, str):
        if not value.isdigit() or len(value) > 12:
            raise ChatRefused(400, "invalid_request", "after must be a non-negative integer.")
        value = int(value)
    if not isinstance(value, int) or value < 0 or value > 10**12:
        raise ChatRefused(400, "invalid_request", "after must be a non-negative integer.")
    return value


def active_run_count(*, user: AbstractBaseUser) -> int:
    return DiagnosisRun.objects.filter(session__owner=user, status__in=ACTIVE_STATUSES).count()


def start_chat(*, user: AbstractBaseUser, query: Any, session_id: Any = None) -> DiagnosisRun:
    """Create a PENDING run of `query` for `user`, in their session `session_id` or a new one.

    Refuses (ChatRefused) an invalid query (400), a session the user does not own (404, as for one that
    does not exist) and a user who already has `CHAT_MAX_ACTIVE_RUNS_PER_USER` runs PENDING or RUNNING
    (429). The count and the creation happen under a lock on the user's row, so concurrent requests of
    one user cannot overshoot the limit.
    """
    query = validate_query(query)
    session_id = validate_id(session_id, "sessionId")
    with transaction.atomic():
        get_user_model().objects.select_for_update().filter(pk=user.pk).first()
        if session_id is not None:
            session = ChatSession.objects.filter(session_id=session_id, owner=user).first()
            if session is None:
                raise ChatRefused(404, "not_found", "Not found.")
        else:
            session = None
        limit = max_active_runs()
        if active_run_count(user=user) >= limit:
            raise ChatRefused(
                429,
                "too_many_active_runs",
                f"At most {limit} runs may be active at once; wait for one to finish or cancel it.",
            )
        return prepare_run(user=user, query=query, session_id=session.session_id if session else None)


def visible_run(*, user: AbstractBaseUser | AnonymousUser, run_id: Any) -> DiagnosisRun | None:
    """The run `run_id` if `user` may see it (owner of its session, or staff); else None, as for a run
    that does not exist."""
    if not isinstance(run_id, str) or not run_id or len(run_id) > ID_MAX_CHARS:
        return None
    if not user.is_authenticated or not user.is_active:
        return None
    qs = DiagnosisRun.objects.filter(run_id=run_id)
    if not sees_all_sessions(user):
        qs = qs.filter(session__owner=user)
    return qs.only("run_id", "session_id", "status").first()


def mark_cancel_requested(run_id: str) -> str:
    """Set `cancel_requested` on an active run; returns the run's status as stored after the update."""
    DiagnosisRun.objects.filter(run_id=run_id, status__in=ACTIVE_STATUSES).update(cancel_requested=True)
    return DiagnosisRun.objects.filter(run_id=run_id).values_list("status", flat=True).first() or ""


# -------------------------------------------------------------------------------------------------
# The per-process registry of run tasks
# -------------------------------------------------------------------------------------------------
@dataclass(slots=True)
class _Owned:
    task: asyncio.Task
    token: CancelToken


_runs: dict[str, _Owned] = {}


def owned_runs() -> dict[str, asyncio.Task]:
    """The runs this process is executing (run id → task)."""
    return {run_id: owned.task for run_id, owned in _runs.items()}


def launch(run_id: str) -> asyncio.Task:
    """Execute the run in a task of this process (the executor takes the run's lease). The task is
    referenced by the registry until it ends; nothing a connection does can cancel it."""
    existing = _runs.get(run_id)
    if existing is not None and not existing.task.done():
        return existing.task
    ensure_background()
    token = CancelToken()
    task = asyncio.get_running_loop().create_task(_execute(run_id, token), name=f"run:{run_id}")
    _runs[run_id] = _Owned(task=task, token=token)
    task.add_done_callback(lambda t, run_id=run_id: _forget(run_id, t))
    return task


def _forget(run_id: str, task: asyncio.Task) -> None:
    owned = _runs.get(run_id)
    if owned is not None and owned.task is task:
        del _runs[run_id]


async def _execute(run_id: str, token: CancelToken) -> None:
    sink = SafeSink(ChannelLayerSink(run_id), run_id=run_id)
    joined = await _control_join(run_id)
    try:
        await execute_run(run_id=run_id, sink=sink, cancel=token)
    except asyncio.CancelledError:
        raise
    except RunNotClaimable:
        # Another process owns it, or it finished (e.g. swept) before this task started: not ours.
        logger.warning("run not claimable run=%s", run_id)
    except Exception as exc:
        # The executor finishes every run it claimed; reaching here is a bug. Never leave the run open.
        logger.error("run task crashed run=%s error=%s", run_id, type(exc).__name__)
        from diagnosis.runtime.sweeper import fail_run

        with contextlib.suppress(Exception):
            await db(fail_run, run_id, error_code="INTERNAL_ERROR", error_message="The run failed.")
    finally:
        if joined:
            await _control_leave(run_id)


async def request_cancel(run_id: str) -> str:
    """Ask the run to stop (see the module docstring); returns its status at the time of the request.
    Cancelling a finished run changes nothing."""
    status = await db(mark_cancel_requested, run_id)
    if status in TERMINAL_RUN_STATUSES:
        return status
    owned = _runs.get(run_id)
    if owned is not None and not owned.task.done():
        owned.token.cancel("cancel requested")
        return status
    layer = get_channel_layer()
    if layer is not None:
        try:
            await layer.group_send(control_group(run_id), {"type": CONTROL_MESSAGE_TYPE, "run_id": run_id})
        except Exception as exc:  # the owner's heartbeat still reads the column
            logger.warning("cancel message failed run=%s error=%s", run_id, type(exc).__name__)
    return status


# -------------------------------------------------------------------------------------------------
# Background duties of the process: control listener and periodic sweeper
# -------------------------------------------------------------------------------------------------
def control_group(run_id: str) -> str:
    return f"runctl.{run_id}"


@dataclass(slots=True)
class _Background:
    loop: asyncio.AbstractEventLoop
    channel: str | None
    tasks: list[asyncio.Task]
    ready: asyncio.Event


_background: _Background | None = None


def ensure_background() -> None:
    """Start this process's control listener and periodic sweeper once (again after a loop change)."""
    global _background
    loop = asyncio.get_running_loop()
    if (
        _background is not None
        and _background.loop is loop
        and not loop.is_closed()
        and all(not t.done() for t in _background.tasks)
    ):
        return
    ready = asyncio.Event()
    tasks = [loop.create_task(_control_listener(ready), name="runs:control")]
    interval = float(getattr(settings, "RUN_SWEEP_INTERVAL_SECONDS", 15))
    if interval > 0:
        tasks.append(loop.create_task(_sweep_periodically(interval), name="runs:sweeper"))
    _background = _Background(loop=loop, channel=None, tasks=tasks, ready=ready)


async def _control_listener(ready: asyncio.Event) -> None:
    layer = get_channel_layer()
    if layer is None:
        ready.set()
        return
    channel = await layer.new_channel(prefix="runctl.")
    if _background is not None:
        _background.channel = channel
    ready.set()
    while True:
        try:
            message = await layer.receive(channel)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.warning("control receive failed error=%s", type(exc).__name__)
            await asyncio.sleep(1.0)
            continue
        if message.get("type") == CONTROL_MESSAGE_TYPE:
            owned = _runs.get(str(message.get("run_id", "")))
            if owned is not None:
                owned.token.cancel("cancel requested")


async def _control_channel() -> str | None:
    ensure_background()
    background = _background
    if background is None:
        return None
    try:
        await asyncio.wait_for(background.ready.wait(), 5.0)
    except TimeoutError:
        return None
    return background.channel


async def _control_join(run_id: str) -> bool:
    channel = await _control_channel()
    layer = get_channel_layer()
    if channel is None or layer is None:
        return False
    try:
        await asyncio.wait_for(layer.group_add(control_group(run_id), channel), 5.0)
    except Exception as exc:
        logger.warning("control join failed run=%s error=%s", run_id, type(exc).__name__)
        return False
    return True


async def _control_leave(run_id: str) -> None:
    channel = _background.channel if _background is not None else None
    layer = get_channel_layer()
    if channel is None or layer is None:
        return
    with contextlib.suppress(Exception):
        await asyncio.shield(asyncio.wait_for(layer.group_discard(control_group(run_id), channel), 5.0))


async def _sweep_periodically(interval: float) -> None:
    from diagnosis.runtime.sweeper import publish_swept, sweep_expired_runs

    while True:
        await asyncio.sleep(interval)
        try:
            swept = await db(sweep_expired_runs)
            await publish_swept(swept)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.warning("periodic sweep failed error=%s", type(exc).__name__)


async def stop_background() -> None:
    """Stop this process's background duties (graceful shutdown, tests). Runs are not affected."""
    global _background
    background, _background = _background, None
    if background is None or background.loop is not asyncio.get_running_loop():
        return
    for task in background.tasks:
        task.cancel()
    for task in background.tasks:
        with contextlib.suppress(BaseException):
            await task
