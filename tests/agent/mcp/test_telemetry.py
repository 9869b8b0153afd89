"""The OTel `execute_tool` span of an MCP call (`telemetry.spans`, projected from the record) carries the
GenAI MCP conventions' client attributes — `mcp.method.name`, `network.transport` (`pipe` over stdio,
`tcp` over streamable HTTP), the HTTP server's `server.address` and `server.port` — on a run that called
one tool of each transport; never an argument or a result, even with content capture on."""

from __future__ import annotations

import json

import pytest

from audit.read import get_trace
from audit.verify.runs import verify_run
from telemetry.spans import project_trace
from tests.agent.mcp.test_own_server import own
from tests.agent.runtime.support import AGENT, GUARD, ROUTE, ROUTER, ask
from tests.fakes.openai_server import stream_answer, stream_tool_calls, usage
from tests.telemetry.support import by_name

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("runtime_pools")]
MARK = "argument-7f3a"


def test_execute_tool_spans_of_mcp_calls_carry_the_mcp_attributes_and_no_content(
    llm, user, corpus, use_mcp, everything_http, settings
):
    settings.OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT = True  # a native tool's previews: on
    use_mcp(
        own(allow=["big"]), {"name": "web", "url": everything_http.url, "trusted": True, "allow": ["echo"]}
    )
    calls = [
        ("call_1", "own__big", json.dumps({"size": 40})),
        ("call_2", "web__echo", json.dumps({"message": MARK})),
        ("call_3", "lookup_knowledge", json.dumps({"query": "disk full"})),
    ]
    llm.add(ROUTER, stream_answer(ROUTE, usage=usage(40, 10)))
    llm.add(AGENT, stream_tool_calls(calls, usage=usage(200, 20)))
    llm.add(AGENT, stream_answer("Nothing.", usage=usage(1, 1)), stream_answer("Nothing.", usage=usage(1, 1)))
    llm.add(GUARD, stream_answer('{"supported": false, "unsupportedClaims": [], "reason": "x"}'))
    run, _, _ = ask(user, "Disk full on /var/log")
    spans = by_name(project_trace(get_trace(run=run)))

    (stdio,) = spans["execute_tool own__big"]
    (http,) = spans["execute_tool web__echo"]
    (native,) = spans["execute_tool lookup_knowledge"]
    for span in (stdio, http):
        assert span.attributes["gen_ai.operation.name"] == "execute_tool"
        assert span.attributes["mcp.method.name"] == "tools/call"
        assert span.attributes["diagnosis.tool.status"] == "SUCCEEDED"
    assert stdio.attributes["gen_ai.tool.name"] == "own__big"
    assert (
        stdio.attributes["network.transport"] == "pipe" and stdio.attributes["diagnosis.mcp.server"] == "own"
    )
    assert not {"server.address", "server.port", "network.protocol.name"} & set(stdio.attributes)
    assert (
        http.attributes["network.transport"] == "tcp" and http.attributes["network.protocol.name"] == "http"
    )
    assert http.attributes["server.address"] == "127.0.0.1"
    assert http.attributes["server.port"] == everything_http.port
    assert "mcp.session.id" not in http.attributes
    # No content of an MCP call, whatever the capture setting; a native tool's opt-in preview stays.
    for span in (stdio, http):
        assert not {"gen_ai.tool.call.arguments", "gen_ai.tool.call.result"} & set(span.attributes)
        assert not any(MARK in str(v) or "yyyy" in str(v) for v in span.attributes.values())
    assert "gen_ai.tool.call.arguments" in native.attributes and "mcp.method.name" not in native.attributes
    assert verify_run(run.run_id).ok
