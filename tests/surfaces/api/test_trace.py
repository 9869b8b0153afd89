"""The trace read model through the API: shape, run resolution, honest summary and gaps, constant query
count, run list pagination and filters, feedback, and session audits."""

import datetime as dt
import json

import pytest
from django.db import connection
from django.utils import timezone

from audit.models import AgentStep, ToolInvocation, TraceEvent
from audit.write import RunRecorder
from diagnosis import services
from diagnosis.models import ChatSession, DiagnosisRun, RunFeedback, RunStatus
from tests.factories import REASONING_MARKER, issue_token, record_full_run, usage

pytestmark = pytest.mark.django_db

RUN_KEYS = {
    "runId", "sessionId", "query", "status", "agentFlow", "intent", "releaseDecision", "content", "error",
    "provider", "timing", "tokens", "cost", "delivery", "stepCount", "toolCallCount", "feedback",
    "selfEvaluation",
}  # fmt: skip
COST_KEYS = {"amount", "currency", "status", "unpricedCalls", "calls"}
CALL_COST_KEYS = {"sequenceNo", "source", "model", "amount", "status", "priceSource"}
DELIVERY_KEYS = {"releaseMode", "unverifiedTextDelivered", "draftChars"}
PROVIDER_KEYS = {"name", "demo"}
TIMING_KEYS = {
    "createdAt", "startedAt", "firstModelRequestAt", "firstOutputAt", "finishedAt", "totalDurationMs",
    "firstOutputLatencyMs", "lastTokenAt", "releaseLatencyMs",
}  # fmt: skip
TOKEN_KEYS = {
    "router", "agent", "guard", "total", "reasoning", "cachedInput", "usageAvailable", "reconciled",
    "unavailableCalls", "modelCalls", "reasoningUnreportedCalls", "cachedUnreportedCalls",
    "callsWithoutUsage", "differences", "byAgent",
}  # fmt: skip
EVENT_KEYS = {"sequenceNo", "phase", "eventType", "status", "summary", "details", "createdAt", "hash"}
STEP_KEYS = {
    "stepIndex", "agentName", "model", "hasToolCall", "finishReason", "durationMs", "promptTokens",
    "completionTokens", "reasoningTokens", "cachedTokens", "totalTokens", "usageAvailable",
    "reasoningAvailable", "reasoningBytes", "assistantBytes", "contentSource",
}  # fmt: skip
TOOL_KEYS = {
    "toolCallId", "providerToolCallId", "stepIndex", "agentName", "toolName", "status", "inputParams",
    "outputPreview", "outputLength", "outputSha256", "isTruncated", "retrievalLayer", "l0MatchCount",
    "l1MatchCount", "retrievalDetails", "startedAt", "finishedAt", "durationMs", "errorCode", "errorMessage",
}  # fmt: skip


def _trace(client, run, **params):
    query = "&".join(f"{k}={v}" for k, v in params.items())
    response = client.get(f"/api/diagnosis/{run.session_id}/trace" + (f"?{query}" if query else ""))
    assert response.status_code == 200, response.content
    return response.json()


# --------------------------------------------------------------------------------------------------
# Shape and resolution
# --------------------------------------------------------------------------------------------------
def test_trace_has_every_contract_key_and_is_complete(api_client, user, traced_run):
    api_client.force_login(user)
    body = _trace(api_client, traced_run, runId=traced_run.run_id)
    assert set(body) == {
        "sessionId",
        "runResolution",
        "run",
        "timeline",
        "steps",
        "tools",
        "summary",
        "reviews",
    }
    assert body["sessionId"] == traced_run.session_id and body["runResolution"] == "EXACT"
    run = body["run"]
    assert set(run) == RUN_KEYS
    assert set(run["timing"]) == TIMING_KEYS and set(run["tokens"]) == TOKEN_KEYS
    assert set(run["delivery"]) == DELIVERY_KEYS
    assert run["delivery"] == {"releaseMode": "verified", "unverifiedTextDelivered": False, "draftChars": 0}
    # This record's steps carry no times: the latency is unknown, hence null (never a made-up 0).
    assert run["timing"]["releaseLatencyMs"] is None and run["timing"]["lastTokenAt"] is None
    assert (
        run["status"] == "SUCCESS" and run["releaseDecision"] == "PUBLISHED" and run["intent"] == "DIAGNOSIS"
    )
    assert run["error"] is None and run["feedback"] is None
    assert run["stepCount"] == 2 and run["toolCallCount"] == 2
    tokens = run["tokens"]
    assert (
        tokens["usageAvailable"] is True and tokens["reconciled"] is True and tokens["unavailableCalls"] == 0
    )
    assert tokens["total"] == tokens["router"] + tokens["agent"] + tokens["guard"] == traced_run.tokens_total
    # The fixture's models (router-m, agent-m, guard-m) have no price: cost unavailable, each call named.
    cost = run["cost"]
    assert set(cost) == COST_KEYS and all(set(c) == CALL_COST_KEYS for c in cost["calls"])
    assert (cost["amount"], cost["status"], cost["currency"]) == (None, "unavailable", "USD")
    assert cost["unpricedCalls"] == len(cost["calls"]) == traced_run.model_calls
    assert {c["status"] for c in cost["calls"]} == {"unknown_model"}
    usage_seqs = [e["sequenceNo"] for e in body["timeline"] if e["eventType"] == "MODEL_TOKEN_USAGE"]
    assert [c["sequenceNo"] for c in cost["calls"]] == usage_seqs
    assert all(set(e) == EVENT_KEYS for e in body["timeline"])
    assert [e["sequenceNo"] for e in body["timeline"]] == list(range(1, len(body["timeline"]) + 1))
    assert body["timeline"][0]["eventType"] == "RUN_STARTED"
    assert body["timeline"][-1]["eventType"] == "RUN_FINISHED"
    assert all(set(s) == STEP_KEYS for s in body["steps"]) and len(body["steps"]) == 2
    assert body["steps"][0]["reasoningAvailable"] is True and body["steps"][0]["reasoningBytes"] > 0
    assert all(set(t) == TOOL_KEYS for t in body["tools"]) and len(body["tools"]) == 2
    assert body["tools"][0]["status"] == "SUCCEEDED" and body["tools"][0]["outputLength"] > 500
    assert body["tools"][0]["isTruncated"] is True and len(body["tools"][0]["outputPreview"]) == 500
    summary = body["summary"]
    n = len(body["timeline"])
    assert summary == {
        "persisted": {"events": n, "steps": 2, "tools": 2},
        "expected": {"events": n, "steps": 2, "tools": 2},
        "returned": {"events": n, "steps": 2, "tools": 2},
        "auditComplete": True,
        "auditWriteFailures": 0,
        "fencedWrites": 0,
        "chainValid": True,
        "rowsVerified": True,
        "rowsVerifiedCount": 7,  # 2 steps, 2 tools, 2 reasoning rows, the run's terminal summary
        "anchor": None,  # no checkpoint yet (tests/surfaces/api/test_evidence.py covers anchored runs)
        "gaps": [],
    }
    assert REASONING_MARKER not in json.dumps(body)


def test_without_run_id_the_latest_run_is_resolved(api_client, user, chat_session, traced_run):
    later = services.create_run(session=chat_session, query="second question")
    DiagnosisRun.objects.filter(pk=later.pk).update(created_at=timezone.now() + dt.timedelta(seconds=5))
    api_client.force_login(user)
    body = _trace(api_client, traced_run)
    assert body["runResolution"] == "LATEST" and body["run"]["runId"] == later.run_id
    exact = _trace(api_client, traced_run, runId=traced_run.run_id)
    assert exact["runResolution"] == "EXACT" and exact["run"]["runId"] == traced_run.run_id


def test_a_session_without_runs_has_no_trace(api_client, user):
    session = services.create_session(owner=user)
    api_client.force_login(user)
    response = api_client.get(f"/api/diagnosis/{session.session_id}/trace")
    assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"


def test_the_viewers_own_feedback_is_in_the_trace(api_client, user, staff_user, traced_run):
    RunFeedback.objects.create(run=traced_run, user=staff_user, rating="down", comment="staff says no")
    api_client.force_login(user)
    assert _trace(api_client, traced_run, runId=traced_run.run_id)["run"]["feedback"] is None
    url = f"/api/diagnosis/{traced_run.session_id}/runs/{traced_run.run_id}/feedback"
    assert api_client.post(url, {"rating": "up", "comment": "spot on"}, format="json").status_code == 201
    feedback = _trace(api_client, traced_run, runId=traced_run.run_id)["run"]["feedback"]
    assert feedback["rating"] == "up" and feedback["comment"] == "spot on" and feedback["createdAt"]
    api_client.force_login(staff_user)
    assert _trace(api_client, traced_run, runId=traced_run.run_id)["run"]["feedback"]["rating"] == "down"


# --------------------------------------------------------------------------------------------------
# Honest summary
# --------------------------------------------------------------------------------------------------
def test_a_running_run_is_not_complete(api_client, user, run):
    rec = RunRecorder.for_run(run)
    rec.run_started()
    api_client.force_login(user)
    summary = _trace(api_client, run, runId=run.run_id)["summary"]
    assert summary["auditComplete"] is False
    assert "run still RUNNING" in summary["gaps"]
    assert summary["chainValid"] is True


def test_a_deleted_event_breaks_the_chain_and_shows_as_a_gap(api_client, user, traced_run):
    TraceEvent.objects.filter(run_id=traced_run.run_id, sequence_no=4).delete()
    api_client.force_login(user)
    body = _trace(api_client, traced_run, runId=traced_run.run_id)
    summary = body["summary"]
    assert summary["chainValid"] is False and summary["auditComplete"] is False
    expected = summary["expected"]["events"]
    assert summary["persisted"]["events"] == summary["returned"]["events"] == expected - 1
    assert "1 timeline event expected but not stored" in summary["gaps"]
    assert "hash chain: sequence gap: 4 missing" in summary["gaps"]


def test_a_tampered_event_is_detected(api_client, user, traced_run):
    TraceEvent.objects.filter(run_id=traced_run.run_id, sequence_no=2).update(summary="rewritten")
    api_client.force_login(user)
    summary = _trace(api_client, traced_run, runId=traced_run.run_id)["summary"]
    assert summary["chainValid"] is False and summary["auditComplete"] is False
    assert "hash chain: sequence 2: stored hash does not match its content" in summary["gaps"]


@pytest.mark.parametrize("row", ["step", "tool", "reasoning", "review"])
def test_a_tampered_bound_row_is_named_by_the_endpoint(api_client, staff_user, traced_run, row):
    """Every bound row is verified on every read of the endpoint: one changed column of a step, a tool
    call, a reasoning row (as stored) or a review makes the trace incomplete and names that row."""
    from audit.write.reviews import record_review
    from reasoning.models import AgentReasoningAudit

    staff_user.is_superuser = True
    staff_user.save()
    record_review(run=traced_run, user=staff_user, verdict="correct", note="checked")
    api_client.force_login(staff_user)
    before = _trace(api_client, traced_run, runId=traced_run.run_id)["summary"]
    assert before["auditComplete"] and before["rowsVerified"], before["gaps"]
    run_id = traced_run.run_id
    if row == "step":
        AgentStep.objects.filter(run_id=run_id, step_index=1).update(finish_reason="stop")
        named = "model step 1: stored row does not match its digest"
    elif row == "tool":
        ToolInvocation.objects.filter(run_id=run_id, tool_call_id="call_1").update(output_length=1)
        named = "tool call call_1: stored row does not match its digest"
    elif row == "reasoning":
        first = AgentReasoningAudit.objects.filter(run_id=run_id).order_by("id").first()
        AgentReasoningAudit.objects.filter(pk=first.pk).update(content_bytes=first.content_bytes + 1)
        named = "reasoning row for step"
    else:
        from audit.models import RunReview

        RunReview.objects.filter(run_id=run_id).update(note="rewritten")
        named = "review "
    summary = _trace(api_client, traced_run, runId=run_id)["summary"]
    assert summary["auditComplete"] is False and summary["rowsVerified"] is False
    assert summary["chainValid"] is True
    assert any(g.startswith(named) and "does not match its digest" in g for g in summary["gaps"]), summary[
        "gaps"
    ]


def test_lost_step_and_tool_rows_and_write_failures_are_named(api_client, user, traced_run):
    AgentStep.objects.filter(run_id=traced_run.run_id, step_index=1).delete()
    ToolInvocation.objects.filter(run_id=traced_run.run_id).delete()
    DiagnosisRun.objects.filter(pk=traced_run.pk).update(audit_write_failures=3)
    api_client.force_login(user)
    summary = _trace(api_client, traced_run, runId=traced_run.run_id)["summary"]
    assert summary["auditComplete"] is False and summary["chainValid"] is True
    assert summary["auditWriteFailures"] == 3
    assert "1 model step expected but not stored" in summary["gaps"]
    assert "2 tool invocations expected but not stored" in summary["gaps"]
    assert "3 audit write failures recorded" in summary["gaps"]


@pytest.mark.parametrize("column", ["owner", "created_at"])
def test_a_changed_session_row_is_named_by_the_trace_as_by_verify_audit(
    api_client, staff_user, other_user, traced_run, column
):
    """The run's session is bound at RUN_STARTED (form `session`: id, owner, creation time): a conversation
    moved to another owner, or its creation time rewritten, is named by `verify_audit` and by the trace."""
    from audit.verify.runs import verify_run

    change = {"owner": other_user, "created_at": timezone.now() - dt.timedelta(days=3)}[column]
    ChatSession.objects.filter(session_id=traced_run.session_id).update(**{column: change})
    named = f"session {traced_run.session_id}: stored owner or creation time does not match its digest"
    assert any(p.startswith(named) for p in verify_run(traced_run.run_id).invalid)
    api_client.force_login(staff_user)  # the staff see every session, whoever owns it now
    summary = _trace(api_client, traced_run, runId=traced_run.run_id)["summary"]
    assert summary["auditComplete"] is False
    assert any(g.startswith(named) for g in summary["gaps"]), summary["gaps"]
    assert summary["chainValid"] is True


def test_a_row_of_another_session_under_the_run_id_is_not_returned(api_client, user, traced_run):
    ToolInvocation.objects.filter(run_id=traced_run.run_id, tool_call_id="call_1").update(session_id="ses_x")
    api_client.force_login(user)
    body = _trace(api_client, traced_run, runId=traced_run.run_id)
    assert [t["toolCallId"] for t in body["tools"]] == ["call_0"]
    summary = body["summary"]
    assert summary["persisted"]["tools"] == 2 and summary["returned"]["tools"] == 1
    assert "1 tool invocation stored under this run but another session" in summary["gaps"]
    assert summary["auditComplete"] is False


def test_missing_provider_usage_is_named_but_the_audit_is_complete(api_client, user, run):
    from audit.write import Usage
    from reasoning.capture import build_capture

    rec = RunRecorder.for_run(run)
    rec.run_started()
    rec.model_step(
        step_index=1,
        agent_name="diagnosis_agent",
        model="agent-m",
        usage=Usage.unavailable(),
        reasoning=build_capture(reasoning=None, text="answer"),
        finish_reason="stop",
    )
    rec.finish(status=RunStatus.SUCCESS, content="answer")
    api_client.force_login(user)
    body = _trace(api_client, run, runId=run.run_id)
    assert body["run"]["tokens"]["usageAvailable"] is False
    assert body["run"]["tokens"]["unavailableCalls"] == 1 and body["run"]["tokens"]["reconciled"] is False
    assert body["steps"][0]["usageAvailable"] is False and body["steps"][0]["totalTokens"] is None
    assert body["summary"]["gaps"] == ["agent step 1 reported no token usage"]
    assert body["summary"]["auditComplete"] is True


def test_a_failed_run_shows_its_error(api_client, user, run):
    rec = RunRecorder.for_run(run)
    rec.run_started()
    rec.finish(status=RunStatus.FAILED, error_code="LLM_UNAVAILABLE", error_message="provider timed out")
    api_client.force_login(user)
    run_body = _trace(api_client, run, runId=run.run_id)["run"]
    assert run_body["status"] == "FAILED"
    assert run_body["error"] == {"code": "LLM_UNAVAILABLE", "message": "provider timed out"}


# --------------------------------------------------------------------------------------------------
# Constant query count
# --------------------------------------------------------------------------------------------------
def _events_of(run):
    return TraceEvent.objects.filter(run_id=run.run_id).count()


@pytest.mark.parametrize("auth", ["session", "token"])
def test_trace_query_count_is_constant_from_5_to_500_events(
    api_client, user, chat_session, django_assert_max_num_queries, auth
):
    small = services.create_run(session=chat_session, query="small")
    rec = RunRecorder.for_run(small)
    rec.run_started()
    rec.routing_attempt(attempt=1, model="router-m", usage=usage(10, 2), ok=True, intent="CHITCHAT")
    rec.routing_decision(intent="CHITCHAT", confidence=0.9, reason="greeting", fallback=False)
    rec.finish(status=RunStatus.SUCCESS, content="hello")
    assert _events_of(small) == 5

    big = services.create_run(session=chat_session, query="big")
    record_full_run(big, extra_steps=242)
    assert _events_of(big) >= 500

    if auth == "session":
        api_client.force_login(user)
    else:
        api_client.credentials(HTTP_AUTHORIZATION=f"Token {issue_token(user)}")
    RunFeedback.objects.create(run=big, user=user, rating="up")

    counts = {}
    for run in (small, big):
        # Run with feedback, events, steps, tools, the reasoning rows' stored columns (for their digests,
        # never decrypted), its reviews, the rows appended events bind (evaluation scores, one query per
        # source of `audit.verify.appended_rows`), the run's leaf in the transparency log, the price
        # overrides, plus two for the session, or three for a token (its row by prefix, and axes' lockout
        # counts for the address and the user).
        with django_assert_max_num_queries(11 if auth == "session" else 12) as captured:
            body = _trace(api_client, run, runId=run.run_id)
        counts[run.run_id] = len(captured.captured_queries)
        assert body["summary"]["returned"]["events"] == _events_of(run)
    assert counts[small.run_id] == counts[big.run_id]
    assert connection.vendor in ("sqlite", "mysql")


# --------------------------------------------------------------------------------------------------
# Run list: pagination and filters
# --------------------------------------------------------------------------------------------------
@pytest.fixture
def many_runs(chat_session):
    base = timezone.now() - dt.timedelta(days=10)
    runs = []
    for i in range(25):
        run = services.create_run(session=chat_session, query=f"question {i}")
        status = [RunStatus.SUCCESS, RunStatus.FAILED, RunStatus.RUNNING][i % 3]
        DiagnosisRun.objects.filter(pk=run.pk).update(
            created_at=base + dt.timedelta(hours=i),
            status=status,
            release_decision="PUBLISHED" if status == RunStatus.SUCCESS else None,
            intent="DIAGNOSIS" if i % 2 else "KNOWLEDGE",
        )
        runs.append(run)
    return runs


def test_runs_are_cursor_paginated_newest_first(api_client, user, chat_session, many_runs):
    api_client.force_login(user)
    url = f"/api/diagnosis/{chat_session.session_id}/runs/"
    first = api_client.get(url).json()
    assert set(first) == {"next", "previous", "results"}
    assert len(first["results"]) == 20 and first["previous"] is None
    assert first["results"][0]["runId"] == many_runs[-1].run_id
    assert "cursor=" in first["next"]
    second = api_client.get(first["next"]).json()
    assert len(second["results"]) == 5 and second["next"] is None and second["previous"]
    assert second["results"][-1]["runId"] == many_runs[0].run_id
    assert {r["runId"] for r in first["results"] + second["results"]} == {r.run_id for r in many_runs}
    back = api_client.get(second["previous"]).json()
    assert [r["runId"] for r in back["results"]] == [r["runId"] for r in first["results"]]
    small = api_client.get(url + "?pageSize=7").json()
    assert len(small["results"]) == 7
    invalid = api_client.get(url + "?cursor=not-a-cursor")
    assert invalid.status_code == 404 and invalid.json()["error"]["code"] == "not_found"


def test_runs_filters(api_client, user, chat_session, many_runs):
    api_client.force_login(user)
    url = f"/api/diagnosis/{chat_session.session_id}/runs/"

    def ids(query):
        response = api_client.get(url + "?" + query + "&pageSize=100")
        assert response.status_code == 200, response.content
        return {r["runId"] for r in response.json()["results"]}

    assert ids("status=FAILED") == {r.run_id for i, r in enumerate(many_runs) if i % 3 == 1}
    assert ids("releaseDecision=PUBLISHED") == {r.run_id for i, r in enumerate(many_runs) if i % 3 == 0}
    assert ids("intent=KNOWLEDGE") == {r.run_id for i, r in enumerate(many_runs) if i % 2 == 0}
    assert ids("status=SUCCESS&intent=DIAGNOSIS") == {r.run_id for i, r in enumerate(many_runs) if i % 6 == 3}
    after = DiagnosisRun.objects.get(pk=many_runs[20].pk).created_at.isoformat()
    assert ids(f"createdAfter={after.replace('+', '%2B')}") == {r.run_id for r in many_runs[20:]}
    before = "2000-01-01T00:00:00Z"
    assert ids(f"createdBefore={before}") == set()


@pytest.mark.parametrize(
    "query",
    [
        "status=DONE",
        "releaseDecision=published",
        "intent=WHATEVER",
        "createdAfter=yesterday",
        "createdBefore=2026-13-01",
        "createdAfter=2026-02-01T00:00:00Z&createdBefore=2026-01-01T00:00:00Z",
    ],
)
def test_invalid_filters_are_400_in_the_error_shape(api_client, user, chat_session, query):
    api_client.force_login(user)
    response = api_client.get(f"/api/diagnosis/{chat_session.session_id}/runs/?{query}")
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_request" and error["message"] and error["fields"]


# --------------------------------------------------------------------------------------------------
# Feedback
# --------------------------------------------------------------------------------------------------
def test_feedback_is_one_per_user_and_run_and_a_second_replaces_it(api_client, user, staff_user, traced_run):
    url = f"/api/diagnosis/{traced_run.session_id}/runs/{traced_run.run_id}/feedback"
    api_client.force_login(user)
    first = api_client.post(url, {"rating": "up", "comment": "good"}, format="json")
    assert first.status_code == 201
    assert first.json()["rating"] == "up" and first.json()["runId"] == traced_run.run_id
    second = api_client.post(url, {"rating": "down"}, format="json")
    assert second.status_code == 201
    assert RunFeedback.objects.filter(run=traced_run, user=user).count() == 1
    stored = RunFeedback.objects.get(run=traced_run, user=user)
    assert stored.rating == "down" and stored.comment == ""
    api_client.force_login(staff_user)
    assert api_client.post(url, {"rating": "up"}, format="json").status_code == 201
    assert RunFeedback.objects.filter(run=traced_run).count() == 2


@pytest.mark.parametrize(
    "body",
    [{}, {"rating": "meh"}, {"rating": "up", "comment": "x" * 2001}, {"rating": None}],
)
def test_invalid_feedback_is_400(api_client, user, traced_run, body):
    api_client.force_login(user)
    url = f"/api/diagnosis/{traced_run.session_id}/runs/{traced_run.run_id}/feedback"
    response = api_client.post(url, body, format="json")
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_request"
    assert not RunFeedback.objects.exists()


def test_malformed_json_is_400(api_client, user, traced_run):
    api_client.force_login(user)
    url = f"/api/diagnosis/{traced_run.session_id}/runs/{traced_run.run_id}/feedback"
    response = api_client.post(url, "{not json", content_type="application/json")
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_request"


# --------------------------------------------------------------------------------------------------
# Session audits
# --------------------------------------------------------------------------------------------------
def test_session_audits_oldest_first_without_content(api_client, superuser, chat_session, traced_run):
    second = services.create_run(session=chat_session, query="again")
    record_full_run(second, tools=1)
    api_client.force_login(superuser)
    body = api_client.get(f"/api/diagnosis/{chat_session.session_id}/audits").json()
    assert body["truncated"] is False
    audits = body["audits"]
    assert len(audits) == 2 + 2 + 2 + 1  # steps and tools of both runs
    assert [a["createdAt"] for a in audits] == sorted(a["createdAt"] for a in audits)
    kinds = {(a["kind"], a["runId"]) for a in audits}
    assert ("MODEL_STEP", traced_run.run_id) in kinds and ("TOOL", second.run_id) in kinds
    step = next(a for a in audits if a["kind"] == "MODEL_STEP")
    assert step["tool"] is None and set(step["step"]) == STEP_KEYS
    tool = next(a for a in audits if a["kind"] == "TOOL")
    assert tool["step"] is None and set(tool["tool"]) == TOOL_KEYS
    assert REASONING_MARKER not in json.dumps(body)


def test_session_audits_are_truncated_to_the_newest_500(api_client, superuser, chat_session):
    run = services.create_run(session=chat_session, query="long")
    now = timezone.now()
    AgentStep.objects.bulk_create(
        AgentStep(
            run_id=run.run_id,
            session_id=chat_session.session_id,
            step_index=i,
            agent_name="diagnosis_agent",
            model="m",
            created_at=now + dt.timedelta(seconds=i),
        )
        for i in range(1, 491)
    )
    ToolInvocation.objects.bulk_create(
        ToolInvocation(
            run_id=run.run_id,
            session_id=chat_session.session_id,
            tool_call_id=f"call_{i}",
            tool_name="lookup_knowledge",
            status="SUCCEEDED",
            created_at=now + dt.timedelta(seconds=i, milliseconds=500),
            updated_at=now,
        )
        for i in range(1, 21)
    )
    api_client.force_login(superuser)
    body = api_client.get(f"/api/diagnosis/{chat_session.session_id}/audits").json()
    assert body["truncated"] is True and len(body["audits"]) == 500
    # 510 records: the 10 oldest (steps 1..10 and tools 1..5 interleave; the oldest ten are dropped)
    first = dt.datetime.fromisoformat(body["audits"][0]["createdAt"])
    assert first == now + dt.timedelta(seconds=6)
    assert body["audits"][0]["kind"] == "MODEL_STEP" and body["audits"][0]["step"]["stepIndex"] == 6
    assert body["audits"][-1]["kind"] == "MODEL_STEP" and body["audits"][-1]["step"]["stepIndex"] == 490
    assert [a["createdAt"] for a in body["audits"]] == sorted(a["createdAt"] for a in body["audits"])
    AgentStep.objects.filter(run_id=run.run_id, step_index__lte=10).delete()
    body = api_client.get(f"/api/diagnosis/{chat_session.session_id}/audits").json()
    assert body["truncated"] is False and len(body["audits"]) == 500


@pytest.mark.parametrize(
    "query",
    [
        "",
        "runId=run_01a24c97c6094f4c8d2a1b3c4d5e6f70",
        "runId=a",
        "runId=" + "x" * 64,
        "runId=" + "x" * 65,
        "runId=",
        "runId=%20run_1%20",
        "runId=run%001",
        "runId=r%C3%BCn",
        "runId=a&runId=b",
        "runId=a&runId=",
        "other=1",
    ],
)
def test_the_run_id_taken_directly_is_the_query_serializers(query):
    """`TraceApi.run_id_of` takes a plain run id without building `QuerySerializer`: for every query it
    returns what the serializer validates, and refuses (400) what it refuses."""
    from django.http import QueryDict
    from rest_framework.exceptions import ValidationError

    from surfaces.api.audit import TraceApi

    params = QueryDict(query)
    serializer = TraceApi.QuerySerializer(data=params)
    if serializer.is_valid():
        assert TraceApi.run_id_of(params) == serializer.validated_data.get("runId")
    else:
        with pytest.raises(ValidationError) as refused:
            TraceApi.run_id_of(params)
        assert refused.value.detail == serializer.errors
