"""Rate limits: chat starts over SSE and WebSocket share one per-user budget (`CHAT_THROTTLE_RATE`);
over it, `POST /api/chat` answers 429 `throttled` with `Retry-After` and the `chat` frame an `error`
frame, nothing is created, and another user keeps their own budget; the budget comes back when the
window has passed. The reasoning endpoint's throttle is proven by
tests/surfaces/api/test_errors.py::test_reasoning_reads_are_throttled_per_user.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import AsyncClient

from config.asgi import application
from diagnosis.models import DiagnosisRun
from surfaces.chat.throttle import ChatRateThrottle
from tests.factories import issue_token
from tests.surfaces.chat.support import owned_runs, parse_sse

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.asyncio,
    pytest.mark.usefixtures("stop_chat_background"),
]

TIMEOUT = 15


@pytest.fixture(autouse=True)
def throttle_settings(chat_settings):
    settings = chat_settings
    settings.CHAT_THROTTLE_RATE = "3/min"
    settings.CHAT_MAX_ACTIVE_RUNS_PER_USER = 10  # the rate, not the concurrency limit, is under test
    return settings


async def _token(user) -> str:
    return await sync_to_async(issue_token)(user)


async def _post_chat(key: str, query: str):
    return await AsyncClient().post(
        "/api/chat",
        data=json.dumps({"query": query}),
        content_type="application/json",
        headers={"Authorization": f"Token {key}"},
    )


async def _read_to_outcome(response) -> list:
    text = ""
    iterator = aiter(response.streaming_content)
    while True:
        text += (await asyncio.wait_for(anext(iterator), TIMEOUT)).decode()
        events, _ = parse_sse(text)
        if events and events[-1].event == "outcome":
            await iterator.aclose()
            return events


async def _settle() -> None:
    for task in list(owned_runs().values()):
        await asyncio.wait_for(asyncio.shield(task), TIMEOUT)


async def _ws(user) -> WebsocketCommunicator:
    comm = WebsocketCommunicator(application, "/ws/chat/", headers=[(b"origin", b"http://127.0.0.1")])
    comm.scope["user"] = user
    connected, _ = await comm.connect(timeout=TIMEOUT)
    assert connected
    return comm


async def _ws_chat(comm, query: str) -> dict:
    await comm.send_json_to({"type": "chat", "query": query})
    while True:
        frame = await comm.receive_json_from(timeout=TIMEOUT)
        if frame["type"] in ("outcome", "error"):
            return frame


async def test_chat_starts_over_sse_and_websocket_share_one_budget_per_user(user, other_user, monkeypatch):
    key = await _token(user)
    for query in ("first", "second"):
        response = await _post_chat(key, query)
        assert response.status_code == 200
        assert (await _read_to_outcome(response))[-1].data["status"] == "SUCCESS"
    comm = await _ws(user)
    assert (await _ws_chat(comm, "third"))["type"] == "outcome"

    # The fourth start in the minute, whichever transport: refused, nothing created.
    refused = await _post_chat(key, "fourth")
    assert refused.status_code == 429 and int(refused["Retry-After"]) > 0
    assert (
        refused.json() == {"error": {"code": "throttled", "message": refused.json()["error"]["message"]}}
        and "try again in" in refused.json()["error"]["message"]
    )
    frame = await _ws_chat(comm, "fifth")
    assert frame["type"] == "error" and frame["code"] == "throttled"
    # Refusals are not counted and nothing was created by them; the socket stays usable.
    await comm.send_json_to({"type": "attach", "runId": "run_nope"})
    assert (await comm.receive_json_from(timeout=TIMEOUT))["code"] == "not_found"
    await _settle()
    assert await DiagnosisRun.objects.filter(session__owner=user).acount() == 3

    # Another user has a budget of their own.
    other = await _post_chat(await _token(other_user), "mine")
    assert other.status_code == 200
    await _read_to_outcome(other)

    # A minute later the budget is back.
    later = time.time() + 61
    monkeypatch.setattr(ChatRateThrottle, "timer", lambda self: later)
    assert (await _ws_chat(comm, "after a minute"))["type"] == "outcome"
    await comm.disconnect()
    await _settle()
    assert await DiagnosisRun.objects.filter(session__owner=user).acount() == 4


async def test_an_empty_rate_turns_the_chat_throttle_off(user, chat_settings):
    chat_settings.CHAT_THROTTLE_RATE = ""
    key = await _token(user)
    for i in range(5):
        response = await _post_chat(key, f"question {i}")
        assert response.status_code == 200
        await _read_to_outcome(response)
    await _settle()
