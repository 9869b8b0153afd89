"""The chat WebSocket through the real ASGI application (`config.asgi.application`), with
`channels.testing.WebsocketCommunicator` and the in-memory channel layer: every frame and failure.

Runs execute for real: the offline demo model, or the local OpenAI-compatible fake server driven by
the real `openai` SDK (slow scripted streams, so there is time to cancel and reattach).
"""

from __future__ import annotations

import asyncio
import json

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator

from agent.runtime import supervisor
from agent.runtime.events import CHAT_TIMELINE_TYPES
from agent.runtime.tools.registry import default_registry
from audit.models import EventType, ToolInvocation, ToolStatus, TraceEvent
from audit.read import get_trace
from config.asgi import application
from core.api import NOT_FOUND_RUN
from diagnosis.models import DiagnosisRun, RunStatus
from tests.factories import REASONING_MARKER, issue_token, make_recorded_run
from tests.surfaces.chat.support import assert_frame_keys, owned_runs, text_before_release
from tests.surfaces.chat.transports import ORIGIN, TIMEOUT
from tests.surfaces.chat.transports import ws_connect as _connect
from tests.surfaces.chat.transports import ws_frames_until_outcome as _frames_until_outcome

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.asyncio,
    pytest.mark.usefixtures("chat_settings", "stop_chat_background"),
]


async def _login(client_user) -> list[tuple[bytes, bytes]]:
    """A real session cookie for `client_user` (through Django's login)."""
    from django.test import AsyncClient

    client = AsyncClient()
    await client.aforce_login(client_user)
    cookie = client.cookies["sessionid"].value
    return [ORIGIN, (b"cookie", f"sessionid={cookie}".encode())]


async def _wait_run_finished(run_id: str) -> None:
    task = owned_runs().get(run_id)
    if task is not None:
        await asyncio.wait_for(asyncio.shield(task), TIMEOUT)


async def _stop(comm: WebsocketCommunicator) -> None:
    await comm.disconnect()
    await supervisor.stop_background()


# -------------------------------------------------------------------------------------------------
# Authentication and origin
# -------------------------------------------------------------------------------------------------
async def test_anonymous_connection_is_closed_with_4401():
    comm = await _connect()
    assert await comm.receive_output(timeout=TIMEOUT) == {"type": "websocket.close", "code": 4401}


async def test_session_cookie_authenticates_and_a_foreign_origin_is_refused(user):
    headers = await _login(user)
    comm = await _connect(headers=headers)
    await comm.send_to(text_data="{}")
    assert (await comm.receive_json_from(timeout=TIMEOUT))["code"] == "unknown_type"
    await _stop(comm)

    evil = WebsocketCommunicator(
        application, "/ws/chat/", headers=[(b"origin", b"http://evil.example"), headers[1]]
    )
    connected, _ = await evil.connect(timeout=TIMEOUT)
    assert not connected  # refused during the handshake (cross-site WebSocket hijacking)
    no_origin = WebsocketCommunicator(application, "/ws/chat/", headers=[headers[1]])
    connected, _ = await no_origin.connect(timeout=TIMEOUT)
    assert not connected  # a cookie without Origin is not accepted


async def test_token_header_authenticates_scripts_without_origin(user):
    token = await sync_to_async(issue_token)(user)
    comm = await _connect(headers=[(b"authorization", f"Token {token}".encode())])
    await comm.send_to(text_data=json.dumps({"type": "attach", "runId": "run_nope"}))
    assert await comm.receive_json_from(timeout=TIMEOUT) == {
        "type": "error",
        "code": "not_found",
        "message": NOT_FOUND_RUN,
    }
    await _stop(comm)
    bad = await _connect(headers=[(b"authorization", b"Token not-a-real-key")])
    assert await bad.receive_output(timeout=TIMEOUT) == {"type": "websocket.close", "code": 4401}


# -------------------------------------------------------------------------------------------------
# Malformed input: an error frame, and the socket stays usable
# -------------------------------------------------------------------------------------------------
async def test_malformed_oversized_binary_and_unknown_frames_get_errors(user):
    comm = await _connect(user)
    cases = [
        ({"text_data": "{not json"}, "malformed_frame"),
        ({"text_data": "[1, 2]"}, "malformed_frame"),
        ({"bytes_data": b"\x00\x01"}, "malformed_frame"),
        ({"text_data": json.dumps({"type": "chat", "query": "x" * (64 * 1024)})}, "frame_too_large"),
        ({"text_data": json.dumps({"type": "dance"})}, "unknown_type"),
        ({"text_data": json.dumps({"query": "no type"})}, "unknown_type"),
        ({"text_data": json.dumps({"type": "chat", "query": ""})}, "invalid_request"),
        ({"text_data": json.dumps({"type": "chat", "query": "   "})}, "invalid_request"),
        ({"text_data": json.dumps({"type": "chat", "query": "q" * 8001})}, "invalid_request"),
        ({"text_data": json.dumps({"type": "chat", "query": 42})}, "invalid_request"),
        ({"text_data": json.dumps({"type": "chat", "query": "hi", "sessionId": "ses_nope"})}, "not_found"),
        ({"text_data": json.dumps({"type": "attach", "runId": "run_x", "after": -1})}, "invalid_request"),
        ({"text_data": json.dumps({"type": "attach", "runId": "run_x", "after": "3"})}, "invalid_request"),
        ({"text_data": json.dumps({"type": "cancel", "runId": 7})}, "not_found"),
    ]
    for payload, code in cases:
        await comm.send_to(**payload)
        frame = await comm.receive_json_from(timeout=TIMEOUT)
        assert frame["type"] == "error" and frame["code"] == code, (payload, frame)
        assert_frame_keys("error", set(frame), websocket=True)
    # Still usable: a real question after all that.
    assert await sync_to_async(DiagnosisRun.objects.count)() == 0
    await comm.send_json_to({"type": "chat", "query": "hello there"})
    frames = await _frames_until_outcome(comm)
    assert frames[0]["type"] == "run" and frames[-1]["status"] == "SUCCESS"
    await _stop(comm)


async def test_runs_of_other_users_are_not_found(user, other_user):
    theirs = await sync_to_async(make_recorded_run)(other_user)
    comm = await _connect(user)
    for frame in ({"type": "attach", "runId": theirs.run_id}, {"type": "cancel", "runId": theirs.run_id}):
        await comm.send_json_to(frame)
        assert (await comm.receive_json_from(timeout=TIMEOUT))["code"] == "not_found"
    await comm.send_json_to({"type": "chat", "query": "hi", "sessionId": theirs.session_id})
    assert (await comm.receive_json_from(timeout=TIMEOUT))["code"] == "not_found"
    await _stop(comm)


async def test_staff_may_attach_to_any_run(user, staff_user):
    run = await sync_to_async(make_recorded_run)(user)
    comm = await _connect(staff_user)
    await comm.send_json_to({"type": "attach", "runId": run.run_id})
    frames = await _frames_until_outcome(comm)
    assert [f["type"] for f in frames if f["type"] != "progress"] == ["run", *["tool"] * 4, "outcome"]
    assert next(f["stage"] for f in frames if f["type"] == "progress") == "ROUTING"
    await _stop(comm)


# -------------------------------------------------------------------------------------------------
# A real run: order of frames, what they carry, and a complete audit
# -------------------------------------------------------------------------------------------------
async def test_chat_streams_run_progress_tools_and_outcome_in_order(user, knowledge):
    comm = await _connect(user)
    await comm.send_json_to({"type": "chat", "query": "Disk full on /var/log, what should I check?"})
    frames = await _frames_until_outcome(comm)
    await _stop(comm)
    kinds = [f["type"] for f in frames]
    assert kinds[0] == "run" and kinds[-1] == "outcome"
    run_id = frames[0]["runId"]
    assert all(f.get("runId", run_id) == run_id for f in frames)
    assert "progress" in kinds and "tool" in kinds and "draft" not in kinds
    stages = [(f["stage"], f["status"]) for f in frames if f["type"] == "progress"]
    assert stages[0] == ("ROUTING", "STARTED") and stages[-1] == ("RELEASE", "FINISHED")
    assert kinds.index("tool") < kinds.index("outcome")
    tools = [f for f in frames if f["type"] == "tool"]
    by_call: dict[str, list[str]] = {}
    for f in tools:
        by_call.setdefault(f["toolCallId"], []).append(f["status"])
    assert all(statuses == ["RUNNING", "SUCCEEDED"] for statuses in by_call.values()), by_call
    outcome = frames[-1]
    run = await DiagnosisRun.objects.aget(run_id=run_id)
    assert (outcome["status"], outcome["releaseDecision"], outcome["content"]) == (
        run.status,
        run.release_decision,
        run.content,
    )
    assert run.status == RunStatus.SUCCESS
    # Verified release (the default): the outcome is the first frame that carries answer text.
    assert text_before_release(frames, content=run.content) == []
    assert run.release_mode == "verified" and run.draft_chars == 0
    # Nothing private: no reasoning, no tool input or output.
    wire = json.dumps(frames)
    tool_rows = [t async for t in ToolInvocation.objects.filter(run_id=run_id)]
    assert REASONING_MARKER not in wire
    for row in tool_rows:
        assert row.output_preview[:80] not in wire
        assert json.dumps(row.input_params)[1:-1] not in wire
    summary = (await sync_to_async(get_trace)(run=run)).summary
    assert summary.audit_complete, summary.gaps


async def test_too_many_active_runs_is_refused(user, chat_settings, llm_server):
    chat_settings.CHAT_MAX_ACTIVE_RUNS_PER_USER = 2
    llm_server.provider.delay = 0.3
    llm_server.provider.pieces = 10
    comm = await _connect(user)
    await comm.send_json_to({"type": "chat", "query": "one"})
    await comm.send_json_to({"type": "chat", "query": "two"})
    await comm.send_json_to({"type": "chat", "query": "three"})
    seen_runs, refused = set(), None
    while refused is None or len(seen_runs) < 2:
        frame = await comm.receive_json_from(timeout=TIMEOUT)
        if frame["type"] == "run":
            seen_runs.add(frame["runId"])
        elif frame["type"] == "error":
            refused = frame
    assert refused["code"] == "too_many_active_runs"
    assert await DiagnosisRun.objects.acount() == 2
    for run_id in seen_runs:
        await comm.send_json_to({"type": "cancel", "runId": run_id})
    for run_id in seen_runs:
        await _wait_run_finished(run_id)
    await _stop(comm)


async def test_disconnect_mid_run_does_not_stop_it_and_its_trace_is_complete(user, llm_server, knowledge):
    llm_server.provider.delay = 0.1
    llm_server.provider.pieces = 8
    comm = await _connect(user)
    await comm.send_json_to({"type": "chat", "query": "Replication lag on db-3"})
    first = await comm.receive_json_from(timeout=TIMEOUT)
    assert first["type"] == "run"
    while (await comm.receive_json_from(timeout=TIMEOUT)).get("stage") != "MODEL_STEP":
        pass
    await comm.disconnect()  # the client goes away while the agent model answers
    await _wait_run_finished(first["runId"])
    run = await DiagnosisRun.objects.aget(run_id=first["runId"])
    assert run.status == RunStatus.SUCCESS and run.release_decision == "PUBLISHED"
    summary = (await sync_to_async(get_trace)(run=run)).summary
    assert summary.audit_complete, summary.gaps
    assert summary.persisted == summary.expected
    await supervisor.stop_background()


async def test_reattach_after_n_gets_exactly_the_missing_frames(user, llm_server, knowledge):
    llm_server.provider.delay = 0.05
    comm = await _connect(user)
    await comm.send_json_to({"type": "chat", "query": "Replication lag on db-3"})
    frames = await _frames_until_outcome(comm)
    run_id = frames[0]["runId"]
    persisted = [
        e
        async for e in TraceEvent.objects.filter(run_id=run_id, event_type__in=CHAT_TIMELINE_TYPES).order_by(
            "sequence_no"
        )
    ]
    kind = {"RUN_STARTED": "run", "TOOL_INVOCATION": "tool", "RUN_FINISHED": "outcome"}
    # The live stream's sequenced frames are the timeline's, in its order (progress included).
    assert [f.get("sequenceNo") for f in frames if f["type"] == "progress" and f["status"] == "FINISHED"] == [
        e.sequence_no for e in persisted if e.event_type not in kind
    ]
    # Attach after every possible N: exactly the frames of the events after N, in order.
    for cut in range(0, persisted[-1].sequence_no + 1):
        await comm.send_json_to({"type": "attach", "runId": run_id, "after": cut})
        expected = [e for e in persisted if e.sequence_no > cut]
        got = []
        if expected:
            got = await _frames_until_outcome(comm)
        assert [f["type"] for f in got] == [kind.get(e.event_type, "progress") for e in expected], cut
        assert [f.get("status") for f in got if f["type"] == "tool"] == [
            e.status for e in expected if e.event_type == EventType.TOOL_INVOCATION
        ]
    assert await comm.receive_nothing(timeout=0.2)
    await _stop(comm)


async def test_cancel_during_a_slow_tool_interrupts_it(user, llm_server, monkeypatch):
    gate = asyncio.Event()

    async def slow_probe(seconds: float = 30.0):
        gate.set()
        await asyncio.sleep(seconds)
        return {"slept": seconds}

    registry = default_registry().copy()
    registry.tool(
        name="slow_probe",
        description="Waits (a stand-in for a slow diagnostic command).",
        parameters={"type": "object", "properties": {"seconds": {"type": "number"}}},
        timeout=60,
    )(slow_probe)
    llm_server.provider.tools = (("slow_probe", {"seconds": 30}),)
    execute_run = supervisor.execute_run

    async def execute_with_slow_tool(**kwargs):
        return await execute_run(registry=registry, **kwargs)

    monkeypatch.setattr(supervisor, "execute_run", execute_with_slow_tool)
    comm = await _connect(user)
    await comm.send_json_to({"type": "chat", "query": "Run the slow probe on db-3"})
    run_frame = await comm.receive_json_from(timeout=TIMEOUT)
    running = await comm.receive_json_from(timeout=TIMEOUT)
    while running["type"] == "progress":  # routing and the model step that calls the tool
        running = await comm.receive_json_from(timeout=TIMEOUT)
    assert running["type"] == "tool" and running["status"] == "RUNNING"
    await asyncio.wait_for(gate.wait(), TIMEOUT)
    await comm.send_json_to({"type": "cancel", "runId": run_frame["runId"]})
    frames = await _frames_until_outcome(comm)
    await _stop(comm)
    assert frames[-1]["status"] == "CANCELLED" and frames[-1]["releaseDecision"] is None
    assert {
        "type": "tool",
        "runId": run_frame["runId"],
        "toolCallId": running["toolCallId"],
        "name": "slow_probe",
        "status": "INTERRUPTED",
    } in frames
    await _wait_run_finished(run_frame["runId"])
    run = await DiagnosisRun.objects.aget(run_id=run_frame["runId"])
    assert run.status == RunStatus.CANCELLED and run.cancel_requested
    tool = await ToolInvocation.objects.aget(run_id=run.run_id)
    assert tool.status == ToolStatus.INTERRUPTED
    assert await TraceEvent.objects.filter(run_id=run.run_id, event_type=EventType.RUN_CANCELLED).aexists()
    summary = (await sync_to_async(get_trace)(run=run)).summary
    assert summary.audit_complete, summary.gaps
