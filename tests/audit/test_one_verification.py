"""One verification (issue 44 item 6): over runs the real runtime executed, tampered with as the tamper
matrix does, the trace's `auditComplete` is false exactly when `verify_audit` reports the run invalid
or incomplete (for a finished run: a run still open is never complete in the trace). Both map the one
`audit.verify.run_check.check_run`; what only `verify_audit` can afford — replaying the governance
chain for the authority of reviews and approvals, and liveness against the clock — is not among the
cases (docs/api.md, "The trace summary")."""

from __future__ import annotations

import datetime as dt

import pytest
from django.contrib.auth import get_user_model

from audit.models import (
    AgentStep,
    EventType,
    LogLeaf,
    RunReview,
    TailPending,
    ToolInvocation,
    TraceEvent,
)
from audit.read import get_trace
from audit.verify.runs import verify_run
from audit.write.feedback import record_feedback
from diagnosis.models import ChatSession, DiagnosisRun
from evaluations.models import EvaluationScore
from reasoning.models import AgentReasoningAudit
from tests.audit.insertion import forge_event
from tests.audit.test_tamper_matrix import _rewrite_content, world  # noqa: F401  (the module's world)

pytestmark = pytest.mark.django_db


def _session_of(w):
    return DiagnosisRun.objects.get(run_id=w.chat).session_id


def _first(model, w, **filters):
    return model.objects.filter(run_id=w.chat, **filters).order_by("id").first()


def _tail_note_deleted(w):
    other = get_user_model().objects.get(pk=w.other_user)
    record_feedback(run=DiagnosisRun.objects.get(run_id=w.chat), user=other, rating="up")
    TailPending.objects.filter(run_id=w.chat).delete()


TAMPERS = {
    "untouched": lambda w: None,
    "session owner": lambda w: ChatSession.objects.filter(session_id=_session_of(w)).update(
        owner_id=w.other_user
    ),
    "session created_at": lambda w: ChatSession.objects.filter(session_id=_session_of(w)).update(
        created_at=ChatSession.objects.get(session_id=_session_of(w)).created_at - dt.timedelta(days=1)
    ),
    "step column": lambda w: AgentStep.objects.filter(pk=_first(AgentStep, w).pk).update(finish_reason="x"),
    "step deleted": lambda w: AgentStep.objects.filter(pk=_first(AgentStep, w).pk).delete(),
    "tool column": lambda w: ToolInvocation.objects.filter(pk=_first(ToolInvocation, w).pk).update(
        output_preview="another result"
    ),
    "tool back to RUNNING": lambda w: ToolInvocation.objects.filter(pk=_first(ToolInvocation, w).pk).update(
        status="RUNNING"
    ),
    "tool under another session": lambda w: ToolInvocation.objects.filter(
        pk=_first(ToolInvocation, w).pk
    ).update(session_id=w.other_session),
    "reasoning row deleted": lambda w: AgentReasoningAudit.objects.filter(
        pk=_first(AgentReasoningAudit, w).pk
    ).delete(),
    "review flipped": lambda w: RunReview.objects.filter(review_id=w.review_id).update(verdict="correct"),
    "evaluation score changed": lambda w: EvaluationScore.objects.filter(score_id=w.score_id).update(
        value=0.123
    ),
    "event summary changed": lambda w: TraceEvent.objects.filter(
        run_id=w.chat, event_type=EventType.ROUTING_DECISION
    ).update(summary="rewritten"),
    "event deleted": lambda w: TraceEvent.objects.filter(
        run_id=w.chat, event_type=EventType.ROUTING_DECISION
    ).delete(),
    "forged event appended": lambda w: forge_event(w.chat, "REVIEW_RECORDED", {"verdict": "correct"}),
    "question changed": lambda w: DiagnosisRun.objects.filter(run_id=w.chat).update(query="Delete the logs"),
    "content changed": lambda w: DiagnosisRun.objects.filter(run_id=w.chat).update(content="Reboot."),
    "content rewritten and re-hashed": lambda w: _rewrite_content(w.chat, "Reboot the host."),
    "write failure counted": lambda w: DiagnosisRun.objects.filter(run_id=w.chat).update(
        audit_write_failures=1
    ),
    "failed run carries a release": lambda w: DiagnosisRun.objects.filter(run_id=w.failed).update(
        release_decision="PUBLISHED"
    ),
    "tail note deleted": _tail_note_deleted,
    "leaf data changed": lambda w: LogLeaf.objects.filter(run_id=w.chat).update(
        data=LogLeaf.objects.get(run_id=w.chat).data.replace('"lastSequenceNo":', '"lastSequenceNo":1')
    ),
}


@pytest.mark.parametrize("tamper", list(TAMPERS), ids=list(TAMPERS))
def test_the_trace_is_complete_exactly_when_verify_audit_passes_the_run(world, tamper):  # noqa: F811
    TAMPERS[tamper](world)
    verdicts = {}
    for run_id in (world.chat, world.failed, world.approval):
        run = DiagnosisRun.objects.get(run_id=run_id)
        summary = get_trace(run=run).summary
        result = verify_run(run_id)
        passes = not result.invalid and not result.incomplete
        verdicts[run_id] = (summary.audit_complete, run.is_terminal and passes)
        assert summary.audit_complete == (run.is_terminal and passes), (
            tamper,
            run_id,
            summary.gaps,
            result.invalid,
            result.incomplete,
        )
    if tamper == "untouched":
        assert verdicts[world.chat] == (True, True) and verdicts[world.failed] == (True, True)
    elif tamper != "failed run carries a release":
        assert verdicts[world.chat] == (False, False), tamper  # every other case tampers with the chat run
