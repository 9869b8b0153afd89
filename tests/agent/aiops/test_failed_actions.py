"""Reports do not hide failed actions (issue 45 item 3), on real components: an AI Ops analysis through
the real `openai` SDK (the local OpenAI-compatible server) proposes `create_silence` beside two reads;
a person approves it; the real Alertmanager then goes down, so the approved action FAILS when the
resumed run executes it. The released text ends with the service's failed-calls section (the model's
"Confidence: medium" lowered), the guard is told which calls failed and refuses a report that claims the
silence anyway, the run waits in the review queue as "action failed", and `verify_audit` recomputes the
section from the chain (a content that hides it is reported)."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.contrib.auth.models import Group
from django.core.management import call_command

from agent.aiops import intake
from agent.aiops.alertmanager import AlertmanagerClient
from agent.runtime import approvals, prompts
from agent.runtime.pipeline import BLOCKED_MESSAGE
from audit import failed_calls
from audit.models import EventType, ToolInvocation, ToolStatus, TraceEvent
from audit.verify.runs import verify_run
from bench.b7_aiops import AiOpsBenchProvider
from bench.provider import GUARD
from diagnosis.models import DiagnosisRun, ReleaseDecision, RunStatus
from diagnosis.review_queue import queued_runs, reasons_of
from surfaces.answers import render_answer
from tests.agent.aiops.servers import AlertmanagerServer
from tests.agent.aiops.support import drain
from tests.fakes.openai_server import FakeLLMServer, finish_chunk, text_chunks, tool_call_chunks

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("chat_settings", "runtime_pools", "aiops_settings"),
]
RUNBOOKS = Path(django_settings.BASE_DIR) / "runbooks"
SILENCE = {
    "matchers": [{"name": "alertname", "value": "FailedActionDrill"}],
    "duration_minutes": 10,
    "comment": "drill",
}


@pytest.fixture
def own_alertmanager(aiops_settings, tmp_path):
    """An Alertmanager of this test's own (the session's serves the others: stopping it would lose the
    alerts Prometheus sent it), configured for the analysis; the test stops it before the approved call."""
    with AlertmanagerServer(tmp_path / "alertmanager") as server:
        aiops_settings.ALERTMANAGER_URL = server.url
        yield server


class FailingSilenceProvider(AiOpsBenchProvider):
    """The bench's AI Ops provider whose executor proposes a silence beside its reads; its report
    `claims` the silence or not; its guard refuses an answer naming a silence when the guard input says
    an action failed (what the guard prompt asks of a real model). Keeps the guard inputs."""

    def __init__(self, *, claims: bool, **kwargs) -> None:
        super().__init__(**kwargs)
        self.claims = claims
        self.guard_inputs: list[dict] = []

    def __call__(self, request):
        if request.model == GUARD:
            data = json.loads(request.messages[-1]["content"])
            self.guard_inputs.append(data)
            claimed = any(c["action"] for c in data["failedCalls"]) and "silenced" in data["answer"]
            verdict = {
                "supported": not claimed,
                "unsupportedClaims": ["The alert was silenced for 10 minutes."] if claimed else [],
                "reason": "a failed action is claimed" if claimed else "all claims cited",
            }
            return self._stream(
                [*text_chunks(json.dumps(verdict), 2), finish_chunk("stop")], prompt=300, completion=40
            )
        if prompts.role_of(request.messages) == "executor":
            if not any(m.get("role") == "tool" for m in request.messages):
                calls = [
                    ("call_0", "query_metrics", json.dumps({"query": 'up{job="prometheus"}'})),
                    ("call_1", "lookup_knowledge", json.dumps({"query": "prometheus scrape slow"})),
                    ("call_2", "create_silence", json.dumps(SILENCE)),
                ]
                return self._stream(
                    [*tool_call_chunks(calls), finish_chunk("tool_calls")], prompt=900, completion=60
                )
            if self.claims:
                return self._claiming(request)
        return super().__call__(request)

    def _claiming(self, request):
        tool_text = " ".join(str(m.get("content") or "") for m in request.messages if m.get("role") == "tool")
        cite = re.findall(r"kb:[\w.-]+#\d+", tool_text)[0]
        text = (
            f"## Summary\nThe alert was silenced for 10 minutes while the scrape job recovers. [{cite}]\n"
            f"## Next steps\n- Check the scrape duration per target. [{cite}]\nConfidence: high"
        )
        return self._stream([*text_chunks(text, 3), finish_chunk("stop")], prompt=1800, completion=80)


def analyse_with_a_failing_silence(
    settings, own_alertmanager, staff_user, django_user_model, *, claims: bool
):
    call_command("load_knowledge", str(RUNBOOKS), stdout=io.StringIO())
    approver = django_user_model.objects.create_user("approver", is_staff=True)
    approver.groups.add(Group.objects.get(name=approvals.APPROVERS_GROUP))
    provider = FailingSilenceProvider(claims=claims, call_seconds=0.0, chunk_interval=0.0)
    silences = AlertmanagerClient(settings.ALERTMANAGER_URL, timeout=5, max_bytes=1 << 22)
    before = {s["id"] for s in silences.silences()}
    with FakeLLMServer(handler=provider) as fake:
        for key, value in provider.settings(fake.base_url).items():
            setattr(settings, key, value)
        run_id = intake.start_staff_analysis(
            user=staff_user, query="Alert FailedActionDrill: slow scrapes"
        ).run_id
        drain()
        run = DiagnosisRun.objects.get(run_id=run_id)
        assert run.status == RunStatus.INTERRUPTED, run.error_code
        waiting = ToolInvocation.objects.get(run_id=run_id, tool_name="create_silence")
        approvals.decide(
            run=run, tool_call_id=waiting.tool_call_id, decision=approvals.APPROVED, user=approver
        )
        # Between the approval and its execution the analysis's Alertmanager goes down (same address).
        own_alertmanager.stop()
        drain()
        own_alertmanager.start()  # up again, to show that nothing was silenced
        assert not fake.errors
    run.refresh_from_db()
    waiting.refresh_from_db()
    assert run.status == RunStatus.SUCCESS, run.error_code
    assert (waiting.status, waiting.error_code) == (ToolStatus.FAILED, "TOOL_ERROR")
    # Nothing was silenced.
    assert [s for s in silences.silences() if s["id"] not in before] == []
    return run, waiting, provider


def release_details(run) -> dict:
    return TraceEvent.objects.get(run_id=run.run_id, event_type=EventType.RELEASE_DECISION).details


def test_an_approved_action_that_fails_is_listed_in_the_released_report(
    settings, own_alertmanager, staff_user, django_user_model
):
    run, waiting, provider = analyse_with_a_failing_silence(
        settings, own_alertmanager, staff_user, django_user_model, claims=False
    )
    assert run.release_decision == ReleaseDecision.PUBLISHED
    body, section = failed_calls.split(run.content)
    assert section, run.content
    assert f"- `create_silence` (call `{waiting.tool_call_id}`): the action was not carried out" in section
    assert f"error {waiting.error_code}." in section
    # The model said "Confidence: medium"; what the reader gets last is the service's lowered line.
    assert failed_calls.stated_confidence(body) == "medium"
    assert failed_calls.stated_confidence(run.content) == "low"
    assert "the model stated medium" in section
    details = release_details(run)
    assert details["failedCalls"] == {"ids": [waiting.tool_call_id], "language": "en"}
    # The guard was told which call failed, and that it was an action.
    assert provider.guard_inputs[-1]["failedCalls"] == [
        {"tool": "create_silence", "errorCode": waiting.error_code, "action": True}
    ]
    # The review queue flags it.
    queued = list(queued_runs(reason_key="action_failed"))
    assert [r.run_id for r in queued] == [run.run_id]
    assert "action_failed" in [r.key for r in reasons_of(queued[0])]
    # The chat card and the run page render the section apart from the model's text.
    html = str(render_answer(run.content))
    assert '<aside class="failed-calls" role="note"' in html and "create_silence" in html
    verification = verify_run(run.run_id)
    assert verification.ok, verification.problems


def test_a_report_claiming_a_failed_action_is_blocked_and_still_says_it_failed(
    settings, own_alertmanager, staff_user, django_user_model
):
    run, waiting, _provider = analyse_with_a_failing_silence(
        settings, own_alertmanager, staff_user, django_user_model, claims=True
    )
    assert run.release_decision == ReleaseDecision.BLOCKED
    semantic = TraceEvent.objects.get(run_id=run.run_id, event_type=EventType.SEMANTIC_GUARD_DECISION)
    assert semantic.status == "FAIL", semantic.details
    assert run.content.startswith(BLOCKED_MESSAGE)
    _body, section = failed_calls.split(run.content)
    assert f"`create_silence` (call `{waiting.tool_call_id}`): the action was not carried out" in section
    assert "silenced for 10 minutes" not in run.content
    assert verify_run(run.run_id).ok


def test_the_verifier_reports_a_released_text_that_drops_the_section(
    settings, own_alertmanager, staff_user, django_user_model
):
    """The section is recomputed from the chain's failed calls: a released content without it, or a
    release that lists other calls than the chain's failed ones, is reported."""
    run, _waiting, _provider = analyse_with_a_failing_silence(
        settings, own_alertmanager, staff_user, django_user_model, claims=False
    )
    body, _section = failed_calls.split(run.content)
    events = list(TraceEvent.objects.filter(run_id=run.run_id).order_by("sequence_no"))
    problems = failed_calls.problems(content=body, release_details=release_details(run), events=events)
    assert problems == ["the released content's failed-calls section does not match the chain"]
    dropped = {"ids": [], "language": "en"}
    problems = failed_calls.problems(content=body, release_details={"failedCalls": dropped}, events=events)
    assert "the release's failed calls are not the chain's failed tool calls" in problems
