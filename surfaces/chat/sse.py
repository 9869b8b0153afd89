"""Chat over Server-Sent Events, and cancel: three async Django views (one per operation).

`POST /api/chat` starts a run and streams it; `GET …/runs/{runId}/events?after=N` replays the run's
frames after N (or `Last-Event-ID`), then follows it live until the outcome; `POST …/runs/{runId}/cancel`
answers 202 with the status when asked. Closing a stream stops following, never the run. They are not
`core.api.ApiView`s (DRF has no async views, and a stream must not hold a thread) but keep its rules:
authentication first (`surfaces.chat.auth`), then 400, then one 404 for unseen and missing runs, every
error in the contract's shape. The chat service and the frames are `surfaces.chat.service`/`protocol`.
Details: docs/chat.md, *Server-Sent Events*.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import wraps

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

from agent.runtime.live import RunFollower
from core.api import json_error
from core.parsers import content_type_refusal
from surfaces.chat import service
from surfaces.chat.auth import authenticate_http
from surfaces.chat.protocol import SSE_KEEP_ALIVE, SSE_RETRY, ChatRefused, sse_message

MAX_BODY_BYTES = 64 * 1024


def heartbeat_seconds() -> float:
    """Seconds between SSE keep-alive comments (`CHAT_SSE_HEARTBEAT_SECONDS`, default 15)."""
    return float(settings.CHAT_SSE_HEARTBEAT_SECONDS)


def _refused(refused: ChatRefused) -> JsonResponse:
    response = json_error(refused.status, refused.message, refused.code)
    if refused.retry_after:
        response["Retry-After"] = str(refused.retry_after)
    return response


def chat_view(*methods: str):
    """An async chat view: other methods answer 405 with `Allow`; then DRF's authentication
    (`chat.auth.authenticate_http`); the view gets the user, and a `ChatRefused` it raises becomes the
    contract's JSON error. CSRF is DRF's session check, not Django's middleware (token requests need none)."""

    def decorate(view: Callable[..., Awaitable[HttpResponse]]):
        @csrf_exempt
        @wraps(view)
        async def wrapped(request: HttpRequest, *args, **kwargs) -> HttpResponse:
            if request.method not in methods:
                response = json_error(405)
                response["Allow"] = methods[0]
                return response
            user, failure = await authenticate_http(request)
            if failure is not None:
                return failure
            try:
                return await view(request, user, *args, **kwargs)
            except ChatRefused as refused:
                return _refused(refused)

        return wrapped

    return decorate


async def _sse(follower: RunFollower) -> AsyncIterator[bytes]:
    try:
        yield SSE_RETRY
        async for event in follower.frames():
            yield SSE_KEEP_ALIVE if event is None else sse_message(event)
    finally:
        await follower.__aexit__(None, None, None)


def _stream(follower: RunFollower) -> StreamingHttpResponse:
    response = StreamingHttpResponse(_sse(follower), content_type="text/event-stream; charset=utf-8")
    response["Cache-Control"] = "no-cache, no-store"
    response["X-Accel-Buffering"] = "no"
    return response


@chat_view("POST")
async def chat_stream(request: HttpRequest, user) -> HttpResponse:
    """`POST /api/chat`: start a run and stream it (see the module docstring)."""
    if len(request.body) > MAX_BODY_BYTES:
        return json_error(413, f"The body must be at most {MAX_BODY_BYTES} bytes.")
    refused = content_type_refusal(request.headers.get("Content-Type"), ("application/json",))
    if refused:
        return json_error(415, refused)
    charset = request.content_params.get("charset") or "utf-8"  # a known codec: checked just above
    try:
        body = json.loads(request.body.decode(charset) if request.body else "null")
    except ValueError:  # not JSON, or not in the declared charset (UnicodeDecodeError)
        return json_error(400, "The body must be a JSON object.")
    if not isinstance(body, dict):
        return json_error(400, "The body must be a JSON object.")
    follower = await service.open_chat(
        user=user, query=body.get("query"), session_id=body.get("sessionId"), heartbeat=heartbeat_seconds()
    )
    return _stream(follower)


@chat_view("GET", "HEAD")
async def run_events(request: HttpRequest, user, sessionId: str, runId: str) -> HttpResponse:
    """`GET /api/diagnosis/{sessionId}/runs/{runId}/events?after=N`: replay, then follow live."""
    after = service.validate_after(request.GET.get("after"))
    last_event_id = request.META.get("HTTP_LAST_EVENT_ID")
    if last_event_id:
        after = max(after, service.validate_after(last_event_id.strip()))
    run = await service.find_run(user=user, session_id=sessionId, run_id=runId)
    return _stream(await service.open_stream(run.run_id, after=after, heartbeat=heartbeat_seconds()))


@chat_view("POST")
async def cancel_run(request: HttpRequest, user, sessionId: str, runId: str) -> HttpResponse:
    """`POST /api/diagnosis/{sessionId}/runs/{runId}/cancel` → 202 `{"runId", "status"}`."""
    run_id, status = await service.cancel_run(user=user, session_id=sessionId, run_id=runId)
    return JsonResponse({"runId": run_id, "status": status}, status=202)
