"""Chat over Server-Sent Events and the cancel endpoint, read from the real stream of the async views
(Django's async test client iterates the streaming response exactly as the ASGI handler does)."""

from __future__ import annotations

import asyncio
import datetime as dt
import threading

import pytest
from asgiref.sync import sync_to_async
from django.test import AsyncClient
from rest_framework.authentication import SessionAuthentication

from agent.runtime import supervisor
from agent.runtime.events import timestamp
from audit.models import EventType, TraceEvent
from core.api import NOT_FOUND_RUN, NOT_FOUND_SESSION
from diagnosis.models import DiagnosisRun, RunStatus
from surfaces.answers import render_answer
from surfaces.api.authentication import ApiTokenAuthentication
from tests.agent.secrets_corpus import AWS_KEY_ID
from tests.factories import make_recorded_run
from tests.surfaces.chat.support import assert_frame_keys, parse_sse
from tests.surfaces.chat.transports import TIMEOUT, TokenClient
from tests.surfaces.chat.transports import post_chat as _post_chat
from tests.surfaces.chat.transports import settle as _settle
from tests.surfaces.chat.transports import sse_read as _read
from tests.surfaces.chat.transports import token_client as _token_client

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.asyncio,
    pytest.mark.usefixtures("chat_settings", "stop_chat_background"),
]


# -------------------------------------------------------------------------------------------------
# POST /api/chat
# -------------------------------------------------------------------------------------------------
async def test_post_chat_streams_the_run_with_ids(user, knowledge):
    client = await _token_client(user)
    response = await _post_chat(client, {"query": "Disk full on /var/log, what should I check?"})
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/event-stream")
    assert response["Cache-Control"].startswith("no-cache")
    text, events = await _read(response)
    assert text.startswith("retry: 3000\n\n")
    assert events[0].event == "run" and events[-1].event == "outcome"
    for event in events:
        assert_frame_keys(event.event, set(event.data), websocket=False)
    run_id = events[0].data["runId"]
    await _settle(run_id)
    seqs = {
        e.sequence_no: e.event_type
        async for e in TraceEvent.objects.filter(run_id=run_id).only("sequence_no", "event_type")
    }
    mapping = {
        "run": {EventType.RUN_STARTED},
        "tool": {EventType.TOOL_INVOCATION},
        "outcome": {EventType.RUN_FINISHED},
        "progress": {
            EventType.ROUTING_DECISION,
            EventType.AGENT_MODEL_STEP,
            EventType.EVIDENCE_GUARD_INITIAL,
            EventType.SEMANTIC_GUARD_DECISION,
            EventType.RELEASE_DECISION,
        },
    }
    for event in events:
        if event.event == "progress" and event.data["status"] == "STARTED":
            assert event.id is None and event.data["sequenceNo"] is None  # live only, not a timeline event
        elif event.event in mapping:
            assert seqs[event.id] in mapping[event.event], event
            if event.event == "progress":
                assert event.data["sequenceNo"] == event.id
        else:
            assert event.id is None
    ids = [e.id for e in events if e.id is not None]
    assert ids == sorted(ids)
    run = await DiagnosisRun.objects.aget(run_id=run_id)
    assert events[-1].data == {
        "runId": run_id,
        "status": run.status,
        "releaseDecision": run.release_decision,
        "content": run.content,
        "contentHtml": str(render_answer(run.content)),
    }
    assert events[0].data == {
        "sessionId": run.session_id,
        "runId": run_id,
        "demo": True,  # the demo model
        "query": run.query,  # as stored
        "askedAt": timestamp(run.created_at),
    }


async def test_the_run_frame_carries_the_stored_question_and_replays_carry_their_times(user, settings):
    """The page replaces what the reader pasted with the question as stored (redacted) from the first
    frame, and draws a replay's stages at their recorded times (issue 50)."""
    settings.REDACTION_HMAC_KEY = "chat-frame-key-0123456789abcdef0123456789"
    client = await _token_client(user)
    text, events = await _read(await _post_chat(client, {"query": f"nginx fails, key {AWS_KEY_ID} leaked"}))
    run_id = events[0].data["runId"]
    await _settle(run_id)
    run = await DiagnosisRun.objects.aget(run_id=run_id)
    assert events[0].data["query"] == run.query and "[REDACTED:aws-access-key#1]" in run.query
    assert AWS_KEY_ID not in text  # the secret is never echoed back

    url = f"/api/diagnosis/{run.session_id}/runs/{run_id}/events"
    replay_text, replay = await _read(await client.get(url), until_outcome=False)
    assert AWS_KEY_ID not in replay_text and replay[0].data["query"] == run.query
    asked = dt.datetime.fromisoformat(replay[0].data["askedAt"])
    assert asked == run.created_at.replace(microsecond=run.created_at.microsecond // 1000 * 1000)
    recorded = {
        e.sequence_no: e.created_at
        async for e in TraceEvent.objects.filter(run_id=run_id).only("sequence_no", "created_at")
    }
    timed = [e for e in replay if e.event in ("progress", "tool")]
    assert timed and all(timestamp(recorded[e.id]) == e.data["at"] for e in timed)
    assert all(dt.datetime.fromisoformat(e.data["at"]) >= asked for e in timed)


async def test_post_chat_continues_a_session(user):
    client = await _token_client(user)
    _, first = await _read(await _post_chat(client, {"query": "hello"}))
    session_id = first[0].data["sessionId"]
    _, second = await _read(await _post_chat(client, {"query": "thanks", "sessionId": session_id}))
    assert second[0].data["sessionId"] == session_id
    await _settle(second[0].data["runId"])
    assert await DiagnosisRun.objects.filter(session_id=session_id).acount() == 2


async def test_post_chat_refusals_are_json_errors(user, other_user, chat_settings):
    client = await _token_client(user)
    theirs = await sync_to_async(make_recorded_run)(other_user)
    cases = [
        ({"query": ""}, 400, "invalid_request"),
        ({"query": "  \n "}, 400, "invalid_request"),
        ({"query": "x" * 8001}, 400, "invalid_request"),
        ({"query": ["not", "text"]}, 400, "invalid_request"),
        ({"query": "hi", "sessionId": theirs.session_id}, 404, "not_found"),
        ({"query": "hi", "sessionId": "s" * 65}, 400, "invalid_request"),
    ]
    for body, status, code in cases:
        response = await _post_chat(client, body)
        assert response.status_code == status, body
        assert response.json()["error"]["code"] == code
        if status == 404:  # the REST API's text for a session one may not see
            assert response.json()["error"]["message"] == NOT_FOUND_SESSION
    response = await client.post("/api/chat", data="{nope", content_type="application/json")
    assert response.status_code == 400 and set(response.json()["error"]) == {"code", "message"}
    assert (await client.get("/api/chat")).status_code == 405
    assert (
        await AsyncClient().post("/api/chat", data="{}", content_type="application/json")
    ).status_code == 401
    bad = TokenClient("nope")
    response = await _post_chat(bad, {"query": "hi"})
    assert response.status_code == 401 and response.json()["error"]["code"] == "authentication_failed"
    # Exactly 8000 characters is allowed.
    ok = await _post_chat(client, {"query": "y" * 8000})
    assert ok.status_code == 200
    _, events = await _read(ok)
    await _settle(events[0].data["runId"])
    assert await DiagnosisRun.objects.filter(session__owner=user).acount() == 1


async def test_session_authentication_needs_the_csrf_token(user):
    client = AsyncClient(enforce_csrf_checks=True)
    await client.aforce_login(user)
    page = await client.get("/chat/")
    assert page.status_code == 200
    csrf = page.cookies["csrftoken"].value
    refused = await _post_chat(client, {"query": "hello"})
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "permission_denied"
    accepted = await _post_chat(client, {"query": "hello"}, headers={"X-CSRFToken": csrf})
    assert accepted.status_code == 200
    _, events = await _read(accepted)
    await _settle(events[0].data["runId"])


async def test_authentication_is_drf_s_on_the_runtime_database_pool(user, monkeypatch):
    """Token and session are checked by DRF's own authenticators, and on the bounded runtime pool."""
    threads: list[str] = []

    def spy(cls):
        original = cls.authenticate

        def authenticate(self, request):
            threads.append(threading.current_thread().name)
            return original(self, request)

        monkeypatch.setattr(cls, "authenticate", authenticate)

    spy(ApiTokenAuthentication)
    spy(SessionAuthentication)
    run = await sync_to_async(make_recorded_run)(user)
    url = f"/api/diagnosis/{run.session_id}/runs/{run.run_id}/cancel"
    assert (await (await _token_client(user)).post(url)).status_code == 202
    session_client = AsyncClient()
    await session_client.aforce_login(user)
    assert (await session_client.post(url)).status_code == 202  # the test client skips CSRF checks
    assert len(threads) == 3  # token; token (no header), then session
    assert all(name.startswith("runtime-db") for name in threads), threads


async def test_active_run_limit_answers_429(user, chat_settings, llm_server):
    chat_settings.CHAT_MAX_ACTIVE_RUNS_PER_USER = 1
    llm_server.provider.delay = 0.2
    llm_server.provider.pieces = 10
    client = await _token_client(user)
    first = await _post_chat(client, {"query": "one"})
    assert first.status_code == 200
    _, events = await _read(first, stop_after=lambda ev: any(e.event == "run" for e in ev))
    refused = await _post_chat(client, {"query": "two"})
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "too_many_active_runs"
    run_id = events[0].data["runId"]
    await client.post(f"/api/diagnosis/{events[0].data['sessionId']}/runs/{run_id}/cancel")
    await _settle(run_id)


# -------------------------------------------------------------------------------------------------
# GET …/events?after=N
# -------------------------------------------------------------------------------------------------
async def test_events_replays_a_finished_run_after_n_and_closes(user):
    run = await sync_to_async(make_recorded_run)(user, tools=2)
    client = await _token_client(user)
    url = f"/api/diagnosis/{run.session_id}/runs/{run.run_id}/events"
    _, full = await _read(await client.get(url), until_outcome=False)
    assert [e.event for e in full if e.event != "progress"] == [
        "run",
        "tool",
        "tool",
        "tool",
        "tool",
        "outcome",
    ]
    assert [e.data["stage"] for e in full if e.event == "progress"] == [
        "ROUTING",
        "MODEL_STEP",
        "MODEL_STEP",
        "EVIDENCE_GUARD",
        "SEMANTIC_GUARD",
        "RELEASE",
    ]
    cut = full[4].id
    _, rest = await _read(await client.get(url, {"after": cut}), until_outcome=False)
    assert [(e.event, e.id) for e in rest] == [(e.event, e.id) for e in full if e.id > cut]
    # An EventSource reconnecting sends Last-Event-ID; the larger of it and `after` wins.
    _, resumed = await _read(
        await client.get(url, {"after": 0}, headers={"Last-Event-ID": str(cut)}), until_outcome=False
    )
    assert [e.id for e in resumed] == [e.id for e in rest]
    _, nothing = await _read(await client.get(url, {"after": full[-1].id}), until_outcome=False)
    assert nothing == []


async def test_events_refusals(user, other_user):
    mine = await sync_to_async(make_recorded_run)(user)
    theirs = await sync_to_async(make_recorded_run)(other_user)
    client = await _token_client(user)
    invisible = await client.get(f"/api/diagnosis/{theirs.session_id}/runs/{theirs.run_id}/events")
    # The REST API's body for a run one may not see, word for word (core.api.NOT_FOUND_RUN).
    assert invisible.status_code == 404
    assert invisible.json() == {"error": {"code": "not_found", "message": NOT_FOUND_RUN}}
    # A run under the wrong session is 404 too, exactly like a missing one.
    assert (
        await client.get(f"/api/diagnosis/{theirs.session_id}/runs/{mine.run_id}/events")
    ).status_code == 404
    assert (await client.get(f"/api/diagnosis/{mine.session_id}/runs/run_missing/events")).status_code == 404
    url = f"/api/diagnosis/{mine.session_id}/runs/{mine.run_id}/events"
    for after in ("abc", "-1", "1.5"):
        response = await client.get(url, {"after": after})
        assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_request"
    assert (await AsyncClient().get(url)).status_code == 401
    assert (await client.post(url)).status_code == 405


async def test_events_follow_a_live_run_with_heartbeats(user, chat_settings, llm_server, knowledge):
    chat_settings.CHAT_SSE_HEARTBEAT_SECONDS = 0.05
    llm_server.provider.delay = 0.15
    llm_server.provider.pieces = 6
    client = await _token_client(user)
    started = await _post_chat(client, {"query": "Replication lag on db-3"})
    _, head = await _read(started, stop_after=lambda ev: any(e.event == "tool" for e in ev))
    run = head[0].data
    text, events = await _read(
        await client.get(f"/api/diagnosis/{run['sessionId']}/runs/{run['runId']}/events")
    )
    assert ": keep-alive\n\n" in text
    assert events[0].event == "run" and events[-1].event == "outcome"
    assert events[-1].data["status"] == "SUCCESS"
    await _settle(run["runId"])


# -------------------------------------------------------------------------------------------------
# POST …/cancel
# -------------------------------------------------------------------------------------------------
async def test_cancel_endpoint_stops_a_running_run(user, other_user, llm_server):
    llm_server.provider.delay = 0.3
    llm_server.provider.pieces = 20
    client = await _token_client(user)
    response = await _post_chat(client, {"query": "Replication lag on db-3"})
    _, head = await _read(
        response, stop_after=lambda ev: any(e.data.get("stage") == "MODEL_STEP" for e in ev[1:])
    )
    run = head[0].data
    url = f"/api/diagnosis/{run['sessionId']}/runs/{run['runId']}/cancel"
    other = await _token_client(other_user)
    assert (await other.post(url)).status_code == 404
    accepted = await client.post(url)
    assert accepted.status_code == 202
    assert accepted.json() == {"runId": run["runId"], "status": "RUNNING"}
    _, tail = await _read(
        await client.get(
            f"/api/diagnosis/{run['sessionId']}/runs/{run['runId']}/events", {"after": head[0].id}
        )
    )
    assert tail[-1].event == "outcome" and tail[-1].data["status"] == "CANCELLED"
    await _settle(run["runId"])
    row = await DiagnosisRun.objects.aget(run_id=run["runId"])
    assert row.status == RunStatus.CANCELLED and row.release_decision is None
    # Cancelling a finished run changes nothing and says how it ended.
    again = await client.post(url)
    assert again.status_code == 202 and again.json() == {"runId": run["runId"], "status": "CANCELLED"}
    assert (await client.get(url)).status_code == 405
    assert (await AsyncClient().post(url)).status_code == 401


async def test_the_served_schema_describes_the_chat_endpoints(user):
    client = await _token_client(user)
    schema = (await client.get("/api/schema/", headers={"Accept": "application/json"})).json()
    paths = schema["paths"]
    assert "post" in paths["/api/chat"]
    assert "get" in paths["/api/diagnosis/{sessionId}/runs/{runId}/events"]
    cancel = paths["/api/diagnosis/{sessionId}/runs/{runId}/cancel"]["post"]
    assert set(cancel["responses"]) >= {"202", "401", "404"}
    components = schema["components"]["schemas"]
    assert set(components["ChatOutcomeEvent"]["properties"]) == {
        "runId",
        "status",
        "releaseDecision",
        "content",
        "contentHtml",
    }
    assert set(components["ChatToolEvent"]["properties"]) == {"toolCallId", "name", "status", "at"}
    progress = components["ChatProgressEvent"]
    assert set(progress["required"]) == {"stage", "status", "sequenceNo"}
    assert progress["properties"]["stage"]["enum"] == [
        "ROUTING", "MODEL_STEP", "TOOL", "EVIDENCE_GUARD", "SEMANTIC_GUARD", "RELEASE", "APPROVAL",
        "REDACTION",
    ]  # fmt: skip
    assert set(components["ChatDraftEvent"]["properties"]) == {"text"}
    assert "ChatDeltaEvent" not in components
    assert set(components["CancelAccepted"]["properties"]) == {"runId", "status"}
    assert set(components["ChatRequest"]["properties"]) == {"query", "sessionId"}


async def test_cancel_during_a_slow_tool_streams_interrupted_with_ids(user, llm_server, monkeypatch):
    from agent.runtime.tools.registry import default_registry

    async def slow_probe(seconds: float = 30.0):
        await asyncio.sleep(seconds)
        return {"slept": seconds}

    registry = default_registry().copy()
    registry.tool(
        name="slow_probe",
        description="Waits (a stand-in for a slow diagnostic command).",
        parameters={"type": "object", "properties": {"seconds": {"type": "number"}}},
        timeout=60,
    )(slow_probe)
    execute_run = supervisor.execute_run

    async def execute_with_slow_tool(**kwargs):
        return await execute_run(registry=registry, **kwargs)

    monkeypatch.setattr(supervisor, "execute_run", execute_with_slow_tool)
    llm_server.provider.tools = (("slow_probe", {"seconds": 30}),)
    client = await _token_client(user)
    response = await _post_chat(client, {"query": "Run the slow probe on db-3"})
    iterator = aiter(response.streaming_content)
    text = ""
    while not any(e.event == "tool" for e in parse_sse(text)[0]):
        text += (await asyncio.wait_for(anext(iterator), TIMEOUT)).decode()
    run = parse_sse(text)[0][0].data
    cancel = await client.post(f"/api/diagnosis/{run['sessionId']}/runs/{run['runId']}/cancel")
    assert cancel.status_code == 202
    while not text.rstrip().endswith("}") or "event: outcome" not in text:
        text += (await asyncio.wait_for(anext(iterator), TIMEOUT)).decode()
    await iterator.aclose()
    events, _ = parse_sse(text)
    await _settle(run["runId"])
    tools = [(e.data["status"], e.id) for e in events if e.event == "tool"]
    assert [status for status, _ in tools] == ["RUNNING", "INTERRUPTED"]
    interrupted = await TraceEvent.objects.aget(run_id=run["runId"], status="INTERRUPTED")
    assert tools[1][1] == interrupted.sequence_no
    assert events[-1].event == "outcome" and events[-1].data["status"] == "CANCELLED"
