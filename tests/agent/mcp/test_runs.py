"""Runs the real runtime executed with MCP tools of servers nobody here wrote (issue 46 items 1-4): a chat
run that calls `prometheus-mcp-server` (PyPI) against the real Prometheus and publishes an answer citing
its `mcp:` evidence; an AI Ops analysis over streamable HTTP (`mcp-server-everything`) whose write tool
waits for a person and executes only once approved, under the same call id; both verified."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import Group

from agent.aiops import intake
from agent.runtime import approvals, prompts
from agent.runtime.canonical import CanonicalStore
from audit import failed_calls
from audit.models import ToolInvocation, ToolStatus
from audit.verify.runs import verify_run
from bench.b7_aiops import AiOpsBenchProvider
from diagnosis.evidence import ID_RE, MCP_RESULT, parse
from diagnosis.models import DiagnosisRun, ReleaseDecision, RunStatus
from tests.agent.aiops.support import drain
from tests.agent.mcp.conftest import _HttpServer
from tests.agent.runtime.support import AGENT, GUARD, ROUTE, ROUTER, VERDICT, ask
from tests.fakes.openai_server import (
    FakeLLMServer,
    finish_chunk,
    stream_answer,
    stream_tool_calls,
    tool_call_chunks,
)
from tests.fakes.openai_server import usage as tokens

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("runtime_pools")]


def _ids(request) -> list[str]:
    text = " ".join(str(m.get("content") or "") for m in request.messages if m.get("role") == "tool")
    return list(dict.fromkeys(ID_RE.findall(text)))


def prometheus_entry(binaries, monkeypatch, prometheus, **extra) -> dict:
    monkeypatch.setenv("MCP_TEST_PROMETHEUS_URL", prometheus.url)
    return {
        "name": "prom",
        "command": binaries["prometheus"],
        "env": {"PROMETHEUS_URL": "MCP_TEST_PROMETHEUS_URL"},
        "trusted": True,  # its readOnlyHint annotations are believed: no approval for its queries
        "flows": ["chat"],
        "allow": ["execute_query", "list_metrics"],
        **extra,
    }


def test_a_chat_run_calls_prometheus_mcp_server_and_publishes_a_cited_answer(
    llm, user, corpus, use_mcp, binaries, monkeypatch, prometheus
):
    use_mcp(prometheus_entry(binaries, monkeypatch, prometheus))
    arguments = json.dumps({"query": 'up{job="prometheus"}'})
    llm.add(ROUTER, stream_answer(ROUTE, usage=tokens(40, 10)))
    llm.add(
        AGENT,
        stream_tool_calls([("call_1", "prom__execute_query", arguments)], usage=tokens(200, 20)),
        lambda request: stream_answer(
            f"The Prometheus target is up [{_ids(request)[0]}].", usage=tokens(300, 30)
        ),
    )
    llm.add(GUARD, stream_answer(VERDICT, usage=tokens(100, 10)))
    run, outcome, _ = ask(user, "Is the Prometheus scrape target up?")
    assert run.status == RunStatus.SUCCESS and outcome.release_decision == ReleaseDecision.PUBLISHED
    (tool,) = ToolInvocation.objects.filter(run_id=run.run_id)
    assert (tool.tool_name, tool.status) == ("prom__execute_query", ToolStatus.SUCCEEDED)
    assert tool.input_params["query"] == 'up{job="prometheus"}'
    # The model read the bounded result under its citable id; the full result is in the canonical store.
    (cited,) = [i for i in _ids(llm.requests[AGENT][-1])]
    assert parse(cited).kind is MCP_RESULT and parse(cited)["server"] == "prom"
    assert f"[{cited}]" in outcome.content
    stored = CanonicalStore(run.run_id).get_result("call_1")
    assert stored["server"] == "prom" and '"prometheus"' in json.dumps(stored)
    verification = verify_run(run.run_id)
    assert verification.ok, (verification.invalid, verification.incomplete, verification.facts)


class _McpAnalysis(AiOpsBenchProvider):
    """The bench's AI Ops provider whose executor calls a read-only MCP tool and a write tool."""

    def __call__(self, request):
        if prompts.role_of(request.messages) == "executor":
            if not any(m.get("role") == "tool" for m in request.messages):
                calls = [
                    ("call_0", "ev__get-sum", json.dumps({"a": 2, "b": 3})),
                    ("call_1", "ev__toggle-simulated-logging", "{}"),
                ]
                return self._stream(
                    [*tool_call_chunks(calls), finish_chunk("tool_calls")], prompt=900, completion=60
                )
            self.report_requests.append(list(request.messages))
        return super().__call__(request)


@pytest.mark.usefixtures("chat_settings", "aiops_settings")
def test_an_analysis_over_streamable_http_waits_for_approval_then_executes_once(
    settings, staff_user, django_user_model, use_mcp, everything_http
):
    use_mcp(
        {
            "name": "ev",
            "url": everything_http.url,
            "trusted": True,
            "flows": ["aiops"],
            "allow": ["get-sum", "toggle-simulated-logging"],
        }
    )
    approver = django_user_model.objects.create_user("approver", is_staff=True)
    approver.groups.add(Group.objects.get(name=approvals.APPROVERS_GROUP))
    provider = _McpAnalysis(call_seconds=0.0, chunk_interval=0.0)
    provider.report_requests = []
    with FakeLLMServer(handler=provider) as fake:
        for key, value in provider.settings(fake.base_url).items():
            setattr(settings, key, value)
        run_id = intake.start_staff_analysis(user=staff_user, query="Alert SlowScrapes: slow scrapes").run_id
        drain()
        run = DiagnosisRun.objects.get(run_id=run_id)
        assert run.status == RunStatus.INTERRUPTED, run.error_code
        read, write = ToolInvocation.objects.filter(run_id=run_id).order_by("tool_call_id")
        assert (read.tool_name, read.status) == ("ev__get-sum", ToolStatus.SUCCEEDED)
        # The write tool (readOnlyHint false) waits: nothing was executed, the model got no result.
        assert (write.tool_name, write.status) == (
            "ev__toggle-simulated-logging",
            ToolStatus.AWAITING_APPROVAL,
        )
        assert write.started_at is None and provider.report_requests == []
        approvals.decide(run=run, tool_call_id=write.tool_call_id, decision=approvals.APPROVED, user=approver)
        drain()
        assert not fake.errors
    run.refresh_from_db()
    write.refresh_from_db()
    assert run.status == RunStatus.SUCCESS, run.error_code
    assert write.status == ToolStatus.SUCCEEDED and write.tool_call_id == "call_1"
    result = CanonicalStore(run_id).get_result("call_1")
    assert "logging" in json.dumps(result).lower()
    verification = verify_run(run_id)
    assert verification.ok, (verification.invalid, verification.incomplete, verification.facts)


@pytest.mark.usefixtures("chat_settings", "aiops_settings")
def test_an_approved_call_whose_server_is_down_at_resume_is_not_made_and_not_called_rejected(
    settings, staff_user, django_user_model, use_mcp, binaries
):
    """The server of an approved write goes down before the run resumes: the call is never made, its
    record says the tool was unavailable or failed (never that a person rejected it), and the released
    report lists it among the failed calls."""
    server = _HttpServer(binaries["everything"])  # this test's own: the session's stays up
    try:
        use_mcp(
            {
                "name": "ev",
                "url": server.url,
                "trusted": True,
                "flows": ["aiops"],
                "allow": ["get-sum", "toggle-simulated-logging"],
            }
        )
        approver = django_user_model.objects.create_user("approver", is_staff=True)
        approver.groups.add(Group.objects.get(name=approvals.APPROVERS_GROUP))
        provider = _McpAnalysis(call_seconds=0.0, chunk_interval=0.0)
        provider.report_requests = []
        with FakeLLMServer(handler=provider) as fake:
            for key, value in provider.settings(fake.base_url).items():
                setattr(settings, key, value)
            run_id = intake.start_staff_analysis(user=staff_user, query="Alert SlowScrapes: slow").run_id
            drain()
            run = DiagnosisRun.objects.get(run_id=run_id)
            assert run.status == RunStatus.INTERRUPTED, run.error_code
            write = ToolInvocation.objects.get(run_id=run_id, tool_name="ev__toggle-simulated-logging")
            approvals.decide(
                run=run, tool_call_id=write.tool_call_id, decision=approvals.APPROVED, user=approver
            )
            server.stop()
            drain()
            assert not fake.errors
    finally:
        server.stop()
    run.refresh_from_db()
    write.refresh_from_db()
    assert run.status == RunStatus.SUCCESS, run.error_code
    assert write.status == ToolStatus.FAILED and write.error_code in ("TOOL_UNAVAILABLE", "TOOL_ERROR")
    assert "rejected" not in write.error_message
    _body, section = failed_calls.split(run.content)
    assert (
        f"`ev__toggle-simulated-logging` (call `{write.tool_call_id}`): the action was not carried out"
        in section
    )
    verification = verify_run(run_id)
    assert verification.ok, (verification.invalid, verification.incomplete, verification.facts)
