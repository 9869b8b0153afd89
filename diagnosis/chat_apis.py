"""Chat over Server-Sent Events, and cancel: three async Django views (one per operation).

* `POST /api/chat` — body `{"query": str (1..8000), "sessionId"?: str}` → `text/event-stream`: starts a
  run in this process and streams it like an attach from 0 (`run` first, `outcome` last).
* `GET /api/diagnosis/{sessionId}/runs/{runId}/events?after=N` → `text/event-stream`: the run's frames
  with timeline sequence > N from the database, then live until the outcome. A browser `EventSource`
  that reconnects sends `Last-Event-ID`, which counts like `after` (the larger wins).
* `POST /api/diagnosis/{sessionId}/runs/{runId}/cancel` → 202 `{"runId", "status"}` (the status when the
  cancel was requested; cancelling a finished run changes nothing and answers its final status).

Streams: `event:` is the frame type, `data:` one line of JSON with the contract's keys, `id:` the
timeline `sequenceNo` on frames that map to a timeline event (`run`, `tool`, `outcome`), a `retry:`
hint first and a `: keep-alive` comment every `CHAT_SSE_HEARTBEAT_SECONDS` (default 15) so proxies keep
idle streams open. Closing the stream stops following, never the run.

Authentication as for the REST API: `Authorization: Token <key>` (DRF token; the session is then not
consulted) or the session cookie, in which case unsafe methods need the CSRF token
(`X-CSRFToken` header), as DRF's session authentication requires. Errors before a stream starts are
JSON in the contract's shape (`config.api.json_error`): 400 `invalid_request`, 401
`not_authenticated`/`authentication_failed`, 403 `permission_denied` (CSRF), 404 `not_found` (also for
runs the user may not see), 405, 429 `too_many_active_runs` or `throttled` (more chats started than
`CHAT_THROTTLE_RATE` allows; `Retry-After` header, see `diagnosis.chat_throttle`).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.middleware.csrf import CsrfViewMiddleware
from django.views.decorators.csrf import csrf_exempt

from config.api import json_error
from diagnosis.chat_throttle import start_throttled_chat
from diagnosis.runtime.db import db
from diagnosis.runtime.live import LiveFrame, RunFollower, heartbeat_seconds, sse_event
from diagnosis.runtime.supervisor import (
    ChatRefused,
    ensure_background,
    launch,
    request_cancel,
    validate_after,
)
from diagnosis.selectors import get_visible_run

MAX_BODY_BYTES = 64 * 1024
RETRY_MS = 3000


# -------------------------------------------------------------------------------------------------
# Authentication (token or session + CSRF), as DRF does it, for async views
# -------------------------------------------------------------------------------------------------
class _CsrfCheck(CsrfViewMiddleware):
    def _reject(self, request, reason):
        return reason


def _csrf_failure(request: HttpRequest) -> str | None:
    check = _CsrfCheck(lambda req: None)
    check.process_request(request)
    return check.process_view(request, None, (), {})


async def _authenticate(request: HttpRequest):
    """(user, None) or (None, error response)."""
    header = request.META.get("HTTP_AUTHORIZATION", "")
    parts = header.split()
    if parts and parts[0].lower() == "token":
        from rest_framework.authtoken.models import Token

        key = parts[1] if len(parts) == 2 else ""
        token = await Token.objects.select_related("user").filter(key=key).afirst() if key else None
        if token is None or not token.user.is_active:
            response = json_error(401, "Invalid token.", "authentication_failed")
            response["WWW-Authenticate"] = "Token"
            return None, response
        return token.user, None
    user = await request.auser()
    if not user.is_authenticated or not user.is_active:
        response = json_error(401)
        response["WWW-Authenticate"] = "Token"
        return None, response
    if request.method not in ("GET", "HEAD", "OPTIONS", "TRACE"):
        reason = _csrf_failure(request)
        if reason:
            return None, json_error(403, f"CSRF Failed: {reason}", "permission_denied")
    return user, None


def _refused(refused: ChatRefused) -> JsonResponse:
    response = json_error(refused.status, refused.message, refused.code)
    if getattr(refused, "retry_after", None):
        response["Retry-After"] = str(refused.retry_after)
    return response


# -------------------------------------------------------------------------------------------------
# SSE encoding
# -------------------------------------------------------------------------------------------------
def encode_sse(live: LiveFrame) -> bytes:
    kind, data = sse_event(live.frame)
    lines = []
    if live.seq is not None:
        lines.append(f"id: {live.seq}")
    lines.append(f"event: {kind}")
    lines.append("data: " + json.dumps(data, ensure_ascii=False, separators=(",", ":")))
    return ("\n".join(lines) + "\n\n").encode("utf-8")


async def _sse(follower: RunFollower) -> AsyncIterator[bytes]:
    try:
        yield f"retry: {RETRY_MS}\n\n".encode()
        async for live in follower.frames():
            yield b": keep-alive\n\n" if live is None else encode_sse(live)
    finally:
        await follower.__aexit__(None, None, None)


def _stream(follower: RunFollower) -> StreamingHttpResponse:
    response = StreamingHttpResponse(_sse(follower), content_type="text/event-stream; charset=utf-8")
    response["Cache-Control"] = "no-cache, no-store"
    response["X-Accel-Buffering"] = "no"
    return response


# -------------------------------------------------------------------------------------------------
# Views
# -------------------------------------------------------------------------------------------------
@csrf_exempt
async def chat_stream(request: HttpRequest) -> HttpResponse:
    """`POST /api/chat`: start a run and stream it (see the module docstring)."""
    if request.method != "POST":
        response = json_error(405)
        response["Allow"] = "POST"
        return response
    user, failure = await _authenticate(request)
    if failure is not None:
        return failure
    if len(request.body) > MAX_BODY_BYTES:
        return json_error(413, f"The body must be at most {MAX_BODY_BYTES} bytes.")
    try:
        body = json.loads(request.body or b"null")
    except ValueError:
        return json_error(400, "The body must be a JSON object.")
    if not isinstance(body, dict):
        return json_error(400, "The body must be a JSON object.")
    ensure_background()
    try:
        run = await db(
            start_throttled_chat, user=user, query=body.get("query"), session_id=body.get("sessionId")
        )
    except ChatRefused as refused:
        return _refused(refused)
    follower = RunFollower(run.run_id, after=0, heartbeat=heartbeat_seconds())
    await follower.__aenter__()  # subscribed before the run can publish anything
    launch(run.run_id)
    return _stream(follower)


@csrf_exempt
async def run_events(request: HttpRequest, sessionId: str, runId: str) -> HttpResponse:
    """`GET /api/diagnosis/{sessionId}/runs/{runId}/events?after=N`: replay, then follow live."""
    if request.method not in ("GET", "HEAD"):
        response = json_error(405)
        response["Allow"] = "GET"
        return response
    user, failure = await _authenticate(request)
    if failure is not None:
        return failure
    try:
        after = validate_after(request.GET.get("after"))
        last_event_id = request.META.get("HTTP_LAST_EVENT_ID")
        if last_event_id:
            after = max(after, validate_after(last_event_id.strip()))
    except ChatRefused as refused:
        return _refused(refused)
    run = await db(get_visible_run, user=user, session_id=sessionId, run_id=runId)
    if run is None:
        return json_error(404)
    ensure_background()
    follower = RunFollower(run.run_id, after=after, heartbeat=heartbeat_seconds())
    await follower.__aenter__()
    return _stream(follower)


@csrf_exempt
async def cancel_run(request: HttpRequest, sessionId: str, runId: str) -> HttpResponse:
    """`POST /api/diagnosis/{sessionId}/runs/{runId}/cancel` → 202 `{"runId", "status"}`."""
    if request.method != "POST":
        response = json_error(405)
        response["Allow"] = "POST"
        return response
    user, failure = await _authenticate(request)
    if failure is not None:
        return failure
    run = await db(get_visible_run, user=user, session_id=sessionId, run_id=runId)
    if run is None:
        return json_error(404)
    status = await request_cancel(run.run_id)
    return JsonResponse({"runId": run.run_id, "status": status}, status=202)
