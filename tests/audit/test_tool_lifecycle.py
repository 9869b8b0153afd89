"""The tool lifecycle without holes (seed 002): every real tool call is one row under an id unique in the
run, with the provider's own id beside it; a resumed recorder still refuses a conflicting terminal; a
repeated start never runs the tool twice; a conflicting terminal is recorded and never stops the run;
the row written when the RUNNING write was lost keeps the real input.

Through the real recorder, the real tool boundary and, for provider ids, the real `openai` SDK against
the local OpenAI-compatible test server."""

from __future__ import annotations

import asyncio

import pytest
from django.db import connection

from agent.runtime.cancel import CancelToken
from agent.runtime.canonical import CanonicalStore
from agent.runtime.context import RunContext
from agent.runtime.events import ToolEvent
from agent.runtime.tools.boundary import TOOL_REPEATED, ToolBoundary
from agent.runtime.tools.registry import default_registry
from audit.models import EventType, ToolInvocation, ToolStatus, TraceEvent
from audit.read import get_trace
from audit.verify.hash_chain import verify_chain
from audit.write import DeclaredToolCall, RunRecorder, ToolLifecycleConflict
from diagnosis.models import ReleaseDecision, RunStatus
from reasoning.capture import build_capture
from tests.agent.runtime.support import AGENT, CollectingSink, FailInserts, ask, evidence_ids
from tests.factories import usage
from tests.fakes.openai_server import stream_answer, stream_tool_calls


def _declare(rec, *calls, step_index=1):
    rec.model_step(
        step_index=step_index,
        agent_name="diagnosis_agent",
        model="m",
        usage=usage(1, 1),
        reasoning=build_capture(reasoning=None, text=""),
        tool_calls=list(calls),
    )


def _call(tool_call_id, name="lookup_knowledge", arguments='{"query": "q"}'):
    return DeclaredToolCall(tool_call_id=tool_call_id, name=name, arguments=arguments)


def _tool_events(run_id):
    return list(
        TraceEvent.objects.filter(run_id=run_id, event_type=EventType.TOOL_INVOCATION).order_by("sequence_no")
    )


# --------------------------------------------------------------------------------------------------
# Provider ids unique only within one response
# --------------------------------------------------------------------------------------------------
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("runtime_pools")
def test_a_provider_reusing_call_0_across_steps_gives_two_tool_rows_both_succeeded(
    llm, corpus, user, staff_user, client
):
    def cite(request):
        return stream_answer(f"Check the upstream's port [{evidence_ids(request)[0]}].")

    llm.route("DIAGNOSIS")
    llm.add(
        AGENT,
        stream_tool_calls([("call_0", "lookup_knowledge", '{"query": "nginx 502"}')]),
        stream_tool_calls([("call_0", "lookup_knowledge", '{"query": "upstream refuses connection"}')]),
        cite,
    )
    llm.supported()
    run, outcome, sink = ask(user, "nginx answers 502 after the deploy")

    assert outcome.status == run.status == RunStatus.SUCCESS
    assert run.release_decision == ReleaseDecision.PUBLISHED
    tools = list(ToolInvocation.objects.filter(run_id=run.run_id).order_by("step_index"))
    assert [(t.tool_call_id, t.provider_tool_call_id, t.step_index, t.status) for t in tools] == [
        ("call_0", "call_0", 1, ToolStatus.SUCCEEDED),
        ("call_0~s2", "call_0", 2, ToolStatus.SUCCEEDED),
    ]
    assert [t.input_params["query"] for t in tools] == ["nginx 502", "upstream refuses connection"]
    # The provider is answered under its own ids: both results of the last request name call_0.
    last = llm.requests[AGENT][2].messages
    assert [m["tool_call_id"] for m in last if m["role"] == "tool"] == ["call_0", "call_0"]
    assistant = [m for m in last if m["role"] == "assistant"]
    assert [c["id"] for m in assistant for c in m["tool_calls"]] == ["call_0", "call_0"]
    # Live frames and the record use the run-unique ids.
    assert [(e.tool_call_id, e.status) for e in sink.of_type(ToolEvent)] == [
        ("call_0", "RUNNING"),
        ("call_0", "SUCCEEDED"),
        ("call_0~s2", "RUNNING"),
        ("call_0~s2", "SUCCEEDED"),
    ]
    summary = get_trace(run=run).summary
    assert summary.audit_complete, summary.gaps
    client.force_login(staff_user)
    body = client.get(f"/api/diagnosis/{run.session_id}/trace", {"runId": run.run_id}).json()
    assert [(t["toolCallId"], t["providerToolCallId"]) for t in body["tools"]] == [
        ("call_0", "call_0"),
        ("call_0~s2", "call_0"),
    ]


@pytest.mark.django_db
def test_run_unique_ids_are_deterministic_and_survive_a_resume(recorder, run):
    first = recorder.run_unique_calls([_call("call_0"), _call("call_1")], step_index=1)
    assert [(c.tool_call_id, c.provider_id) for c in first] == [("call_0", "call_0"), ("call_1", "call_1")]
    _declare(recorder, *first)
    second = recorder.run_unique_calls([_call("call_0"), _call("call_0")], step_index=2)
    assert [c.tool_call_id for c in second] == ["call_0~s2", "call_0~s2.2"]
    assert recorder.run_unique_calls([_call("call_0"), _call("call_0")], step_index=2) == second
    _declare(recorder, *second, step_index=2)
    resumed = RunRecorder.resume(run.run_id)
    assert [c.tool_call_id for c in resumed.run_unique_calls([_call("call_0")], step_index=3)] == [
        "call_0~s3"
    ]
    resumed.tool_started(tool_call_id="call_0~s2", tool_name="lookup_knowledge", input_params={"query": "q"})
    row = ToolInvocation.objects.get(run_id=run.run_id, tool_call_id="call_0~s2")
    assert row.provider_tool_call_id == "call_0" and row.step_index == 2


# --------------------------------------------------------------------------------------------------
# Terminal facts after a takeover
# --------------------------------------------------------------------------------------------------
@pytest.mark.django_db
def test_a_resumed_recorder_refuses_a_conflicting_terminal(recorder, run):
    _declare(recorder, _call("c1"), _call("c2"))
    recorder.tool_started(tool_call_id="c1", tool_name="lookup_knowledge", input_params={"query": "q"})
    recorder.tool_finished(tool_call_id="c1", status=ToolStatus.SUCCEEDED, output="first result")
    recorder.tool_started(tool_call_id="c2", tool_name="lookup_knowledge", input_params={"query": "q"})
    recorder.tool_finished(
        tool_call_id="c2", status=ToolStatus.FAILED, error_code="TOOL_ERROR", error_message="x"
    )

    sweeper = RunRecorder.resume(run.run_id)
    # The same facts again are a no-op; other output, another status or another error are refused.
    assert (
        sweeper.tool_finished(tool_call_id="c1", status=ToolStatus.SUCCEEDED, output="first result") is None
    )
    with pytest.raises(ToolLifecycleConflict):
        sweeper.tool_finished(tool_call_id="c1", status=ToolStatus.SUCCEEDED, output="another result")
    assert (
        sweeper.tool_finished(
            tool_call_id="c2", status=ToolStatus.FAILED, error_code="TOOL_ERROR", error_message="x"
        )
        is None
    )
    with pytest.raises(ToolLifecycleConflict):
        sweeper.tool_finished(tool_call_id="c2", status=ToolStatus.FAILED, error_code="TOOL_TIMEOUT")
    row = ToolInvocation.objects.get(run_id=run.run_id, tool_call_id="c1")
    assert row.status == ToolStatus.SUCCEEDED and row.output_preview == "first result"
    conflicts = [e for e in _tool_events(run.run_id) if e.status == "CONFLICT"]
    assert [(e.details["toolCallId"], e.details["reason"]) for e in conflicts] == [
        ("c1", "CONFLICTING_TERMINAL"),
        ("c2", "CONFLICTING_TERMINAL"),
    ]
    sweeper.finish(status=RunStatus.SUCCESS, content="x")
    run.refresh_from_db()
    summary = get_trace(run=run).summary
    assert summary.chain_valid and summary.audit_complete
    assert "tool call c1: a terminal with other facts was refused" in summary.gaps


# --------------------------------------------------------------------------------------------------
# The boundary: a repeated start, a conflicting terminal
# --------------------------------------------------------------------------------------------------
def _boundary(run, recorder, registry):
    sink = CollectingSink()
    ctx = RunContext(
        run_id=run.run_id,
        session_id=run.session_id,
        query=run.query,
        recorder=recorder,
        sink=sink,
        token=CancelToken(),
        client=None,
        registry=registry,
        canonical=CanonicalStore(run.run_id),
    )
    return ToolBoundary(ctx), sink


def _registry(name, func):
    registry = default_registry().copy()
    registry.tool(
        name=name,
        description=f"test tool {name}",
        parameters={"type": "object", "properties": {"q": {"type": "string"}}},
    )(func)
    return registry


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("runtime_pools")
def test_a_repeated_start_never_executes_the_tool_a_second_time(run, recorder):
    executions = []

    def probe(q: str = "") -> dict:
        executions.append(q)
        return {"probed": q}

    call = _call("c1", name="probe", arguments='{"q": "upstream"}')
    _declare(recorder, call)
    boundary, sink = _boundary(run, recorder, _registry("probe", probe))
    first = asyncio.run(boundary.run([call]))
    again = asyncio.run(boundary.run([call]))

    assert executions == ["upstream"]
    assert first[0].status == ToolStatus.SUCCEEDED
    assert again[0].status == "REFUSED" and again[0].error_code == TOOL_REPEATED
    assert TOOL_REPEATED in again[0].content
    row = ToolInvocation.objects.get(run_id=run.run_id)
    assert row.status == ToolStatus.SUCCEEDED
    assert [e.status for e in _tool_events(run.run_id)] == ["RUNNING", "SUCCEEDED"]
    assert [e.status for e in sink.of_type(ToolEvent)] == ["RUNNING", "SUCCEEDED"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("runtime_pools")
def test_a_conflicting_terminal_is_recorded_and_never_crashes_the_run(run, recorder):
    def probe(q: str = "") -> dict:
        # While the tool runs, its call is closed elsewhere (as the executor does on a cancel).
        recorder.close_tools(
            status=ToolStatus.INTERRUPTED, error_code="RUN_CANCELLED", error_message="closed"
        )
        return {"probed": q}

    call = _call("c1", name="probe", arguments='{"q": "upstream"}')
    _declare(recorder, call)
    boundary, sink = _boundary(run, recorder, _registry("probe", probe))
    outcomes = asyncio.run(boundary.run([call]))

    assert outcomes[0].status == ToolStatus.SUCCEEDED  # the model gets the tool's real result
    # Live clients still get the tool's terminal frame.
    assert [(e.tool_call_id, e.status) for e in sink.of_type(ToolEvent)] == [
        ("c1", "RUNNING"),
        ("c1", "SUCCEEDED"),
    ]
    row = ToolInvocation.objects.get(run_id=run.run_id)
    assert row.status == ToolStatus.INTERRUPTED  # the first terminal stands
    events = _tool_events(run.run_id)
    assert [e.status for e in events] == ["RUNNING", "INTERRUPTED", "CONFLICT"]
    assert events[-1].details["reason"] == "CONFLICTING_TERMINAL"
    assert events[-1].details["recordedStatus"] == "INTERRUPTED"
    assert events[-1].details["refusedStatus"] == "SUCCEEDED"
    recorder.finish(status=RunStatus.SUCCESS, content="answer")
    run.refresh_from_db()
    summary = get_trace(run=run).summary
    assert "tool call c1: a terminal with other facts was refused" in summary.gaps
    assert summary.chain_valid and verify_chain(list(TraceEvent.objects.filter(run_id=run.run_id))).valid


# --------------------------------------------------------------------------------------------------
# The row written when the RUNNING write was lost
# --------------------------------------------------------------------------------------------------
@pytest.mark.django_db
def test_the_fallback_row_of_a_lost_running_write_keeps_the_real_input(recorder, run):
    _declare(recorder, _call("c1"))
    with connection.execute_wrapper(FailInserts("tool_invocation", times=1)):
        assert (
            recorder.tool_started(
                tool_call_id="c1",
                tool_name="lookup_knowledge",
                input_params={"query": "disk full", "top_k": 3},
            )
            is None
        )
    assert not ToolInvocation.objects.filter(run_id=run.run_id).exists()
    recorder.tool_finished(tool_call_id="c1", status=ToolStatus.SUCCEEDED, output="result")
    row = ToolInvocation.objects.get(run_id=run.run_id)
    assert row.status == ToolStatus.SUCCEEDED and row.output_preview == "result"
    assert row.input_params == {"query": "disk full", "top_k": 3}
    assert row.provider_tool_call_id == "c1"
    assert recorder.audit_write_failures == 1
