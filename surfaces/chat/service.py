"""The chat service: what both transports (WebSocket `surfaces.chat.consumers`, SSE `surfaces.chat.sse`)
do to start, follow and cancel runs, so that each rule and each step exists once.

`start_chat` (the rate limit, the query, the session, the active-run limit, then the PENDING run with the
query redacted), `open_chat` (start, subscribe, *then* launch, so the follower misses nothing),
`find_run` (the one visibility rule: an unseen run is 404 like a missing one), `open_stream` (replay
after `after`, then live until the outcome) and `cancel_run`. Every refusal is a `ChatRefused` that the
transport renders in its own shape.
Details: docs/chat.md, *Runs outlive their connections*.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import transaction

from agent.runtime.db import db
from agent.runtime.executor import prepare_run, redact_query
from agent.runtime.live import RunFollower
from agent.runtime.supervisor import ACTIVE_STATUSES, ensure_background, launch, request_cancel
from core.api import NOT_FOUND_RUN, NOT_FOUND_SESSION
from core.db_router import pin_reads_to_primary
from core.ids import MAX_ID_CHARS
from diagnosis import services
from diagnosis.models import AgentFlow, DiagnosisRun
from diagnosis.selectors import get_visible_run, owned_session
from surfaces.chat.protocol import ChatRefused
from surfaces.chat.throttle import check_chat_rate

AFTER_MAX = 10**12


def _not_found(message: str = NOT_FOUND_RUN) -> ChatRefused:
    """404 with the REST API's text for the kind (`core.api.NOT_FOUND_*`): absent and not visible alike."""
    return ChatRefused(404, "not_found", message)


def max_active_runs() -> int:
    return int(settings.CHAT_MAX_ACTIVE_RUNS_PER_USER)


def validate_id(value: Any, name: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > MAX_ID_CHARS:
        raise ChatRefused(400, "invalid_request", f"{name} must be a string of 1..{MAX_ID_CHARS} characters.")
    return value


def validate_after(value: Any, *, strings: bool = True) -> int:
    """A resume point: a non-negative integer (also as decimal digits when `strings`, as in a query
    string or `Last-Event-ID`); None or "" is 0."""
    refused = ChatRefused(400, "invalid_request", "after must be a non-negative integer.")
    if value is None or (value == "" and strings):
        return 0
    if isinstance(value, bool):
        raise refused
    if isinstance(value, str):
        if not strings or not value.isdigit() or len(value) > 12:
            raise refused
        value = int(value)
    if not isinstance(value, int) or value < 0 or value > AFTER_MAX:
        raise refused
    return value


def active_run_count(*, user: AbstractBaseUser) -> int:
    """The user's chat runs PENDING or RUNNING (queued AI Ops analyses wait for a worker, not for the
    user, and do not count against their chats)."""
    return DiagnosisRun.objects.filter(
        session__owner=user, status__in=ACTIVE_STATUSES, agent_flow=AgentFlow.DIAGNOSIS_AGENT
    ).count()


def start_chat(*, user: AbstractBaseUser, query: Any, session_id: Any = None) -> DiagnosisRun:
    """Create a PENDING run of `query` for `user`, in their session `session_id` or a new one.

    Refuses (ChatRefused), in this order: too many chats started (429 `throttled`), an invalid query or
    id (400), a session the user does not own (404, as for one that does not exist) and a user who
    already has `CHAT_MAX_ACTIVE_RUNS_PER_USER` chat runs PENDING or RUNNING (429). The count and the creation
    happen under a lock on the user's row, so concurrent requests of one user cannot overshoot the limit.
    """
    check_chat_rate(user=user)
    try:
        query = services.validate_query(query)
    except services.InvalidQuery as exc:
        raise ChatRefused(400, "invalid_request", str(exc)) from None
    session_id = validate_id(session_id, "sessionId")
    # Redacted before the user's row is locked: scanning a long paste must not hold the lock.
    query, redaction = redact_query(query)
    with transaction.atomic():
        get_user_model().objects.select_for_update().filter(pk=user.pk).first()
        session = None
        if session_id is not None:
            session = owned_session(user=user, session_id=session_id)
            if session is None:
                raise _not_found(NOT_FOUND_SESSION)
        limit = max_active_runs()
        if active_run_count(user=user) >= limit:
            raise ChatRefused(
                429,
                "too_many_active_runs",
                f"At most {limit} runs may be active at once; wait for one to finish or cancel it.",
            )
        run = prepare_run(user=user, query=query, session=session, redaction=redaction, redacted=True)
    # A chat started over a WebSocket is no HTTP write the pin middleware sees: its user reads the
    # primary for a while all the same (the new run is not on the replica yet).
    pin_reads_to_primary(user)
    return run


async def open_stream(run_id: str, *, after: int = 0, heartbeat: float | None = None) -> RunFollower:
    """A subscribed follower of `run_id` (the caller closes it with `__aexit__`); see `RunFollower`."""
    ensure_background()
    follower = RunFollower(run_id, after=after, heartbeat=heartbeat)
    await follower.__aenter__()
    return follower


async def open_chat(
    *, user: AbstractBaseUser, query: Any, session_id: Any = None, heartbeat: float | None = None
) -> RunFollower:
    """Start a chat (`start_chat`) and follow its run from the start: the follower subscribes before the
    run is launched in this process, so it cannot miss a frame."""
    ensure_background()
    run = await db(start_chat, user=user, query=query, session_id=session_id)
    follower = await open_stream(run.run_id, after=0, heartbeat=heartbeat)
    launch(run.run_id)
    return follower


async def find_run(
    *, user: AbstractBaseUser | AnonymousUser, run_id: Any, session_id: str | None = None
) -> DiagnosisRun:
    """The run the user may see (`selectors.get_visible_run`), else ChatRefused 404."""
    if not isinstance(run_id, str):
        raise _not_found()
    run = await db(get_visible_run, user=user, session_id=session_id, run_id=run_id)
    if run is None:
        raise _not_found()
    return run


async def cancel_run(
    *, user: AbstractBaseUser | AnonymousUser, run_id: Any, session_id: str | None = None
) -> tuple[str, str]:
    """Ask a visible run to stop (`supervisor.request_cancel`); returns its id and its status when the
    cancel was requested (a finished run is left as it is)."""
    run = await find_run(user=user, run_id=run_id, session_id=session_id)
    return run.run_id, await request_cancel(run.run_id)
