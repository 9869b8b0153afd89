"""MCP servers as toolsets (issue 46 items 1 and 3) against real servers: discovery over stdio and
streamable HTTP, bounded and filtered; the approval policy; the configuration fingerprint; and failure as
a recorded outcome (a server down at start left out with why, a timeout, a server that dies mid-call and
is restarted with back-off, a tool's own error, stderr redacted) — calls made through the runtime's
boundary on runs it executed against the fake OpenAI-compatible server."""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time

import mcp_types as types
import pytest

from agent.checks import check_mcp_servers
from agent.mcp.config import McpConfigError, parse_server, servers
from agent.mcp.toolset import to_result
from agent.runtime.canonical import CanonicalStore
from agent.runtime.configuration import effective_configuration, fingerprint_of
from agent.runtime.providers import get_model_client
from agent.runtime.tools.registry import FLOW_AI_OPS, FLOW_CHAT, default_registry
from audit.models import ToolInvocation, ToolStatus
from audit.verify.runs import verify_run
from diagnosis.evidence import NATIVE_KINDS, citation_pattern
from tests.agent.runtime.support import AGENT, GUARD, ROUTE, ROUTER, ask
from tests.fakes.openai_server import stream_answer, stream_tool_calls, usage

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("runtime_pools")]
SECRET = "ghp_" + "Q8r2Zk4mW9xT3vN7bL1pY6sD0fH5jC8gA2eK"


def everything(binaries, **extra) -> dict:
    return {"name": "ev", "command": binaries["everything"], "args": ["stdio"], **extra}


def test_malformed_entries_are_refused_and_named_by_the_system_check(settings):
    for entry, words in [
        ({"name": "Bad Name", "command": "x"}, "slug"),
        ({"name": "a", "command": "x", "url": "http://127.0.0.1:1/mcp"}, "either"),
        ({"name": "a", "url": "ftp://127.0.0.1/mcp"}, "http"),
        ({"name": "a", "command": "x", "flows": ["batch"]}, "flows"),
        ({"name": "a", "command": "x", "headers": {"Authorization": "not a name!"}}, "environment"),
        ({"name": "a", "command": "x", "timeoutSeconds": 0}, "timeoutSeconds"),
        ({"name": "a", "command": "x", "secret": "x"}, "unknown"),
        ({"name": "a", "command": "x", "protocol": "2025-06-18"}, "protocol"),
    ]:
        with pytest.raises(McpConfigError, match=words):
            parse_server(entry)
    settings.MCP_SERVERS = [{"name": "a", "command": "x"}, {"name": "a", "command": "y"}]
    assert [e.id for e in check_mcp_servers()] == ["diagnosis.E006"]
    settings.MCP_SERVERS = []
    assert check_mcp_servers() == [] and servers() == ()


def test_approval_policy_trusts_read_only_hints_only_of_a_trusted_server():
    untrusted = parse_server({"name": "a", "command": "x"})
    trusted = parse_server({"name": "a", "command": "x", "trusted": True, "approve": ["get-env"]})
    operator = parse_server({"name": "a", "command": "x", "readOnly": ["get-*"]})
    assert untrusted.needs_approval("get-sum", True) and untrusted.needs_approval("toggle", None)
    assert not trusted.needs_approval("get-sum", True) and trusted.needs_approval("toggle", False)
    assert trusted.needs_approval("get-env", True)  # `approve` wins over any read-only declaration
    assert not operator.needs_approval("get-sum", None) and operator.needs_approval("toggle", True)


def test_tools_are_discovered_over_stdio_and_http_filtered_and_fingerprinted(
    use_mcp, binaries, everything_http, settings
):
    use_mcp(
        everything(binaries, allow=["get-*", "toggle-*"], deny=["get-env"], flows=["chat"]),
        {"name": "web", "url": everything_http.url, "trusted": True, "allow": ["echo", "toggle-*"]},
    )
    chat = default_registry(flow=FLOW_CHAT)
    ev = [n for n in chat.names() if n.startswith("ev__")]
    assert "ev__get-sum" in ev and "ev__get-env" not in ev and "ev__echo" not in ev
    assert all(chat.get(n).requires_approval for n in ev)  # untrusted: every tool asks a person
    assert (
        not chat.get("web__echo").requires_approval
        and chat.get("web__toggle-simulated-logging").requires_approval
    )
    assert not any(n.startswith("ev__") for n in default_registry(flow=FLOW_AI_OPS).names())  # chat only
    client = get_model_client()
    config = effective_configuration(
        client=client, registry=chat, flow=FLOW_CHAT, release_mode="verified", knowledge=_snapshot()
    )
    tools = config.document["tools"]
    assert (
        tools["mcp"]["servers"] == ["ev", "web"]
        and "web__toggle-simulated-logging" in tools["mcp"]["approval"]
    )
    assert set(ev) <= set(tools["digests"])
    # A server that offers other tools changes the fingerprint; without MCP tools the document has no
    # `mcp` part and the citation pattern of the native kinds, as before MCP existed.
    fewer = chat.only([n for n in chat.names() if n != "web__echo"])
    other = effective_configuration(
        client=client, registry=fewer, flow=FLOW_CHAT, release_mode="verified", knowledge=_snapshot()
    )
    assert other.fingerprint != config.fingerprint
    native = chat.only(["lookup_knowledge", "read_runbook"])
    plain = effective_configuration(
        client=client, registry=native, flow=FLOW_CHAT, release_mode="verified", knowledge=_snapshot()
    )
    assert "mcp" not in plain.document["tools"] and plain.fingerprint == fingerprint_of(plain.document)
    from agent.runtime.configuration import sha256_text

    assert plain.document["guards"]["citationPattern"] == sha256_text(citation_pattern(NATIVE_KINDS))


def _snapshot():
    from agent.knowledge.retrieval import knowledge_snapshot

    return knowledge_snapshot()


def _one_call(llm, name: str, arguments: dict, answer: str = "No result could be obtained.") -> None:
    llm.add(ROUTER, stream_answer(ROUTE, usage=usage(40, 10)))
    llm.add(AGENT, stream_tool_calls([("call_1", name, json.dumps(arguments))], usage=usage(200, 20)))
    llm.add(AGENT, stream_answer(answer, usage=usage(300, 30)), stream_answer(answer, usage=usage(300, 30)))
    llm.add(GUARD, stream_answer('{"supported": false, "unsupportedClaims": [], "reason": "x"}'))


def test_a_server_down_at_start_is_left_out_and_the_configuration_says_why(llm, user, corpus, use_mcp):
    use_mcp({"name": "gone", "command": "/nonexistent/mcp-server", "flows": ["chat"]})
    llm.add(ROUTER, stream_answer(ROUTE, usage=usage(40, 10)))
    llm.add(
        AGENT,
        stream_answer("Nothing to cite.", usage=usage(300, 30)),
        stream_answer("Nothing.", usage=usage(1, 1)),
    )
    llm.add(GUARD, stream_answer('{"supported": false, "unsupportedClaims": [], "reason": "x"}'))
    run, _, _ = ask(user, "Disk full on /var/log")
    from audit.models import TraceEvent

    started = TraceEvent.objects.get(run_id=run.run_id, event_type="RUN_STARTED")
    left_out = started.details["configuration"]["tools"]["leftOut"]
    assert left_out["mcp:gone"].startswith("Unreachable: MCP server gone: FileNotFoundError")
    assert not any(n.startswith("gone__") for n in started.details["tools"])
    assert verify_run(run.run_id).ok


def test_a_call_that_times_out_ends_tool_error_and_the_run_goes_on(llm, user, corpus, use_mcp, binaries):
    use_mcp(everything(binaries, trusted=True, timeoutSeconds=1, allow=["trigger-long-running-operation"]))
    _one_call(llm, "ev__trigger-long-running-operation", {"duration": 5, "steps": 2})
    run, _, _ = ask(user, "Disk full on /var/log")
    (tool,) = ToolInvocation.objects.filter(run_id=run.run_id)
    assert (tool.status, tool.error_code) == (ToolStatus.FAILED, "TOOL_ERROR")
    assert tool.error_message == "McpTimeout: MCP server ev did not answer within 1 s"
    assert verify_run(run.run_id).ok


def _server_pids(command: str) -> list[int]:
    """Pids of this test process's own children running `command` (the hub's stdio servers)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                parent = int(stat.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as cmd:
                line = cmd.read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
        if parent == os.getpid() and "mcp-server-everything" in line:
            pids.append(int(entry))
    return pids


def test_a_server_dying_mid_call_ends_tool_error_and_is_restarted_with_back_off(
    llm, user, corpus, use_mcp, binaries
):
    hub = use_mcp(everything(binaries, trusted=True, allow=["trigger-long-running-operation", "get-sum"]))
    pids = _server_pids(binaries["everything"])
    assert pids

    _one_call(llm, "ev__trigger-long-running-operation", {"duration": 3, "steps": 3})
    for pid in pids:  # the server dies mid-call
        threading.Timer(1.5, os.kill, (pid, signal.SIGKILL)).start()
    run, _, _ = ask(user, "Disk full on /var/log")
    (tool,) = ToolInvocation.objects.filter(run_id=run.run_id)
    assert (tool.status, tool.error_code) == (ToolStatus.FAILED, "TOOL_ERROR")
    assert tool.error_message.startswith("McpConnectionLost: MCP server ev")
    assert verify_run(run.run_id).ok
    state = hub.states["ev"]
    deadline = time.monotonic() + 15
    while state.status != "ready" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert state.status == "ready" and not set(_server_pids(binaries["everything"])) & set(pids)


def test_secrets_in_results_and_stderr_are_redacted_and_bad_arguments_never_reach_the_server(
    llm, user, corpus, use_mcp, binaries, monkeypatch, caplog
):
    monkeypatch.setenv("MCP_TEST_TOKEN", SECRET)
    wrapper = f'echo "token {SECRET} loaded" >&2; exec "{binaries["everything"]}" stdio'
    entry = {"name": "ev", "command": "/bin/sh", "args": ["-c", wrapper], "trusted": True}
    hub = use_mcp({**entry, "allow": ["get-sum", "get-env"], "env": {"API_TOKEN": "MCP_TEST_TOKEN"}})
    caplog.set_level(logging.DEBUG, logger="agent.mcp.hub")
    calls = [("call_1", "ev__get-sum", '{"a": 1, "b": "two"}'), ("call_2", "ev__get-env", "{}")]
    llm.add(ROUTER, stream_answer(ROUTE, usage=usage(40, 10)))
    llm.add(AGENT, stream_tool_calls(calls, usage=usage(200, 20)))
    llm.add(AGENT, stream_answer("Nothing.", usage=usage(1, 1)), stream_answer("Nothing.", usage=usage(1, 1)))
    llm.add(GUARD, stream_answer('{"supported": false, "unsupportedClaims": [], "reason": "x"}'))
    run, _, _ = ask(user, "Disk full on /var/log")
    bad, env = ToolInvocation.objects.filter(run_id=run.run_id).order_by("tool_call_id")
    # The schema check refuses it before any call, so the server never sees it.
    assert (bad.status, bad.error_code) == (ToolStatus.FAILED, "TOOL_BAD_ARGUMENTS")
    # The server's environment holds the secret: stored, previewed and shown to the model redacted.
    assert env.status == ToolStatus.SUCCEEDED and SECRET not in env.output_preview
    stored = json.dumps(CanonicalStore(run.run_id).get_result(env.tool_call_id))
    assert "API_TOKEN" in stored and "[REDACTED:" in stored and SECRET not in stored
    shown = " ".join(
        str(m.get("content")) for m in llm.requests[AGENT][-1].messages if m.get("role") == "tool"
    )
    assert "[REDACTED:" in shown and SECRET not in shown
    lines = list(hub.states["ev"].stderr)
    assert any("[REDACTED:" in line for line in lines) and not any(SECRET in line for line in lines)
    assert SECRET not in caplog.text
    assert verify_run(run.run_id).ok


def test_the_evidence_id_digest_never_depends_on_a_secret_in_the_result():
    """The id is public (cited in answers, stored): its digest is over the redacted result, so two results
    that differ only in a secret share it, and a guess of the secret cannot be tested against it."""
    config = parse_server({"name": "ev", "command": "x"})

    def result(secret: str):
        return to_result(
            config,
            "get-env",
            types.CallToolResult(content=[types.TextContent(type="text", text=f"API_TOKEN={secret}")]),
        )

    first, second = result(SECRET), result(SECRET.replace("a", "b", 1))
    assert first.evidence[0].id == second.evidence[0].id
    plain = to_result(
        config,
        "get-env",
        types.CallToolResult(content=[types.TextContent(type="text", text="nothing secret")]),
    )
    assert plain.evidence[0].id != first.evidence[0].id


def test_a_serving_loop_holds_the_sessions_so_a_runs_call_takes_no_thread_hop(settings, binaries):
    """`serve_on` (a serving process's start) puts the sessions on the serving loop: no hub thread, a
    call from that loop awaits the session directly, a call from another loop still reaches it, and the
    process's shutdown (`aclose_hub`) ends the server; afterwards a hub runs on a thread of its own."""
    import asyncio

    from agent.mcp.hub import aclose_hub, close_hub, current_hub, serve_on

    settings.MCP_CONNECT_TIMEOUT_SECONDS = 90.0
    settings.MCP_SERVERS = [everything(binaries, trusted=True, allow=["get-sum"])]

    async def serving():
        loop = asyncio.get_running_loop()
        serve_on(loop)
        hub = current_hub()
        try:
            assert hub is not None and hub.loop is loop
            assert not any(t.name == "mcp-hub" for t in threading.enumerate())
            while hub.states["ev"].status == "starting":
                await asyncio.sleep(0.05)
            spec = default_registry(flow=FLOW_CHAT).get("ev__get-sum")
            here = await spec.func(a=2, b=3)
            elsewhere = await asyncio.to_thread(lambda: asyncio.run(spec.func(a=4, b=5)))
            assert "5" in here.model_content and "9" in elsewhere.model_content
        finally:
            await aclose_hub()
        assert hub.states["ev"].status == "down" and hub.states["ev"].last_error == "stopped"

    asyncio.run(serving())
    try:
        threaded = current_hub()
        assert threaded is not None and threaded.alive()
        assert any(t.name == "mcp-hub" for t in threading.enumerate())
    finally:
        close_hub()
