"""Approvals that must release nothing (issue 43 item 3), on real components (the queue worker, the
real Alertmanager): a decision forged into the chain by a database writer — an "approval" by a user who
does not exist, the run set back to PENDING as a decision would — and an approval whose approver lost
the right before the resumed run executes the call. Neither silences anything."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group

from agent.runtime import approvals
from audit.models import EventType, ToolInvocation, ToolStatus
from audit.verify.authority import permitted
from audit.verify.runs import verify_run
from audit.write import CHAIN_NOT_AUTHENTIC
from diagnosis.models import APPROVE_PERMISSION, DiagnosisRun, RunStatus
from tests.agent.aiops.test_approvals import (
    AlertmanagerClient,
    client_for,
    decide,
    drain,
    interrupted_run,
    silence_call,
)
from tests.audit.insertion import forge_event

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("chat_settings", "runtime_pools", "aiops_settings"),
]


def _silences(settings) -> list:
    return AlertmanagerClient(settings.ALERTMANAGER_URL, timeout=5, max_bytes=1 << 22).silences()


def test_an_approval_forged_into_the_chain_releases_nothing(staff_user, aiops_settings):
    run = interrupted_run(staff_user, "forged-approval")
    call = silence_call(run)
    before = len(_silences(aiops_settings))
    forge_event(
        run.run_id,
        EventType.APPROVAL_DECIDED,
        {
            "toolCallId": call.tool_call_id,
            "toolName": call.tool_name,
            "decision": approvals.APPROVED,
            "decidedBy": "ghost",
            "arguments": call.input_params,
            "argumentsDigest": approvals.arguments_digest(call.input_params),
        },
        status=approvals.APPROVED,
        note=False,
    )
    DiagnosisRun.objects.filter(pk=run.pk).update(
        status=RunStatus.PENDING, lease_owner="", lease_expires_at=None
    )
    drain()
    run.refresh_from_db()
    call.refresh_from_db()
    assert (run.status, run.error_code) == (RunStatus.FAILED, CHAIN_NOT_AUTHENTIC)
    assert call.status == ToolStatus.AWAITING_APPROVAL and call.started_at is None  # never executed
    assert len(_silences(aiops_settings)) == before
    assert any("no write tag" in p for p in verify_run(run.run_id).invalid)


def test_an_approver_who_lost_the_right_before_the_call_runs_releases_nothing(
    staff_user, django_user_model, aiops_settings
):
    approver = django_user_model.objects.create_user("approver", password="pw", is_staff=True)
    group = Group.objects.get(name=approvals.APPROVERS_GROUP)
    approver.groups.add(group)
    run = interrupted_run(staff_user, "revoked")
    call = silence_call(run)
    before = len(_silences(aiops_settings))
    answer = decide(client_for(approver), run, call.tool_call_id, decision="approve")
    assert answer.status_code == 200, answer.json()
    approver.groups.remove(group)  # a governance event: the right is gone before the worker resumes
    assert not permitted(django_user_model.objects.get(pk=approver.pk), APPROVE_PERMISSION)
    drain()
    run.refresh_from_db()
    call = ToolInvocation.objects.get(pk=call.pk)
    assert run.status == RunStatus.SUCCESS
    assert (call.status, call.error_code) == (ToolStatus.FAILED, "APPROVAL_REVOKED")
    assert "approver (approver) no longer holds" in call.error_message and call.started_at is None
    assert len(_silences(aiops_settings)) == before
    verification = verify_run(run.run_id)
    assert verification.ok, verification.invalid
