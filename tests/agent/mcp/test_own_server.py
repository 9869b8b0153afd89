"""What the servers nobody here wrote never answer, answered by the tests' own MCP server (a real stdio
subprocess of the official SDK: `own_server.py`), through runs the runtime executed: an error result, an
oversized result and malformed content each end the call FAILED `TOOL_ERROR` with a bounded message that
names no content, and the run goes on; a server that announces changed tools (on the 2026-07-28 listen
stream) is listed again, and a new run's configuration fingerprint changes."""

from __future__ import annotations

import json
import sys
import time

import pytest

from agent.runtime.tools.boundary import ERROR_MESSAGE_CHARS
from audit.models import ToolInvocation, ToolStatus, TraceEvent
from audit.verify.runs import verify_run
from tests.agent.mcp.own_server import TOKEN
from tests.agent.mcp.test_toolsets import _one_call
from tests.agent.runtime.support import AGENT, GUARD, ROUTE, ROUTER, ask
from tests.fakes.openai_server import stream_answer, usage

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("runtime_pools")]


def own(**extra) -> dict:
    return {
        "name": "own",
        "command": sys.executable,
        "args": ["-m", "tests.agent.mcp.own_server"],
        "trusted": True,  # its tools are annotated read-only: the chat may call them
        "flows": ["chat"],
        **extra,
    }


def _failed_call(llm, user, tool: str, arguments: dict) -> ToolInvocation:
    """One chat run whose model calls `tool` once, then answers: the call's record, checked to have
    failed TOOL_ERROR with the model reading that error and answering after it (the run went on)."""
    _one_call(llm, tool, arguments)
    run, _, _ = ask(user, "Disk full on /var/log")
    (call,) = ToolInvocation.objects.filter(run_id=run.run_id)
    assert (call.status, call.error_code) == (ToolStatus.FAILED, "TOOL_ERROR"), call.error_message
    assert len(call.error_message) <= ERROR_MESSAGE_CHARS
    (shown,) = [m for m in llm.requests[AGENT][1].messages if m.get("role") == "tool"]
    assert json.loads(shown["content"])["error"] == {"code": "TOOL_ERROR", "message": call.error_message}
    assert run.status == "SUCCESS" and run.content
    verification = verify_run(run.run_id)
    assert verification.ok, (verification.invalid, verification.incomplete, verification.facts)
    return call


def test_an_error_result_ends_tool_error_bounded_and_redacted(llm, user, corpus, use_mcp):
    use_mcp(own())
    call = _failed_call(llm, user, "own__fail", {})
    assert call.error_message.startswith("McpToolError: the tool answered an error: backend refused")
    assert TOKEN not in call.error_message and "[REDACTED:" in call.error_message


def test_an_oversized_result_ends_tool_error(llm, user, corpus, use_mcp):
    use_mcp(own(maxResultBytes=2048))
    call = _failed_call(llm, user, "own__big", {"size": 5000})
    assert call.error_message.startswith("McpOversized: the result has ")
    assert call.error_message.endswith("bytes, more than this server's 2048")
    assert "yyyy" not in call.error_message


def test_malformed_content_ends_tool_error(llm, user, corpus, use_mcp):
    use_mcp(own())
    call = _failed_call(llm, user, "own__bad_image", {})
    assert call.error_message == (
        "McpMalformed: the result holds malformed content: image block data that is not base64"
    )


def test_a_result_that_is_not_valid_mcp_ends_tool_error_and_the_session_serves_on(llm, user, corpus, use_mcp):
    hub = use_mcp(own())
    call = _failed_call(llm, user, "own__invalid", {})
    assert call.error_message == "McpProtocolError: MCP server own answered a result that is not valid MCP"
    assert hub.states["own"].status == "ready" and hub.reason("own") is None


def _started(run) -> dict:
    return TraceEvent.objects.get(run_id=run.run_id, event_type="RUN_STARTED").details


@pytest.mark.parametrize("protocol", ["auto", "legacy"])
def test_a_server_that_changes_its_tools_is_listed_again_and_changes_the_fingerprint(
    llm, user, corpus, use_mcp, protocol
):
    """On a 2026-07-28 connection the change is announced on the listen stream; on a handshake-era one
    (`protocol: legacy`) on the connection itself: either way the tools are listed again."""
    from mcp_types.version import MODERN_PROTOCOL_VERSIONS

    hub = use_mcp(own(protocol=protocol))
    state = hub.states["own"]
    assert (state.client.protocol_version in MODERN_PROTOCOL_VERSIONS) is (protocol == "auto")
    lists = state.lists
    _one_call(llm, "own__grow", {})
    first, _, _ = ask(user, "Disk full on /var/log")
    assert ToolInvocation.objects.get(run_id=first.run_id).status == ToolStatus.SUCCEEDED
    deadline = time.monotonic() + 15
    while state.lists == lists and time.monotonic() < deadline:
        time.sleep(0.05)
    assert state.lists > lists and "added" in {t.name for t in state.tools}

    llm.add(ROUTER, stream_answer(ROUTE, usage=usage(40, 10)))
    llm.add(AGENT, stream_answer("Nothing.", usage=usage(1, 1)), stream_answer("Nothing.", usage=usage(1, 1)))
    llm.add(GUARD, stream_answer('{"supported": false, "unsupportedClaims": [], "reason": "x"}'))
    second, _, _ = ask(user, "Disk full on /var/log")
    before, after = _started(first), _started(second)
    assert "own__added" not in before["tools"] and "own__added" in after["tools"]
    assert "own__added" in after["configuration"]["tools"]["digests"]
    assert before["configFingerprint"] != after["configFingerprint"]
    assert verify_run(second.run_id).ok
