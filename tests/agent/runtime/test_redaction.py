"""Issue 33: secrets pasted into the chat question and returned by a tool never reach the provider, a
table, a log, the canonical store or an OpenTelemetry span; the run records REDACTION_APPLIED with kinds,
counts and keyed HMACs that verify with the key; the chat is told what was redacted before the answer —
on runs the real runtime executed against the fake OpenAI-compatible server."""

from __future__ import annotations

import json
import logging

import pytest

from agent.redaction import verify_hmac
from agent.runtime.canonical import CanonicalStore
from agent.runtime.events import OutcomeEvent, ProgressEvent, Stage
from agent.runtime.tools.registry import FLOW_CHAT, EvidenceRecord, ToolResult, default_registry
from audit.models import EventType, ToolInvocation, TraceEvent
from audit.read import get_trace
from diagnosis.models import ReleaseDecision, RunStatus
from telemetry.spans import project_trace
from tests.agent.leaks import found_in_logs, found_in_requests, found_in_spans, found_in_tables
from tests.agent.runtime.support import AGENT, GUARD, ROUTE, ROUTER, VERDICT, ask
from tests.agent.secrets_corpus import (
    ALL_ORIGINALS,
    AWS_KEY_ID,
    AWS_SECRET,
    DB_PASSWORD,
    GCP_KEY_ID,
    GCP_PEM,
    GITHUB_TOKEN,
    JWT,
    PEM,
    PG,
    SLACK_TOKEN,
    pasted_all,
)
from tests.fakes.openai_server import stream_answer, stream_tool_calls, usage

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("runtime_pools", "corpus"),
]

KEY = "redaction-test-key-0123456789abcdef0123456789"
# Originals whose whole value is one redaction (the HMAC of each must be in the chain).
EXACT = [AWS_KEY_ID, AWS_SECRET, GITHUB_TOKEN, SLACK_TOKEN, JWT, DB_PASSWORD, GCP_KEY_ID, GCP_PEM, PEM]


def _registry():
    """The chat tools plus `read_log`, which returns the corpus as data, evidence and model content."""
    registry = default_registry(flow=FLOW_CHAT).copy()

    @registry.tool(
        name="read_log",
        description="Read the application's log.",
        parameters={
            "type": "object",
            "properties": {"path": {"type": "string", "maxLength": 2000}},
            "required": ["path"],
            "additionalProperties": False,
        },
    )
    def read_log(path: str) -> ToolResult:
        text = f"log of {path}:\n{pasted_all()}"
        return ToolResult(
            data={"path": path, "lines": text.splitlines()},
            evidence=[EvidenceRecord("kb:disk-full#1", {"id": "kb:disk-full#1", "text": text})],
            model_content=f"[kb:disk-full#1] {text}",
        )

    return registry


def _script(llm, tool_arguments: dict) -> None:
    llm.add(ROUTER, stream_answer(ROUTE, usage=usage(40, 10)))
    llm.add(
        AGENT,
        stream_tool_calls([("call_1", "read_log", json.dumps(tool_arguments))], usage=usage(200, 20)),
        stream_answer(
            "The key [REDACTED:aws-access-key#1] is in the log [kb:disk-full#1].", usage=usage(300, 30)
        ),
    )
    llm.add(GUARD, stream_answer(VERDICT, usage=usage(100, 10)))


@pytest.fixture
def keyed(settings):
    settings.REDACTION_HMAC_KEY = KEY
    settings.REDACTION_MODE = "enforce"
    settings.OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT = True  # previews of tool input/output


def test_secrets_in_the_question_tool_input_and_output_are_redacted_everywhere(llm, user, keyed, caplog):
    caplog.set_level(logging.DEBUG)
    _script(llm, {"path": f"{PG}://app_user:{DB_PASSWORD}@db-primary.internal:5432/orders"})
    question = f"The orders app fails after the deploy. Here is what I have:\n{pasted_all()}"
    run, outcome, sink = ask(user, question, registry=_registry())
    assert run.status == RunStatus.SUCCESS and outcome.release_decision == ReleaseDecision.PUBLISHED

    # Stored and sent as placeholders, the same one for the same key in the question and the tool.
    assert "[REDACTED:aws-access-key#1]" in run.query and "[REDACTED:private-key#" in run.query
    first = llm.requests[AGENT][0]
    user_text = next(m["content"] for m in first.messages if m["role"] == "user")
    assert "[REDACTED:aws-access-key#1]" in user_text
    tool_text = next(m["content"] for m in llm.requests[AGENT][1].messages if m["role"] == "tool")
    assert "[REDACTED:aws-access-key#1]" in tool_text and "[REDACTED:aws-access-key#2]" not in tool_text
    # The model's tool argument held the question's database password: the question's placeholder.
    assert f"{PG}://app_user:[REDACTED:url-password#2]@" in run.query
    (tool,) = ToolInvocation.objects.filter(run_id=run.run_id)
    assert tool.input_params == {
        "path": f"{PG}://app_user:[REDACTED:url-password#2]@db-primary.internal:5432/orders"
    }

    # The original is nowhere.
    assert found_in_requests(llm.requests, ALL_ORIGINALS) == []
    assert found_in_tables(ALL_ORIGINALS) == []
    assert found_in_logs(caplog.records, ALL_ORIGINALS) == []
    store = CanonicalStore(run.run_id)
    canonical = json.dumps([store.get_result(tool.tool_call_id), store.get_evidence(["kb:disk-full#1"])])
    assert "[REDACTED:aws-access-key#1]" in canonical
    assert [o for o in ALL_ORIGINALS if o in canonical or json.dumps(o)[1:-1] in canonical] == []
    trace = get_trace(run=run)
    assert trace.summary.chain_valid and trace.summary.audit_complete, trace.summary.gaps
    assert found_in_spans(project_trace(trace), ALL_ORIGINALS) == []

    # REDACTION_APPLIED after RUN_STARTED, per source; each original's HMAC verifies with the key only.
    events = list(TraceEvent.objects.filter(run_id=run.run_id).order_by("sequence_no"))
    types = [e.event_type for e in events]
    assert types[:2] == [EventType.RUN_STARTED, EventType.REDACTION_APPLIED]
    redactions = [e for e in events if e.event_type == EventType.REDACTION_APPLIED]
    assert [e.details["source"] for e in redactions] == ["question", "tool_input", "tool_output"]
    question_event = redactions[0].details
    assert question_event["counts"]["aws-access-key"] == 1 and question_event["algorithm"] == "HMAC-SHA256"
    digests = [i["hmac"] for e in redactions for i in e.details["items"]]
    for original in EXACT:
        assert any(verify_hmac(KEY.encode(), original, d) for d in digests), original[:12]
        assert not any(verify_hmac(b"another-key-0123456789abcdef0123456789", original, d) for d in digests)
    # Every placeholder names one original: the tool's repeats of the question's keys add nothing new.
    placeholders = [i["placeholder"] for e in redactions for i in e.details["items"]]
    assert len(placeholders) == len(set(placeholders))
    assert redactions[2].details["toolCallId"] == tool.tool_call_id

    # The chat was told (kinds and counts only) before the answer.
    frames = [e for e in sink.events if isinstance(e, ProgressEvent) and e.stage == Stage.REDACTION]
    assert frames and frames[0].redacted["aws-access-key"] == 1 and frames[0].verdict == "APPLIED"
    assert sink.events.index(frames[0]) < sink.events.index(sink.of_type(OutcomeEvent)[0])
    assert not any(o in str(frames) for o in ALL_ORIGINALS)


def test_ordinary_questions_are_untouched_and_record_no_redaction(llm, user, keyed):
    llm.add(ROUTER, stream_answer(ROUTE, usage=usage(40, 10)))
    llm.add(AGENT, stream_answer("Rotate the logs [kb:disk-full#1].", usage=usage(300, 30)))
    question = (
        "Disk full on /var/log of db-1 (10.0.3.4), see [kb:disk-full#2]; sha 4bf92f3577b34da6a3ce929d0e0e4736"
    )
    run, _outcome, sink = ask(user, question)
    assert run.query == question and run.redaction is None
    assert not TraceEvent.objects.filter(run_id=run.run_id, event_type=EventType.REDACTION_APPLIED).exists()
    assert not [e for e in sink.events if isinstance(e, ProgressEvent) and e.stage == Stage.REDACTION]


def test_mode_off_sends_the_text_as_pasted(llm, user, keyed, settings):
    settings.REDACTION_MODE = "off"
    llm.add(ROUTER, stream_answer(ROUTE, usage=usage(40, 10)))
    llm.add(AGENT, stream_answer("See [kb:disk-full#1].", usage=usage(300, 30)))
    llm.add(GUARD, stream_answer(VERDICT, usage=usage(100, 10)))
    run, _outcome, _sink = ask(user, f"disk full, key {AWS_KEY_ID}")
    assert AWS_KEY_ID in run.query and run.redaction is None
    assert found_in_requests(llm.requests, [AWS_KEY_ID])


def test_previous_turns_stored_before_redaction_are_redacted_on_their_way_to_the_model(llm, user, keyed):
    from diagnosis import services
    from diagnosis.models import DiagnosisRun

    session = services.create_session(owner=user)
    legacy = services.create_run(session=session, query=f"disk full, our key is {AWS_KEY_ID}")
    DiagnosisRun.objects.filter(pk=legacy.pk).update(
        status=RunStatus.SUCCESS, release_decision=ReleaseDecision.PUBLISHED, content=f"Rotate {AWS_KEY_ID}."
    )
    llm.add(ROUTER, stream_answer(ROUTE, usage=usage(40, 10)))
    llm.add(AGENT, stream_answer("Rotate the logs [kb:disk-full#1].", usage=usage(300, 30)))
    llm.add(GUARD, stream_answer(VERDICT, usage=usage(100, 10)))
    run, _outcome, _sink = ask(user, "And after the rotation?", session_id=session.session_id)

    assert found_in_requests(llm.requests, [AWS_KEY_ID]) == []
    sent = json.dumps(llm.requests[AGENT][0].messages)
    assert sent.count("[REDACTED:aws-access-key#1]") == 2  # the old question and the old answer
    (event,) = TraceEvent.objects.filter(run_id=run.run_id, event_type=EventType.REDACTION_APPLIED)
    assert event.details["source"] == "previous_turns" and event.details["counts"] == {"aws-access-key": 2}
    assert verify_hmac(KEY.encode(), AWS_KEY_ID, event.details["items"][0]["hmac"])


def test_an_auditor_with_the_key_confirms_which_value_was_pasted(llm, user, keyed, monkeypatch):
    import io
    import sys

    from django.core.management import CommandError, call_command

    llm.add(ROUTER, stream_answer(ROUTE, usage=usage(40, 10)))
    llm.add(AGENT, stream_answer("See [kb:disk-full#1].", usage=usage(300, 30)))
    run, _outcome, _sink = ask(user, f"disk full, key {AWS_KEY_ID}, dsn {PG}://u:{DB_PASSWORD}@db/x")

    monkeypatch.setattr(sys, "stdin", io.StringIO(f"{DB_PASSWORD}\nnot-the-key\n"))
    out = io.StringIO()
    call_command("verify_redaction", run.run_id, stdout=out)
    assert out.getvalue().splitlines() == [
        "value 1: [REDACTED:url-password#1] (sequence 2, question)",
        "value 2: no match",
    ]
    monkeypatch.setattr(sys, "stdin", io.StringIO("AKIA" + "0000000000000000\n"))
    with pytest.raises(CommandError):
        call_command("verify_redaction", run.run_id, stdout=io.StringIO())


def test_pii_masking_when_configured_uses_the_same_mechanism(llm, user, keyed, settings):
    settings.PII_MASKING = True
    settings.PII_MASKING_KINDS = ["email"]
    llm.add(ROUTER, stream_answer(ROUTE, usage=usage(40, 10)))
    llm.add(AGENT, stream_answer("See [kb:disk-full#1].", usage=usage(300, 30)))
    run, _outcome, _sink = ask(user, "disk full on 10.0.3.4, reported by alice.ops@example.com")
    assert run.query == "disk full on 10.0.3.4, reported by [REDACTED:email#1]"
    assert found_in_requests(llm.requests, ["alice.ops@example.com"]) == []
    (event,) = TraceEvent.objects.filter(run_id=run.run_id, event_type=EventType.REDACTION_APPLIED)
    assert event.details["counts"] == {"email": 1}
    assert verify_hmac(KEY.encode(), "alice.ops@example.com", event.details["items"][0]["hmac"])
