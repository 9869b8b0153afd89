"""Faults during a run, through the real runtime, the real `openai` SDK against the local fake provider,
and the real database: the business result stays right and the audit says exactly what is missing.

* the audit database drops off the network for part of a run (MariaDB behind a TCP proxy whose outage
  aborts every connection and refuses new ones): the run completes and is released, the failed writes
  are counted, and the trace summary and the admin's run page name the gaps;
* the provider fails mid-run after a tool ran (429 until retries run out, 500, a stalled stream, a
  malformed chunk, a connection reset mid-stream): the run fails with its code, the failed call is a
  recorded step, the audit is complete, and nothing of the provider's error body leaks;
* a tool returns 10 MB: the audit keeps a bounded preview with the full length and sha256, the model
  gets a bounded message, the canonical store keeps the full result, and the run's peak Python
  allocation stays a small multiple of the output (measured with `tracemalloc`).

Rows already proven elsewhere are cited in docs/reliability.md instead of repeated here.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import tracemalloc

import pytest
from django.core.cache import caches
from django.db import connection

from agent.runtime import db as runtime_db
from agent.runtime.events import DraftEvent, ErrorEvent, OutcomeEvent, ToolEvent
from agent.runtime.executor import prepare_run
from agent.runtime.tools.registry import ToolResult, default_registry
from audit.models import AgentStep, EventType, ToolInvocation, ToolStatus, TraceEvent
from audit.payloads import canonical_json
from audit.read import get_trace
from diagnosis.models import DiagnosisRun, ReleaseDecision, RunStatus
from tests.agent.reliability.support import DatabaseOutageProxy, routed_through
from tests.agent.runtime.support import (
    AGENT,
    GUARD,
    ask,
    evidence_ids,
    execute,
)
from tests.fakes.openai_server import (
    HTTPError,
    Reset,
    Stall,
    Stream,
    stream_answer,
    stream_tool_calls,
    text_chunks,
    usage,
)
from tests.surfaces.admin.support import grant_console

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("runtime_pools")]

PROVIDER_SECRET = "provider-body-secret-9c41"


def _registry_with(name: str, func, *, timeout: float | None = None):
    registry = default_registry().copy()
    registry.tool(
        name=name,
        description=f"test tool {name}",
        parameters={"type": "object", "properties": {"q": {"type": "string"}}},
        timeout=timeout,
    )(func)
    return registry


def _cite_first(request):
    return stream_answer(f"Check that the upstream listens on its port [{evidence_ids(request)[0]}].")


# --------------------------------------------------------------------------------------------------
# The audit database is unavailable for part of a run
# --------------------------------------------------------------------------------------------------
@pytest.mark.mariadb
def test_audit_database_outage_mid_run_completes_the_run_and_names_the_gaps(
    llm, corpus, user, staff_user, client, caplog
):
    proxy = DatabaseOutageProxy(
        connection.settings_dict["HOST"] or "127.0.0.1", int(connection.settings_dict["PORT"] or 3306)
    ).start()

    def probe(q: str = "") -> dict:
        proxy.outage()  # the database host drops off the network while this tool runs
        return {"probed": q}

    def guard_after_recovery(request):
        proxy.restore()  # back before the semantic guard's decision is recorded
        body = json.dumps({"supported": True, "unsupportedClaims": [], "reason": "cited"})
        return stream_answer(body, usage=usage(50, 10))

    registry = _registry_with("probe", probe)
    llm.route("DIAGNOSIS")
    llm.add(
        AGENT,
        stream_tool_calls([("c_kb", "lookup_knowledge", '{"query": "nginx 502 upstream"}')]),
        stream_tool_calls([("c_probe", "probe", '{"q": "upstream"}')]),
        _cite_first,
    )
    llm.add(GUARD, guard_after_recovery)
    try:
        with routed_through(proxy), caplog.at_level(logging.ERROR, logger="audit.write"):
            run = prepare_run(user=user, query="nginx answers 502 after the deploy")
            outcome, sink = execute(run.run_id, registry=registry)
            runtime_db.shutdown_pools()
    finally:
        proxy.stop()
    run.refresh_from_db()  # this thread's connection went through the proxy too: routed_through closed it

    # The business result is untouched: released, published, the answer the guards checked.
    assert proxy.outages == 1
    assert outcome.status == run.status == RunStatus.SUCCESS
    assert outcome.release_decision == run.release_decision == ReleaseDecision.PUBLISHED
    assert run.content == outcome.content and "[kb:nginx-502#" in run.content
    assert isinstance(sink.events[-1], OutcomeEvent) and sink.events[-1].status == "SUCCESS"

    # What was lost is counted and named: the probe's terminal update, the start count of the answer's
    # model call, the answer step, the evidence guard and the start count of the guard's call; every
    # write after the outage ended committed again (verified release: the first output is stamped by
    # the finish, after the outage).
    failed_ops = re.findall(rf"audit write failed run={run.run_id} op=(\w+)", caplog.text)
    assert failed_ops == [
        "tool_finished",
        "model_call_started",
        "model_step",
        "evidence_guard",
        "model_call_started",
    ]
    assert run.audit_write_failures == 5
    trace = get_trace(run=run)
    s = trace.summary
    assert not s.audit_complete and s.chain_valid  # what is stored still verifies
    assert s.persisted.events == s.expected.events - 4  # probe terminal, step (2 events), evidence guard
    assert s.persisted.steps == s.expected.steps - 1
    assert s.persisted.tools == s.expected.tools == 2
    assert "5 audit write failures recorded" in s.gaps
    assert "4 timeline events expected but not stored" in s.gaps
    assert "1 model step expected but not stored" in s.gaps
    assert "tool call c_probe still RUNNING after the run ended" in s.gaps
    stored = [e.event_type for e in TraceEvent.objects.filter(run_id=run.run_id).order_by("sequence_no")]
    assert stored[-4:] == ["SEMANTIC_GUARD_DECISION", "MODEL_TOKEN_USAGE", "RELEASE_DECISION", "RUN_FINISHED"]
    assert "EVIDENCE_GUARD_INITIAL" not in stored
    # The log names the operation and the error class, never content.
    assert run.content not in caplog.text and run.query not in caplog.text

    # The API and the admin's run page show the gaps.
    client.force_login(staff_user)
    api = client.get(f"/api/diagnosis/{run.session_id}/trace", {"runId": run.run_id}).json()
    assert api["summary"]["auditComplete"] is False and api["summary"]["auditWriteFailures"] == 5
    assert "5 audit write failures recorded" in api["summary"]["gaps"]
    grant_console(staff_user)
    page = client.get(f"/admin/diagnosis/diagnosisrun/{run.pk}/change/").content.decode()
    assert "5 audit write failures recorded" in page
    assert "tool call c_probe still RUNNING after the run ended" in page


# --------------------------------------------------------------------------------------------------
# Provider faults mid-run
# --------------------------------------------------------------------------------------------------
FAST = {"retry-after-ms": "1"}
SECRET_BODY = {"error": {"message": PROVIDER_SECRET, "type": "server_error"}}
PROVIDER_FAULTS = {
    "429-until-retries-run-out": (
        [HTTPError(429, body=SECRET_BODY, headers=FAST) for _ in range(3)],
        "LLM_RATE_LIMITED",
        [429, 429, 429],
        "",
    ),
    "500-until-retries-run-out": (
        [HTTPError(500, body=SECRET_BODY, headers=FAST) for _ in range(3)],
        "LLM_UNAVAILABLE",
        [500, 500, 500],
        "",
    ),
    "stream-stalls-past-the-timeout": (
        [Stall(3, after_chunks=text_chunks("Check the upstream", 1))],
        "LLM_TIMEOUT",
        [None],
        "Check the upstream",
    ),
    "malformed-chunk": (
        [Stream(chunks=[*text_chunks("Check the up", 1), "{not json " + PROVIDER_SECRET])],
        "LLM_BAD_RESPONSE",
        [None],
        "Check the up",
    ),
    "connection-reset-mid-stream": (
        [Reset(after_chunks=text_chunks("Check the", 1))],
        "LLM_UNAVAILABLE",
        [None],
        "Check the",
    ),
}


@pytest.mark.parametrize("fault", PROVIDER_FAULTS, ids=list(PROVIDER_FAULTS))
def test_provider_fault_after_a_tool_fails_the_run_with_its_code_and_a_complete_trace(
    llm, corpus, user, settings, caplog, fault
):
    responses, code, statuses, partial = PROVIDER_FAULTS[fault]
    settings.LLM_TIMEOUT_SECONDS = 0.5
    settings.LLM_MAX_RETRIES = 2
    settings.CHAT_RELEASE = "draft"  # so that what arrived before the fault is visible in the stream
    llm.route("DIAGNOSIS", usage=usage(20, 5))
    llm.add(
        AGENT,
        stream_tool_calls([("c_kb", "lookup_knowledge", '{"query": "nginx 502"}')], usage=usage(30, 5)),
        *responses,
    )
    with caplog.at_level(logging.DEBUG):
        run, outcome, sink = ask(user, "nginx answers 502")

    # The run: FAILED with the fault's code, nothing released.
    assert outcome.status == run.status == RunStatus.FAILED
    assert outcome.error_code == run.error_code == code
    assert run.release_decision is None and run.content == "" and outcome.content == ""
    assert PROVIDER_SECRET not in run.error_message and PROVIDER_SECRET not in caplog.text
    # The stream (draft release): what arrived was shown, recorded as delivered, then error, outcome.
    assert "".join(e.text for e in sink.of_type(DraftEvent)) == partial
    assert run.release_mode == "draft" and run.draft_chars == len(partial)
    assert [type(e) for e in sink.events[-2:]] == [ErrorEvent, OutcomeEvent]
    assert sink.events[-2].code == code and sink.events[-1].status == "FAILED"
    assert [(e.tool_call_id, e.status) for e in sink.of_type(ToolEvent)] == [
        ("c_kb", "RUNNING"),
        ("c_kb", "SUCCEEDED"),
    ]

    # The trace: the tool that ran, the failed call as a step with its attempts, a complete audit.
    tool = ToolInvocation.objects.get(run_id=run.run_id)
    assert tool.status == ToolStatus.SUCCEEDED and tool.output_sha256
    steps = list(AgentStep.objects.filter(run_id=run.run_id).order_by("step_index"))
    assert len(steps) == 2 and steps[0].usage_available
    failed = steps[1]
    assert failed.finish_reason == "error" and not failed.usage_available
    assert [a.get("status") for a in failed.attempts] == statuses
    finished = TraceEvent.objects.get(run_id=run.run_id, event_type=EventType.RUN_FINISHED)
    assert finished.status == "FAILED" and finished.details["errorCode"] == code
    assert not TraceEvent.objects.filter(run_id=run.run_id, event_type=EventType.RELEASE_DECISION).exists()
    summary = get_trace(run=run).summary
    assert summary.audit_complete and summary.audit_write_failures == 0, summary.gaps
    assert "agent step 2 reported no token usage" in summary.gaps
    assert not run.tokens_reconciled and run.usage_unavailable_calls == 1
    for event in TraceEvent.objects.filter(run_id=run.run_id):
        assert PROVIDER_SECRET not in json.dumps(event.details) + event.summary


# --------------------------------------------------------------------------------------------------
# A tool that returns 10 MB
# --------------------------------------------------------------------------------------------------
TEN_MB = 10 * 1024 * 1024


def _big_log() -> str:
    line = "2026-11-29T12:00:00Z upstream=10.0.0.7:8080 status=502 reason=connection refused id={:08d}\n"
    text = "".join(line.format(i) for i in range(TEN_MB // len(line) + 1))
    return text[:TEN_MB]


def test_a_10_mb_tool_output_is_bounded_in_the_audit_and_in_memory(llm, corpus, user):
    def dump_logs(q: str = "") -> ToolResult:
        return ToolResult(data={"log": _big_log()})

    registry = _registry_with("dump_logs", dump_logs)
    llm.route("DIAGNOSIS")
    llm.add(
        AGENT,
        stream_tool_calls(
            [("c_logs", "dump_logs", "{}"), ("c_kb", "lookup_knowledge", '{"query": "nginx 502"}')]
        ),
        _cite_first,
    )
    llm.supported()
    from agent.knowledge.retrieval import search_knowledge

    search_knowledge("warm the index")  # the retrieval index is process state, not per-run memory
    tracemalloc.start()
    try:
        run, outcome, _sink = ask(user, "nginx 502: what do the logs say?", registry=registry)
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert outcome.release_decision == ReleaseDecision.PUBLISHED
    full = canonical_json({"log": _big_log()})
    assert len(full) > TEN_MB
    row = ToolInvocation.objects.get(run_id=run.run_id, tool_call_id="c_logs")
    assert row.status == ToolStatus.SUCCEEDED and row.is_truncated
    assert row.output_length == len(full)
    assert row.output_sha256 == hashlib.sha256(full.encode()).hexdigest()
    assert 0 < len(row.output_preview) <= 500 and full.startswith(row.output_preview.rstrip("…"))
    event = next(
        e
        for e in TraceEvent.objects.filter(run_id=run.run_id, event_type=EventType.TOOL_INVOCATION)
        if e.status == "SUCCEEDED" and e.details.get("toolCallId") == "c_logs"
    )
    assert event.details["outputLength"] == len(full) and len(json.dumps(event.details)) < 2000
    # The model saw a bounded tool message; the canonical store holds the full result.
    sent = [m for m in llm.requests[AGENT][1].messages if m["role"] == "tool"]
    assert max(len(m["content"]) for m in sent) <= 12000
    assert caches["canonical"].get(f"run:{run.run_id}:tool:c_logs") == full
    # No 10 MB value reached the database.
    longest = max(
        len(str(v)) for v in DiagnosisRun.objects.filter(run_id=run.run_id).values().first().values()
    )
    assert longest < 20_000
    # Memory: the output exists a few times at once (tool result, canonical JSON, its UTF-8 bytes for the
    # hash, the store's copy and read-back), never unbounded: peak below 6 × the output.
    print(f"PEAK {peak / 2**20:.1f} MiB")
    assert peak < 6 * TEN_MB, f"peak {peak / 2**20:.1f} MiB"
    assert get_trace(run=run).summary.audit_complete
